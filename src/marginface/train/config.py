"""Typed training configuration: defaults ← TOML file ← command-line overrides.

Unknown keys are errors that name the valid ones (nanoGPT's habit); the resolved configuration
is written next to the run as ``config.toml`` (timm's habit) so that ``evaluate``, ``plot``,
``export`` and ``--resume`` rebuild exactly the same model.
"""

from __future__ import annotations

import dataclasses
import inspect
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

from .._toml import dump_toml

__all__ = [
    "AMP_MODES",
    "BY_RECIPE",
    "CENTER_INITS",
    "FACE_DATASETS",
    "FINETUNE_KEYS",
    "OPTIMIZERS",
    "PIPELINE_SCALE",
    "PLAIN_DEFAULTS",
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


RECIPE_NAMES = ("auto", "face", "sphere", "finetune")
"""Values of ``TrainConfig.recipe``: ``auto`` (``finetune`` when ``init_from`` names a
described model, else the dataset chooses, :func:`dataset_recipe`) or a recipe's name."""

CENTER_INITS = ("random", "class-mean")  # TrainConfig.center_init, as train.finetune_recipe's

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
    "finetune": {
        "model": None,
        "embedding_dim": None,
        "loss": "arcface",
        "optimizer": "sgd",
        "lr": 3e-5,
        "weight_decay": 0.0,
        "schedule": "cosine",
        "image_size": None,
        "dataset_options": {},
        "epochs": 10,
        "freeze_stages": None,
        "center_init": "class-mean",
    },
}
"""The recipes' values of the keys they choose (:data:`RECIPE_KEYS`; ``finetune`` also
:data:`FINETUNE_KEYS`).

* ``sphere``: the MNIST recipe (``examples/mnist_seed.toml``): the seeds' small CNN, a 3-D
  embedding that makes the sphere pictures, CurricularFace at ``s = 30``
  (:data:`PIPELINE_SCALE`), Adam at 1e-3, constant schedule, the dataset's own image size.
* ``face``: insightface's arcface_torch recipes: IResNet-50, 512-D, ArcFace ``m = 0.5`` at
  ``s = 64`` (the library's, the paper's), SGD (momentum 0.9) at lr 0.1 with weight decay 5e-4
  and the polynomial decay (power 1), 112×112 input. Per dataset (:data:`FACE_DATASETS`): the
  small photo sets (LFW, ORL, Extended Yale B) take IResNet-18, insightface records keep
  their own size (112 in insightface's sets), image folders are read in RGB.
* ``finetune``: a pretrained model (``init_from``) adapted to one's own identities on a CPU:
  its architecture, ``D``, input size and ``model_input`` (None here: read from its
  description), ArcFace at ``s = 30``, SGD at lr 3e-5 without weight decay, cosine, 10 epochs,
  centers from the class means, 3 stages frozen; the reasons are in
  :mod:`marginface.train.finetune_recipe`.
"""

RECIPE_KEYS = tuple(RECIPES["face"])
"""The configuration keys every recipe chooses when they are not set explicitly."""

FINETUNE_KEYS = ("epochs", "freeze_stages", "center_init")
"""Keys the finetune recipe chooses too; face and sphere take :data:`PLAIN_DEFAULTS`."""

_FINETUNE_FIXED = ("model", "embedding_dim", "image_size")  # fixed by the pretrained weights

