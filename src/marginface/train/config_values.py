"""The range checks of a training configuration's values
(:class:`~marginface.train.config.TrainConfig`), one line per bad value naming its key.

Kept apart from :mod:`marginface.train.config` (which calls :func:`check_values` and turns a
:class:`KeyValueError` into its ``ConfigValueError``), so that this module needs nothing of it.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["KeyValueError", "check_shown_options", "check_values"]

OPTIMIZERS = ("adam", "adamw", "sgd")  # as marginface.train.config's
SCHEDULES = ("constant", "cosine", "step", "polynomial")
AMP_MODES = ("none", "bf16", "fp16")


class KeyValueError(ValueError):
    """A configuration value out of range; ``key`` is the configuration key at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def check_values(config: Any) -> None:
    """Check the values of ``config`` (a :class:`~marginface.train.config.TrainConfig` whose types
    are checked) are in range; ``exclude`` is sorted and deduplicated, ``augment`` checked
    (:func:`~marginface.data.augment.check_augment_options`), in place.

    Raises:
        KeyValueError: the first value out of range, naming its key.
    """
    bad = [v for v in config.exclude if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    if bad:
        raise KeyValueError(
            "exclude", f"exclude must list training-set positions (ints >= 0), got {bad[0]!r}"
        )
    config.exclude = sorted(set(config.exclude))
    if not 0 < config.sample_rate <= 1:
        raise KeyValueError(
            "sample_rate", f"sample_rate must be in (0, 1], got {config.sample_rate!r}"
        )
    if config.workers < 0:
        raise KeyValueError("workers", f"workers must be >= 0, got {config.workers!r}")
    if not math.isfinite(config.dist_timeout) or config.dist_timeout <= 0:
        raise KeyValueError(
            "dist_timeout", f"dist_timeout must be > 0 seconds, got {config.dist_timeout!r}"
        )
    if config.verify_every is not None and config.verify_every < 1:
        raise KeyValueError(
            "verify_every", f"verify_every must be >= 1 or unset, got {config.verify_every!r}"
        )
    if not math.isfinite(config.poly_power) or config.poly_power <= 0:
        raise KeyValueError(
            "poly_power", f"poly_power must be a finite number > 0, got {config.poly_power!r}"
        )
    from ..data.ijb import IJB_TARGETS

    if config.ijb_target not in IJB_TARGETS:
        raise KeyValueError(
            "ijb_target",
            f"ijb_target must be one of {', '.join(IJB_TARGETS)}, got {config.ijb_target!r}",
        )
    names = ("epochs", "batch_size", "embedding_dim", "eval_batch_size", "step_epochs")
    for name in (*names, "grad_accumulation", "ijb_every"):
        if getattr(config, name) < 1:
            raise KeyValueError(name, f"{name} must be >= 1, got {getattr(config, name)!r}")
    if config.grad_accumulation > config.batch_size:
        raise KeyValueError(
            "grad_accumulation",
            f"grad_accumulation = {config.grad_accumulation} must be <= batch_size "
            f"({config.batch_size}): each micro-batch needs an image",
        )
    for name in ("image_size", "limit", "threads"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise KeyValueError(name, f"{name} must be >= 1 or unset, got {value!r}")
    for name, choices in (
        ("optimizer", OPTIMIZERS),
        ("schedule", SCHEDULES),
        ("amp", AMP_MODES),
    ):
        if getattr(config, name) not in choices:
            raise KeyValueError(
                name, f"{name} must be one of {', '.join(choices)}, got {getattr(config, name)!r}"
            )
    for name in ("lr", "weight_decay", "momentum", "warmup_epochs", "gamma"):
        value = getattr(config, name)
        if not math.isfinite(value) or value < 0:
            raise KeyValueError(name, f"{name} must be a finite number >= 0, got {value!r}")
    if config.lr <= 0:
        raise KeyValueError("lr", f"lr must be > 0, got {config.lr!r}")
    if config.grad_clip is not None and not config.grad_clip > 0:
        raise KeyValueError(
            "grad_clip", f"grad_clip must be > 0 or unset, got {config.grad_clip!r}"
        )
    from ..data.augment import check_augment_options

    config.augment = check_augment_options(config.augment)


def check_shown_options(loss_options: dict[str, Any], dataset_options: dict[str, Any]) -> None:
    """The table entries the recipe line formats, checked before it does (the loss and the
    loader check the rest when built): ``loss_options`` ``scale`` a finite number > 0 (or None,
    SphereFace's feature-norm scale), ``dataset_options`` ``rgb`` true or false.

    Raises:
        KeyValueError: naming ``loss_options`` or ``dataset_options`` and the value.
    """
    from .._validation import check_real

    scale = loss_options.get("scale")
    if scale is not None:
        try:
            check_real("loss_options scale", scale, positive=True)
        except (TypeError, ValueError) as error:
            raise KeyValueError("loss_options", str(error)) from None
    rgb = dataset_options.get("rgb")
    if rgb is not None and not isinstance(rgb, bool):
        raise KeyValueError(
            "dataset_options", f"dataset_options rgb must be true or false, got {rgb!r}"
        )
