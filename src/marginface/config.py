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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from ._toml import dump_toml

__all__ = [
    "AMP_MODES",
    "BY_RECIPE",
    "FACE_DATASETS",
    "OPTIMIZERS",
    "PIPELINE_SCALE",
    "RECIPES",
    "RECIPE_KEYS",
    "RECIPE_NAMES",
    "SCHEDULES",
    "ConfigValueError",
    "TrainConfig",
    "config_from_dict",
    "dataset_recipe",
    "default_loss_options",
    "describe_recipe",
    "dump_toml",
    "load_config",
    "recipe_defaults",
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
:class:`~marginface.train.Trainer`) gives, under the sphere recipe (:data:`RECIPES`), every loss
whose constructor takes ``scale`` unless ``loss_options`` sets one. Deliberately not the
library's default (64, the papers' value for 512-D face embeddings, which the face recipe
keeps): the sphere recipe's embeddings are 3-D, where ``s = 30`` (the MNIST recipe's,
``examples/mnist_seed.toml``) trains well and 64 saturates the softmax. Losses without a
``scale`` argument (AdaCos, which chooses its own) get nothing."""


RECIPE_NAMES = ("auto", "face", "sphere")
"""Values of ``TrainConfig.recipe``: ``auto`` (the dataset chooses, :func:`dataset_recipe`),
``face`` or ``sphere``."""

RECIPES: dict[str, dict[str, Any]] = {
    "sphere": {
        "model": "seed-cnn",
        "embedding_dim": 3,
        "loss": "curricularface",
        "optimizer": "adam",
        "lr": 1e-3,
        "weight_decay": 0.0,
        "schedule": "constant",
        "image_size": None,
        "dataset_options": {},
    },
    "face": {
        "model": "r50",
        "embedding_dim": 512,
        "loss": "arcface",
        "optimizer": "sgd",
        "lr": 0.1,
        "weight_decay": 5e-4,
        "schedule": "polynomial",
        "image_size": 112,
        "dataset_options": {},
    },
}
"""The two recipes' values of the keys they choose (:data:`RECIPE_KEYS`).

* ``sphere``: the MNIST recipe (``examples/mnist_seed.toml``): the seeds' small CNN, a 3-D
  embedding that makes the sphere pictures, CurricularFace at ``s = 30``
  (:data:`PIPELINE_SCALE`), Adam at 1e-3, constant schedule, the dataset's own image size.