PLAIN_DEFAULTS: dict[str, Any] = {"epochs": 20, "freeze_stages": 0, "center_init": "random"}
"""The values of :data:`FINETUNE_KEYS` under the face and sphere recipes."""


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
    """The values of :data:`RECIPE_KEYS` and :data:`FINETUNE_KEYS` that ``recipe`` (``auto``,
    ``face``, ``sphere`` or ``finetune``) gives a run on ``dataset`` (a new dict, tables
    copied). The finetune recipe's model keys are None here: the pretrained model's
    description fills them (:class:`TrainConfig`).

    Raises:
        ValueError: ``recipe`` is not one of :data:`RECIPE_NAMES`.
    """
    if recipe not in RECIPE_NAMES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPE_NAMES)}, got {recipe!r}")
    if recipe == "auto":
        recipe = dataset_recipe(dataset)
    values = {**PLAIN_DEFAULTS, **RECIPES[recipe]}
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
    from ..registry import get_loss_class

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
        recipe: ``auto`` (default: ``finetune`` when ``init_from`` names a pretrained model or
            a file carrying a marginface description, else by dataset), ``face``, ``sphere``
            or ``finetune``.
    Fine-tuning (docs/training.md, "Fine-tuning a pretrained model"):
        init_from: the backbone's starting weights: a pretrained model's name or a backbone
            file (without a description it needs ``model``). None (default): random weights.
        model_input: how pixels enter the model: ``mean``, ``std`` (a number or one per
            channel: ``(x / 255 - mean[c]) / std[c]``), ``colour`` (the images are converted)
            and ``face_crop`` (:mod:`marginface.train.model_input`). Default: ``{}``, the
            pipeline's; by the finetune recipe: the pretrained model's.
        freeze_stages: the first K stages get no gradient and keep their BatchNorm statistics
            (:mod:`marginface.train.finetune`). Default: by recipe: finetune 3 where the
            architecture defines stages, else 0.
        center_init: ``random`` or ``class-mean`` (the normalised mean of the class's
            normalised embeddings). Default: by recipe: finetune class-mean, else random.
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
        epochs, batch_size: Defaults 20 (by recipe: finetune 10), 128.
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
    init_from: str | None = None
    data_dir: str | None = None
    image_size: int | None = BY_RECIPE
    limit: int | None = None
    exclude: list[int] = field(default_factory=list)
    dataset_options: dict[str, Any] = BY_RECIPE
    model: str = BY_RECIPE
    embedding_dim: int = BY_RECIPE
    model_options: dict[str, Any] = field(default_factory=dict)
    model_input: dict[str, Any] = field(default_factory=dict)
    freeze_stages: int = BY_RECIPE
    center_init: str = BY_RECIPE
    loss: str = BY_RECIPE
    loss_options: dict[str, Any] = field(default_factory=dict)
    epochs: int = BY_RECIPE
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
        from .config_values import KeyValueError, check_shown_options, check_values
        from .finetune_recipe import check_finetune_keys, finetune_description, model_values

        if self.init_from is not None and not isinstance(self.init_from, str):
            raise TypeError(f"config key 'init_from' must be str or None, got {self.init_from!r}")
        keys = (*RECIPE_KEYS, *FINETUNE_KEYS)
        filled = tuple(key for key in keys if getattr(self, key) is BY_RECIPE)
        chosen = recipe_defaults(self.recipe, self.dataset)
        try:
            if self.recipe == "finetune" or (self.recipe == "auto" and self.init_from):
                found = finetune_description(self.init_from, self.recipe)
                if found is not None:
                    self.recipe = "finetune"
                    chosen = recipe_defaults(self.recipe, self.dataset)
                    chosen.update(model_values(
                        found, source=str(self.init_from), model_input=self.model_input,
                        given={k: getattr(self, k) for k in keys if k not in filled},
                        model_options=self.model_options,
                        folder=_dataset_key(self.dataset) == "folder",
                    ))  # fmt: skip
                    self.model_input = chosen.pop("model_input")
                    self.model_options = chosen.pop("model_options")
            for key in filled:
                setattr(self, key, chosen[key])
            if self.recipe == "auto":
                self.recipe = dataset_recipe(self.dataset)
            # not a field: neither saved nor compared; the keys the recipe itself chose
            self._recipe_filled = tuple(key for key in filled if key in RECIPES[self.recipe])
            _check_types(self)
            check_shown_options(self.loss_options, self.dataset_options)
            self.model_input = check_finetune_keys(
                self.model, self.model_input, self.center_init, self.freeze_stages
            )
            check_values(self)
        except KeyValueError as error:
            raise ConfigValueError(error.key, str(error)) from None

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
    if config.recipe == "finetune":
        from .finetune_recipe import finetune_summary

        return finetune_summary(config, loss, schedule)
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
    if config.recipe == "finetune":  # the model's own keys are not overrides
        shown = [key for key in shown if key not in (*_FINETUNE_FIXED, "dataset_options")]
    if not shown:
        return None
    other = "sphere" if config.recipe == "face" else "face"
    spell = spell or (lambda key: "--" + key.replace("_", "-"))
    flags = "/".join(spell(key) for key in shown)
    origin = f"from {config.init_from}, " if config.recipe == "finetune" else ""
    return (
        f"recipe: {config.recipe} ({origin}dataset {config.dataset}): "
        f"{_recipe_summary(config, in_channels)}; override with {flags} or --recipe {other}"
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
    from .._atomic import atomic_write_text

    return atomic_write_text(path, dump_toml(config.to_dict()))
