"""Typed training configuration: defaults ← TOML file ← command-line overrides.

Unknown keys are errors that name the valid ones (nanoGPT's habit); the resolved configuration
is written next to the run as ``config.toml`` (timm's habit) so that ``evaluate``, ``plot``,
``export`` and ``--resume`` rebuild exactly the same model.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = [
    "AMP_MODES",
    "OPTIMIZERS",
    "PIPELINE_SCALE",
    "SCHEDULES",
    "ConfigValueError",
    "TrainConfig",
    "config_from_dict",
    "default_loss_options",
    "dump_toml",
    "load_config",
    "resolve_loss_options",
    "save_config",
]


class ConfigValueError(ValueError):
    """A configuration value out of range; ``key`` is the configuration key at fault (the CLI
    names the option instead)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("constant", "cosine", "step", "polynomial")
AMP_MODES = ("none", "bf16", "fp16")

PIPELINE_SCALE = 30.0
"""The scale ``s`` the training pipeline (``marginface train``, ``compare``, ``demo``, the
:class:`~marginface.train.Trainer`) gives every loss whose constructor takes ``scale`` unless
``loss_options`` sets one. Deliberately not the library's default (64, the papers' value for
512-D face embeddings): the pipeline's default embeddings are 3-D, where ``s = 30`` (the MNIST
recipe's, ``examples/mnist_seed.toml``) trains well and 64 saturates the softmax. Losses without
a ``scale`` argument (AdaCos, which chooses its own) get nothing."""


def default_loss_options(loss: str) -> dict[str, Any]:
    """The pipeline's default keyword arguments of the registered loss ``loss``.

    ``{"scale": PIPELINE_SCALE}`` when the loss class's constructor takes ``scale``
    (ArcFace, CosFace, SphereFace's normalized variant...), else ``{}`` (AdaCos).

    Raises:
        ValueError: ``loss`` is not a registered name (the message lists the valid ones).
    """
    from .registry import get_loss_class

    parameters = inspect.signature(get_loss_class(loss)).parameters
    return {"scale": PIPELINE_SCALE} if "scale" in parameters else {}