* ``face``: insightface's arcface_torch recipes: IResNet-50, 512-D, ArcFace ``m = 0.5`` at
  ``s = 64`` (the library's, the paper's), SGD (momentum 0.9) at lr 0.1 with weight decay 5e-4
  and the polynomial decay (power 1), 112×112 input. Per dataset (:data:`FACE_DATASETS`): the
  small photo sets (LFW, ORL, Extended Yale B) take IResNet-18, insightface records keep
  their own size (112 in insightface's sets), image folders are read in RGB.
"""

RECIPE_KEYS = tuple(RECIPES["face"])
"""The configuration keys a recipe chooses when they are not set explicitly."""

FACE_DATASETS: dict[str, dict[str, Any]] = {
    "insightface": {"image_size": None},
    "folder": {"dataset_options": {"rgb": True}},
    "lfw": {"model": "r18"},
    "orl": {"model": "r18"},
    "yaleb": {"model": "r18"},
}
"""The photo datasets, which ``recipe = "auto"`` trains with the face recipe, and their
departures from it. Every other dataset (``digits``, ``mnist``, ``fashion-mnist``,
``omniglot``: small grey pictures; a dataset registered by the user) takes the sphere recipe."""


class _ByRecipe:
    """The default of a :data:`RECIPE_KEYS` field: "the recipe's value" (filled in
    :meth:`TrainConfig.__post_init__`)."""

    def __repr__(self) -> str:
        return "<by recipe>"


BY_RECIPE: Any = _ByRecipe()
"""The dataclass default of the keys a recipe chooses; never left in a built configuration."""


def _dataset_key(dataset: str) -> str:
    return dataset.strip().lower().replace("_", "-")


def dataset_recipe(dataset: str) -> str:
    """The recipe ``recipe = "auto"`` takes for ``dataset``: ``"face"`` for the photo sets
    (``insightface``, ``folder``, ``lfw``, ``orl``, ``yaleb``), ``"sphere"`` for the others."""
    return "face" if _dataset_key(dataset) in FACE_DATASETS else "sphere"


def recipe_defaults(recipe: str, dataset: str) -> dict[str, Any]:
    """The values of :data:`RECIPE_KEYS` that ``recipe`` (``auto``, ``face`` or ``sphere``)
    gives a run on ``dataset`` (a new dict, tables copied).

    Raises:
        ValueError: ``recipe`` is not one of :data:`RECIPE_NAMES`.
    """
    if recipe not in RECIPE_NAMES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPE_NAMES)}, got {recipe!r}")
    if recipe == "auto":
        recipe = dataset_recipe(dataset)
    values = dict(RECIPES[recipe])
    if recipe == "face":
        values.update(FACE_DATASETS.get(_dataset_key(dataset), {}))
    return {k: dict(v) if isinstance(v, dict) else v for k, v in values.items()}


def default_loss_options(loss: str, recipe: str = "sphere") -> dict[str, Any]:
    """The pipeline's default keyword arguments of the registered loss ``loss`` under
    ``recipe``.

    Sphere recipe: ``{"scale": PIPELINE_SCALE}`` when the loss class's constructor takes
    ``scale`` (ArcFace, CosFace, SphereFace's normalized variant...), else ``{}`` (AdaCos).
    Face recipe: the loss's own default scale (64 for ArcFace, the papers' value for 512-D
    faces), written out so that the run's ``config.toml`` records it.

    Raises:
        ValueError: ``loss`` is not a registered name (the message lists the valid ones).
    """
    from .registry import get_loss_class

    parameters = inspect.signature(get_loss_class(loss)).parameters
    if "scale" not in parameters:
        return {}
    if recipe == "face":
        default = parameters["scale"].default
        return {"scale": float(default)} if isinstance(default, (int, float)) else {}
    return {"scale": PIPELINE_SCALE}


def resolve_loss_options(
    loss: str, options: dict[str, Any], recipe: str = "sphere"
) -> dict[str, Any]:
    """The options a run actually passes to its loss: :func:`default_loss_options`
    ``(loss, recipe)`` overridden key by key by ``options`` (a new dict; ``options`` is not
    modified)."""
    return {**default_loss_options(loss, recipe), **options}


@dataclass
class TrainConfig:
    """Everything a training run depends on. The keys of :data:`RECIPE_KEYS` (model,
    embedding_dim, loss, optimizer, lr, weight_decay, schedule, image_size, dataset_options)
    default to the values of the run's recipe (:data:`RECIPES`): ``recipe = "auto"`` takes the
    face recipe on the photo datasets (insightface, folder, lfw, orl, yaleb) and the sphere
    recipe (the MNIST recipe, ``examples/mnist_seed.toml``) on the others; a key given
    explicitly wins over the recipe. ``recipe`` is stored resolved (``face`` or ``sphere``).

    Recipe:
        recipe: ``auto`` (default: by dataset), ``face`` or ``sphere``.
    Data:
        dataset: a registered dataset name (``marginface.data.list_datasets()``). Default: digits.
        data_dir: where the dataset's files are (else ``MARGINFACE_DATA``, else the cache).
        image_size: resize images to this side in pixels (None: the dataset's own size).
            Default: by recipe: face 112 (insightface records: their own size), sphere None.
        limit: cap on the number of training images (quick runs), or None.
        exclude: positions in the training set (after ``limit``) left out of training, e.g.
            the likely label noise ``marginface outliers`` flags (Sub-center ArcFace's
            clean-up; ``train --drop-non-dominant RUN --drop-outliers``). Default: none.
        dataset_options: extra keyword arguments of the loader (``fold`` for LFW, ...).
            Default: by recipe: ``{rgb = true}`` for ``folder`` under the face recipe, else
            ``{}``. Set explicitly, the table replaces the recipe's.
    Model:
        model: a registered backbone (``marginface.models.list_models()``). Default: by
            recipe: face r50 (r18 on lfw, orl, yaleb), sphere seed-cnn.
        embedding_dim: ``D``; 2 or 3 to plot. Default: by recipe: face 512, sphere 3.
        model_options: extra keyword arguments of the backbone (``dropout``, ``widths``...).
    Loss:
        loss: a registered loss (``marginface.list_losses()``). Default: by recipe: face
            arcface, sphere curricularface.
        loss_options: its keyword arguments (``scale``, ``margin``...). Default: ``{}``, to
            which the pipeline adds the recipe's scale for every loss that takes one, unless
            set here (:meth:`resolved`): sphere ``scale = 30`` (:data:`PIPELINE_SCALE`), face
            the loss's own (64 for ArcFace). The saved ``config.toml`` holds the resolved
            options.
    Optimization:
        epochs, batch_size: Defaults 20, 128.
        optimizer: ``adam``, ``adamw`` or ``sgd``. Default: by recipe: face sgd, sphere adam.
        lr: peak learning rate. Default: by recipe: face 0.1, sphere 1e-3 (Keras Adam's).
        weight_decay: decoupled for adamw, L2 for adam/sgd. Default: by recipe: face 5e-4,
            sphere 0.
        momentum: SGD momentum (Nesterov off). Default: 0.9.
        schedule: ``constant``, ``cosine`` (to 0 at the end), ``step`` (× ``gamma`` every
            ``step_epochs``) or ``polynomial`` (insightface's: ``(1 - p) ** poly_power``, ``p``
            the progress after the warm-up; :mod:`marginface.train.schedule`), applied per
            step. Default: by recipe: face polynomial, sphere constant.
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
    recipe: str = "auto"
    data_dir: str | None = None
    image_size: int | None = BY_RECIPE
    limit: int | None = None
    exclude: list[int] = field(default_factory=list)
    dataset_options: dict[str, Any] = BY_RECIPE
    model: str = BY_RECIPE
    embedding_dim: int = BY_RECIPE
    model_options: dict[str, Any] = field(default_factory=dict)
    loss: str = BY_RECIPE
    loss_options: dict[str, Any] = field(default_factory=dict)
    epochs: int = 20
    batch_size: int = 128
    optimizer: str = BY_RECIPE
    lr: float = BY_RECIPE
    weight_decay: float = BY_RECIPE
    momentum: float = 0.9
    schedule: str = BY_RECIPE
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
        if not isinstance(self.dataset, str):
            raise TypeError(f"config key 'dataset' must be str, got {self.dataset!r}")
        if not isinstance(self.recipe, str) or self.recipe not in RECIPE_NAMES:
            raise ConfigValueError(
                "recipe", f"recipe must be one of {', '.join(RECIPE_NAMES)}, got {self.recipe!r}"
            )
        chosen = recipe_defaults(self.recipe, self.dataset)
        filled = tuple(key for key in RECIPE_KEYS if getattr(self, key) is BY_RECIPE)
        for key in filled:
            setattr(self, key, chosen[key])
        if self.recipe == "auto":
            self.recipe = dataset_recipe(self.dataset)
        self._recipe_filled = filled  # not a field: neither saved nor compared
        _check_types(self)
        _check_shown_options(self.loss_options, self.dataset_options)
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
        options = resolve_loss_options(self.loss, self.loss_options, self.recipe)
        return dataclasses.replace(self, loss_options=options)

    @property
    def recipe_filled(self) -> tuple[str, ...]:
        """The :data:`RECIPE_KEYS` this configuration took from its recipe (not given
        explicitly when it was built); empty for a copy (``dataclasses.replace``), whose
        values are all explicit."""
        return getattr(self, "_recipe_filled", ())


def _check_shown_options(loss_options: dict[str, Any], dataset_options: dict[str, Any]) -> None:
    """The table entries the recipe line formats, checked before it does (the loss and the
    loader check the rest when built): ``loss_options`` ``scale`` a finite number > 0 (or None,
    SphereFace's feature-norm scale), ``dataset_options`` ``rgb`` true or false."""
    from ._validation import check_real

    scale = loss_options.get("scale")
    if scale is not None:
        try:
            check_real("loss_options scale", scale, positive=True)
        except (TypeError, ValueError) as error:
            raise ConfigValueError("loss_options", str(error)) from None
    rgb = dataset_options.get("rgb")
    if rgb is not None and not isinstance(rgb, bool):
        raise ConfigValueError(
            "dataset_options", f"dataset_options rgb must be true or false, got {rgb!r}"
        )


def _recipe_summary(config: TrainConfig, in_channels: int | None = None) -> str:
    size = config.image_size
    if size is None:
        own = _dataset_key(config.dataset) == "insightface"
        size_text = "the records' own size" if own else "the dataset's own size"
    else:
        size_text = f"{size}x{size}"
    rgb = config.dataset_options.get("rgb")
    if in_channels is not None:  # what the loaded images are
        rgb = {3: True, 1: False}.get(in_channels, in_channels)
    channels = {True: " RGB", False: " grey", None: ""}.get(rgb, f" {rgb} channels")
    options = resolve_loss_options(config.loss, config.loss_options, config.recipe)
    loss = config.loss
    if "scale" in options:  # a number checked when the configuration was built, or None
        scale = options["scale"]
        loss += " scale=‖x‖" if scale is None else f" scale={scale:g}"
    schedule = {"polynomial": "poly"}.get(config.schedule, config.schedule)
    return (
        f"{config.model}, {config.embedding_dim}-D, {loss}, {config.optimizer} lr {config.lr:g}"
        f" {schedule}, {size_text}{channels}"
    )


def describe_recipe(
    config: TrainConfig,
    spell: Callable[[str], str] | None = None,
    *,
    in_channels: int | None = None,
) -> str | None:
    """One line naming the recipe ``config`` took and how to override it, e.g. ``recipe: face
    (dataset lfw): r18, 512-D, arcface scale=64, sgd lr 0.1 poly, 112x112 RGB; override with
    --model/--embedding-dim/... or --recipe sphere``; None when no key came from the recipe
    (every one was set explicitly, or the recipe only left the image size and the loader's
    options unset). ``spell(key)`` names a key's option (default:
    ``--key-name``; the command line passes its own spelling). ``in_channels``: the channels of
    the images the run trains on (1: "grey", 3: "RGB"), once loaded; None: the colour is said
    only when ``dataset_options`` sets ``rgb``.

    Raises:
        ValueError: ``config.loss`` is not a registered loss.
    """
    # the keys the recipe chose, but not its no-op values (no resize, no loader options)
    shown = [key for key in config.recipe_filled if getattr(config, key) not in (None, {})]
    if not shown:
        return None
    other = "sphere" if config.recipe == "face" else "face"
    spell = spell or (lambda key: "--" + key.replace("_", "-"))
    flags = "/".join(spell(key) for key in shown)
    return (
        f"recipe: {config.recipe} (dataset {config.dataset}): "
        f"{_recipe_summary(config, in_channels)}; "
        f"override with {flags} or --recipe {other}"
    )


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


def save_config(config: TrainConfig, path: str | Path) -> Path:
    """Write the resolved configuration as TOML, atomically. Returns the path."""
    from ._atomic import atomic_write_text

    return atomic_write_text(path, dump_toml(config.to_dict()))