def resolve_loss_options(loss: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options a run actually passes to its loss: :func:`default_loss_options` ``(loss)``
    overridden key by key by ``options`` (a new dict; ``options`` is not modified)."""
    return {**default_loss_options(loss), **options}


@dataclass
class TrainConfig:
    """Everything a training run depends on. Defaults: the MNIST recipe
    (``examples/mnist_seed.toml``) scaled to digits.

    Data:
        dataset: a registered dataset name (``marginface.data.list_datasets()``). Default: digits.
        data_dir: where the dataset's files are (else ``MARGINFACE_DATA``, else the cache).
        image_size: resize images to this side in pixels (None: the dataset's own size).
        limit: cap on the number of training images (quick runs), or None.
        exclude: positions in the training set (after ``limit``) left out of training, e.g.
            the likely label noise ``marginface outliers`` flags (Sub-center ArcFace's
            clean-up; ``train --drop-non-dominant RUN --drop-outliers``). Default: none.
        dataset_options: extra keyword arguments of the loader (``fold`` for LFW, ...).
    Model:
        model: a registered backbone (``marginface.models.list_models()``). Default: seed-cnn.
        embedding_dim: ``D``; 2 or 3 to plot. Default: 3.
        model_options: extra keyword arguments of the backbone (``dropout``, ``widths``...).
    Loss:
        loss: a registered loss (``marginface.list_losses()``). Default: curricularface.
        loss_options: its keyword arguments (``scale``, ``margin``...). Default: ``{}``, to
            which the pipeline adds ``scale = 30`` (:data:`PIPELINE_SCALE`) for every loss that
            takes a scale, unless set here (:meth:`resolved`). Not the library's 64: see
            :data:`PIPELINE_SCALE`. The saved ``config.toml`` holds the resolved options.
    Optimization:
        epochs, batch_size: Defaults 20, 128.
        optimizer: ``adam``, ``adamw`` or ``sgd``. Default: adam (the MNIST recipe's).
        lr: peak learning rate. Default: 1e-3 (Keras Adam's default).
        weight_decay: decoupled for adamw, L2 for adam/sgd. Default: 0.
        momentum: SGD momentum (Nesterov off). Default: 0.9.
        schedule: ``constant``, ``cosine`` (to 0 at the end), ``step`` (× ``gamma`` every
            ``step_epochs``) or ``polynomial`` (insightface's: ``(1 - p) ** poly_power``, ``p``
            the progress after the warm-up; :mod:`marginface.train.schedule`), applied per
            step. Default: constant (the MNIST recipe's).
        warmup_epochs: linear warm-up from 0, in epochs (may be fractional). Default: 0.
        step_epochs, gamma: the step schedule. Defaults: 10, 0.1.
        poly_power: the polynomial schedule's power. Default: 1.0 (insightface's).
        grad_accumulation: split each batch into this many micro-batches, run forward and
            backward one micro-batch at a time and sum their gradients (each micro-batch's loss
            weighted by its share of the batch) before the one optimizer step: the same step as
            the whole batch with about 1/k of the activation memory (BatchNorm statistics and
            losses with batch state, such as CurricularFace's ``t``, see micro-batches).
            Default: 1. Single-process runs only.
        grad_clip: clip the global gradient L2 norm to this, or None (default).
        augment: random training-time augmentation, a table with any of ``translate``
            (pixels), ``rotate`` (degrees), ``scale`` (relative zoom) and ``hflip``
            (probability); see :class:`marginface.data.augment.BatchAugmentation`.
            Default: none (the MNIST recipe trains without augmentation).
    Execution:
        device: ``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda``, ``cuda:1``...
        amp: ``none``, ``bf16`` (CPU or CUDA autocast) or ``fp16`` (CUDA, with a grad scaler).
        channels_last: NHWC memory format for the backbone (faster convolutions on CPU).
        compile: train through ``torch.compile(backbone)`` (the checkpoint keeps the plain
            module's names; evaluation runs the plain module). Default: False.
        threads: ``torch.set_num_threads`` for the run, or None (torch's default).
        seed: seeds initialization, shuffling and dropout. Default: 0.
        eval_batch_size: batch size of embedding extraction. Default: 1024.
        flip: average each embedding with that of the horizontally flipped image at evaluation.
        tensorboard: also write TensorBoard scalars (needs the ``tensorboard`` package).
    Scale (docs/distributed.md):
        sample_rate: Partial FC's share of each rank's classes per training step, in (0, 1].
            Default: 1.0 (every class).
        workers: DataLoader worker processes for streamed datasets (insightface). Default: 0.
        dist_timeout: seconds after which a collective of a distributed run fails (a rank
            died or hangs). Default: 600.
        verify_every: also evaluate the verification sets every this many steps (None: at
            epoch ends only).
    IJB-B / IJB-C while training (docs/evaluation.md):
        ijb_dir: an IJB folder in insightface's layout (``loose_crop/``, ``meta/``): the epoch
            rows get its 1:1 TAR@FAR and 1:N rank-1 / TPIR columns, as ``marginface ijb``
            computes them (under torchrun every rank embeds its share of the images, rank 0
            evaluates). None (default): no IJB.
        ijb_target: ``IJBC`` (default) or ``IJBB``: which protocol files of ``ijb_dir``.
        ijb_every: evaluate IJB after every this many epochs and after the last one.
            Default: 1 (every epoch).
    """

    dataset: str = "digits"
    data_dir: str | None = None
    image_size: int | None = None
    limit: int | None = None
    exclude: list[int] = field(default_factory=list)
    dataset_options: dict[str, Any] = field(default_factory=dict)
    model: str = "seed-cnn"
    embedding_dim: int = 3
    model_options: dict[str, Any] = field(default_factory=dict)
    loss: str = "curricularface"
    loss_options: dict[str, Any] = field(default_factory=dict)
    epochs: int = 20
    batch_size: int = 128
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9
    schedule: str = "constant"
    warmup_epochs: float = 0.0
    step_epochs: int = 10
    gamma: float = 0.1
    poly_power: float = 1.0
    grad_accumulation: int = 1
    grad_clip: float | None = None
    augment: dict[str, Any] = field(default_factory=dict)
    device: str = "auto"
    amp: str = "none"
    channels_last: bool = True
    compile: bool = False
    threads: int | None = None
    seed: int = 0
    eval_batch_size: int = 1024
    flip: bool = False
    tensorboard: bool = False
    sample_rate: float = 1.0
    workers: int = 0
    dist_timeout: float = 600.0
    verify_every: int | None = None
    ijb_dir: str | None = None
    ijb_target: str = "IJBC"
    ijb_every: int = 1

    def __post_init__(self) -> None:
        _check_types(self)
        bad = [v for v in self.exclude if isinstance(v, bool) or not isinstance(v, int) or v < 0]
        if bad:
            raise ConfigValueError(
                "exclude", f"exclude must list training-set positions (ints >= 0), got {bad[0]!r}"
            )
        self.exclude = sorted(set(self.exclude))
        if not 0 < self.sample_rate <= 1:
            raise ConfigValueError(
                "sample_rate", f"sample_rate must be in (0, 1], got {self.sample_rate!r}"
            )
        if self.workers < 0:
            raise ConfigValueError("workers", f"workers must be >= 0, got {self.workers!r}")
        if not math.isfinite(self.dist_timeout) or self.dist_timeout <= 0:
            raise ConfigValueError(
                "dist_timeout", f"dist_timeout must be > 0 seconds, got {self.dist_timeout!r}"
            )
        if self.verify_every is not None and self.verify_every < 1:
            raise ConfigValueError(
                "verify_every", f"verify_every must be >= 1 or unset, got {self.verify_every!r}"
            )
        if not math.isfinite(self.poly_power) or self.poly_power <= 0:
            raise ConfigValueError(
                "poly_power", f"poly_power must be a finite number > 0, got {self.poly_power!r}"
            )
        from .data.ijb import IJB_TARGETS

        if self.ijb_target not in IJB_TARGETS:
            raise ConfigValueError(
                "ijb_target",
                f"ijb_target must be one of {', '.join(IJB_TARGETS)}, got {self.ijb_target!r}",
            )
        names = ("epochs", "batch_size", "embedding_dim", "eval_batch_size", "step_epochs")
        for name in (*names, "grad_accumulation", "ijb_every"):
            if getattr(self, name) < 1:
                raise ConfigValueError(name, f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.grad_accumulation > self.batch_size:
            raise ConfigValueError(
                "grad_accumulation",
                f"grad_accumulation = {self.grad_accumulation} must be <= batch_size "
                f"({self.batch_size}): each micro-batch needs an image",
            )
        for name in ("image_size", "limit", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigValueError(name, f"{name} must be >= 1 or unset, got {value!r}")
        for name, choices in (
            ("optimizer", OPTIMIZERS),
            ("schedule", SCHEDULES),
            ("amp", AMP_MODES),
        ):
            if getattr(self, name) not in choices:
                raise ConfigValueError(
                    name, f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}"
                )
        for name in ("lr", "weight_decay", "momentum", "warmup_epochs", "gamma"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigValueError(name, f"{name} must be a finite number >= 0, got {value!r}")
        if self.lr <= 0:
            raise ConfigValueError("lr", f"lr must be > 0, got {self.lr!r}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ConfigValueError(
                "grad_clip", f"grad_clip must be > 0 or unset, got {self.grad_clip!r}"
            )
        from .data.augment import check_augment_options

        self.augment = check_augment_options(self.augment)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (deep copy) of every field."""
        return dataclasses.asdict(self)

    def resolved(self) -> TrainConfig:
        """A copy whose ``loss_options`` are the ones the run uses:
        :func:`resolve_loss_options` ``(loss, loss_options)``. Idempotent.

        Raises:
            ValueError: ``loss`` is not a registered loss name.
        """
        options = resolve_loss_options(self.loss, self.loss_options)
        return dataclasses.replace(self, loss_options=options)


def _field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def _allowed_types(annotation: Any) -> tuple[type, ...]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return tuple(t for arg in typing.get_args(annotation) for t in _allowed_types(arg))
    if origin is not None:
        return (origin,)
    if annotation is type(None):
        return (type(None),)
    return (annotation,)


def _check_types(config: TrainConfig) -> None:
    hints = typing.get_type_hints(TrainConfig)
    for name in _field_names():
        value = getattr(config, name)
        allowed = _allowed_types(hints[name])
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
            setattr(config, name, value)
        ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
        if not ok:
            names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
            raise TypeError(f"config key {name!r} must be {names}, got {value!r}")


def config_from_dict(values: dict[str, Any], *, source: str = "config") -> TrainConfig:
    """Build a :class:`TrainConfig` from a dict; unknown keys raise ``ValueError`` naming the
    valid ones, badly typed values ``TypeError`` naming the key."""
    unknown = sorted(set(values) - set(_field_names()))
    if unknown:
        raise ValueError(
            f"unknown key(s) in {source}: {', '.join(unknown)}; valid keys: "
            f"{', '.join(_field_names())}"
        )
    return TrainConfig(**values)


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> TrainConfig:
    """Defaults, then the TOML file at ``path`` (if any), then ``overrides`` (None values are
    ignored: "not given on the command line")."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        try:
            with path.open("rb") as handle:
                values = tomllib.load(handle)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"config file {path} is not valid TOML: {error}") from error
        except UnicodeDecodeError as error:
            raise ValueError(
                f"config file {path} is not UTF-8 text (byte {error.start}); TOML files are UTF-8"
            ) from None
        config_from_dict(values, source=str(path))  # report bad keys against the file
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    return config_from_dict(values, source=str(path) if path else "config")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) to TOML")


def dump_toml(values: dict[str, Any]) -> str:
    """Serialize a flat dict with one level of sub-tables to TOML (None values are omitted)."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, table in tables:
        lines.append(f"\n[{key}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items() if v is not None]
    return "\n".join(lines) + "\n"


def save_config(config: TrainConfig, path: str | Path) -> Path:
    """Write the resolved configuration as TOML, atomically. Returns the path."""
    from ._atomic import atomic_write_text

    return atomic_write_text(path, dump_toml(config.to_dict()))
