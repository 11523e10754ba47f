"""The command line's training options: flags, ``--set``, ``--config`` TOML, resumed configs."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


# Flags that map one-to-one onto TrainConfig keys: (flag, key, type, help).
_TRAIN_FLAGS: list[tuple[str, str, type, str]] = [
    ("--dataset", "dataset", str, "registered dataset (digits, mnist, lfw, insightface, ...)"),
    (
        "--recipe",
        "recipe",
        str,
        "auto (by dataset: face on insightface, folder, lfw, orl, yaleb; sphere on the "
        "others), face (512-D ArcFace s=64, iresnet, SGD lr 0.1 poly, 112x112) or sphere "
        "(3-D CurricularFace s=30, seed-cnn, Adam 1e-3): the defaults of the options marked "
        "'by dataset' (the face recipe also reads a folder dataset in RGB); finetune (chosen "
        "by --init-from NAME): the pretrained model's architecture and input, ArcFace s=30, SGD "
        "lr 3e-5 cosine, 10 epochs, early stages frozen, centers from class means",
    ),
    ("--data-dir", "data_dir", str, "folder holding the dataset's files"),
    ("--image-size", "image_size", int, "resize images to this side"),
    ("--limit", "limit", int, "use at most this many training images"),
    (
        "--model",
        "model",
        str,
        "backbone: seed-cnn, seed-cnn-bn, r18/r34/r50/r100/r200, mbf, mbf_large, vit_t/vit_s/vit_b",
    ),
    ("--embedding-dim", "embedding_dim", int, "embedding dimension (2 or 3 to plot)"),
    ("--epochs", "epochs", int, "training epochs"),
    (
        "--freeze-stages",
        "freeze_stages",
        int,
        "freeze the backbone's first K stages (stem first; dlib-resnet-v1: 6 stages, IResNet: "
        "5): no gradient, not in the optimizer, BatchNorm statistics kept",
    ),
    (
        "--center-init",
        "center_init",
        str,
        "class centers: random, or class-mean (the starting backbone's normalised class-mean "
        "embeddings)",
    ),
    ("--batch-size", "batch_size", int, "training batch size"),
    ("--optimizer", "optimizer", str, "adam, adamw or sgd"),
    ("--lr", "lr", float, "peak learning rate"),
    ("--weight-decay", "weight_decay", float, "weight decay"),
    ("--schedule", "schedule", str, "constant, cosine, step or polynomial (insightface's)"),
    ("--warmup-epochs", "warmup_epochs", float, "linear warm-up length in epochs"),
    ("--grad-clip", "grad_clip", float, "clip the gradient norm to this"),
    ("--grad-accumulation", "grad_accumulation", int, "micro-batches per batch (memory / k)"),
    ("--amp", "amp", str, "none, bf16 (CPU/CUDA) or fp16 (CUDA)"),
    ("--device", "device", str, "auto (CUDA when present), cpu, cuda, cuda:N"),
    ("--threads", "threads", int, "CPU threads for torch (none: torch's choice)"),
    ("--seed", "seed", int, "random seed"),
    ("--sample-rate", "sample_rate", float, "Partial FC: share of the classes per step (0, 1]"),
    ("--workers", "workers", int, "DataLoader workers for streamed datasets"),
    ("--dist-timeout", "dist_timeout", float, "seconds before a collective fails (torchrun)"),
    ("--verify-every", "verify_every", int, "also evaluate .bin sets every N steps"),
    (
        "--ijb-dir",
        "ijb_dir",
        str,
        "IJB-B/C folder (loose_crop/, meta/): TAR@FAR and 1:N columns in history.csv",
    ),
    ("--ijb-target", "ijb_target", str, "IJBC or IJBB"),
    ("--ijb-every", "ijb_every", int, "evaluate IJB every K epochs and at the last"),
]


def _parse_value(text: str) -> Any:
    """A TOML value (``30``, ``0.5``, ``true``, ``"x"``, ``[1, 2]``), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _key_values(items: Sequence[str] | None, flag: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE, got {item!r}")
        result[key.strip().replace("-", "_")] = _parse_value(value.strip())
    return result


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_shown(v)}" for k, v in value.items()) + "}"
    return str(value)


def config_default_text(key: str) -> str:
    """``--help``'s default of configuration key ``key``: ``default: X`` (the
    :class:`~marginface.train.config.TrainConfig` field's), or for a key the recipe chooses
    ``default: by dataset: face recipe X / sphere recipe Y`` (with the datasets whose face
    recipe departs from X)."""
    import dataclasses

    from ..train.config import (
        FACE_DATASETS,
        FINETUNE_KEYS,
        PLAIN_DEFAULTS,
        RECIPE_KEYS,
        RECIPES,
        TrainConfig,
    )

    if key in FINETUNE_KEYS:
        finetune = RECIPES["finetune"][key]
        if key == "freeze_stages":
            finetune = "3 where the architecture defines stages, else 0"
        return f"default: {_shown(PLAIN_DEFAULTS[key])} (finetune recipe: {_shown(finetune)})"
    if key in RECIPE_KEYS:
        face = _shown(RECIPES["face"][key])
        departures: dict[str, list[str]] = {}
        for dataset, values in FACE_DATASETS.items():
            if key in values:
                departures.setdefault(_shown(values[key]), []).append(dataset)
        if departures:
            face += " (" + "; ".join(f"{v} on {', '.join(d)}" for v, d in departures.items()) + ")"
        sphere = RECIPES["sphere"][key]
        sphere_text = "the dataset's own" if key == "image_size" and sphere is None else sphere
        return f"default: by dataset: face recipe {face} / sphere recipe {_shown(sphere_text)}"
    for item in dataclasses.fields(TrainConfig):
        if item.name == key:
            if item.default_factory is not dataclasses.MISSING:
                return f"default: {_shown(item.default_factory())}"
            return f"default: {_shown(item.default)}"
    raise ValueError(f"unknown configuration key {key!r}")


def _add_train_options(parser: argparse.ArgumentParser, *, with_loss: bool = True) -> None:
    group = parser.add_argument_group(
        "training configuration (explicit options, --set and --config win over the recipe)"
    )
    group.add_argument("--config", type=Path, help="TOML file with configuration keys")
    if with_loss:
        group.add_argument(
            "--loss",
            help="registered loss (normface, arcface, adacos, ...); " + config_default_text("loss"),
        )
    for flag, key, kind, text in _TRAIN_FLAGS:
        group.add_argument(flag, dest=key, type=kind, help=f"{text} ({config_default_text(key)})")
    group.add_argument(
        "--loss-option",
        action="append",
        metavar="KEY=VALUE",
        help="keyword argument of the loss, e.g. margin=0.5 scale=64 (repeatable). Default: by "
        "dataset: face recipe the loss's own scale (64 for ArcFace, the papers' value for 512-D "
        "faces) / sphere recipe scale=30 for every loss that takes a scale (64 saturates the "
        "softmax of 3-D embeddings); AdaCos chooses its own. The run's config.toml records "
        "the options used",
    )
    group.add_argument(
        "--resize-records",
        action="store_true",
        default=None,
        help="insightface records at another size than --image-size: resize them (and the "
        ".bin sets) on the fly to --image-size (dataset option resize = true; default: off, "
        "the records are used at their own size)",
    )
    group.add_argument(
        "--augment",
        action="append",
        metavar="KEY=VALUE",
        help="training augmentation: translate=PIXELS rotate=DEGREES scale=FRACTION "
        "hflip=PROBABILITY (repeatable; default: none)",
    )
    group.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="any configuration key (repeatable; default: none)",
    )
    group.add_argument(
        "--flip", action="store_true", default=None, help="flip-averaged eval (default: off)"
    )
    group.add_argument(
        "--tensorboard",
        action="store_true",
        default=None,
        help="also log to TensorBoard (default: off)",
    )
    group.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help="train through torch.compile (default: off)",
    )


def option_name(key: str) -> str:
    """The command-line spelling of configuration key ``key`` (``batch_size`` → ``--batch-size``,
    ``loss_options`` → ``--loss-option``, keys without a flag → ``--set key=...``)."""
    for flag, flag_key, _, _ in _TRAIN_FLAGS:
        if flag_key == key:
            return flag
    named = {"loss": "--loss", "flip": "--flip", "tensorboard": "--tensorboard"}
    named |= {"compile": "--compile"}
    named |= {"loss_options": "--loss-option", "augment": "--augment", "config": "--config"}
    return named.get(key, f"--set {key}=...")


def _explicit_values(args: argparse.Namespace) -> dict[str, Any]:
    """The configuration keys the command line (and ``--config``) set explicitly, merged in
    the documented order: ``--config`` file, flags, ``--set``; ``--loss-option`` and
    ``--augment`` add to the tables of the file (or of the defaults)."""
    from ..train.config import TrainConfig

    values: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        values.update(_read_toml_table(args.config))
    for _, key, _, _ in _TRAIN_FLAGS:
        if getattr(args, key, None) is not None:
            values[key] = getattr(args, key)
    if getattr(args, "init_from", None) is not None:  # train --init-from NAME|FILE
        values["init_from"] = str(args.init_from)
    for key in ("loss", "flip", "tensorboard", "compile"):
        if getattr(args, key, None) is not None:
            values[key] = getattr(args, key)
    values.update(_key_values(args.set, "--set"))
    loss_options = _key_values(args.loss_option, "--loss-option")
    if loss_options:
        base = values.get("loss_options", TrainConfig().loss_options)
        values["loss_options"] = {**base, **loss_options}
    augment = _key_values(getattr(args, "augment", None), "--augment")
    if augment:
        values["augment"] = {**values.get("augment", {}), **augment}
    if getattr(args, "resize_records", None):
        if str(values.get("dataset", "")).strip().lower() != "insightface":
            raise ValueError(
                "--resize-records resizes insightface records (--dataset insightface); the "
                f"other datasets, here {values.get('dataset', 'digits')!r}, are resized to "
                "--image-size already"
            )
        values["dataset_options"] = {**values.get("dataset_options", {}), "resize": True}
    return values


def _read_toml_table(path: Path) -> dict[str, Any]:
    from ..train.config import load_config

    load_config(path)  # the file's own errors (missing, not TOML, not UTF-8, bad keys)
    with Path(path).open("rb") as handle:
        return tomllib.load(handle)


def _named_option_errors(build):
    """Call ``build()``; a :class:`~marginface.train.config.ConfigValueError` is re-raised naming
    the command-line option instead of the configuration key."""
    from ..train.config import ConfigValueError

    try:
        return build()
    except ConfigValueError as error:
        message = str(error)
        if message.startswith(error.key):
            message = option_name(error.key) + message[len(error.key) :]
        raise ValueError(message) from None


def _config_from_args(args: argparse.Namespace):
    from ..train.config import config_from_dict

    values = _explicit_values(args)
    source = str(args.config) if getattr(args, "config", None) else "the command line"
    return _named_option_errors(lambda: config_from_dict(values, source=source))


def _resumed_config(args: argparse.Namespace, run_dir: Path):
    """``(configuration, saved run)`` of a ``--resume``: the run in ``run_dir``, read once
    (:func:`~marginface.train.state.run_state.read_saved_run`), with the options that may change on
    resume (:data:`~marginface.train.RESUMABLE_KEYS`) taken from the command line; any other
    option that contradicts the saved run is an error naming it."""
    from ..train.state.checkpoint import CheckpointError
    from ..train.state.layout import CHECKPOINT_NAME
    from ..train.state.run_state import has_saved_run, read_saved_run, resumed_config

    if not has_saved_run(run_dir):
        raise CheckpointError(f"cannot resume: no {CHECKPOINT_NAME} in {run_dir}")
    saved = read_saved_run(run_dir)
    explicit = _explicit_values(args)
    config = _named_option_errors(lambda: resumed_config(saved, explicit, spell=option_name))
    return config, saved


# ------------------------------------------------------------------ parser
class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` with every option's default: ``(default: X)`` is appended to the help of an
    option that has a default (not None) and does not state one already (flags: ``off``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or default is None
            or default is argparse.SUPPRESS
            or "default" in text.lower()
        ):
            return text
        return f"{text} (default: {_default_shown(default)})"


def _default_shown(default: Any) -> str:
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, float):
        return f"{default:g}"
    return str(default).replace("%", "%%")


def show_defaults(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` and every subcommand's parser (recursively) print each option's default
    in ``--help`` (:class:`DefaultsHelpFormatter`); an option with a default and no help gets
    one. Returns ``parser``."""
    parser.formatter_class = DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                show_defaults(child)
        elif (
            action.option_strings
            and action.help is None
            and action.default not in (None, argparse.SUPPRESS)
        ):
            action.help = f"default: {_default_shown(action.default)}"
    return parser


# The library's defaults, restated so that building the parser imports no torch (`--help` is
# quick): tests/cli/test_quick_help.py checks them against _progress.py and
# train/state/preemption.py.
DEFAULT_PROGRESS_SECONDS = 30.0
PREEMPTED_EXIT_CODE = 143


def _seconds(text: str) -> float:
    value = float(text)
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def _add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--progress MODE`` and ``--progress-seconds S``: how the command shows the progress of
    its long steps (training, embedding, converting); ``--quiet`` means ``--progress none``."""
    from .._progress import PROGRESS_MODES

    parser.add_argument(
        "--progress",
        choices=PROGRESS_MODES,
        default="auto",
        help="auto: a bar when stderr is a terminal, else a log line every "
        "--progress-seconds; bar; lines; none (also with --quiet) (default: auto)",
    )
    parser.add_argument(
        "--progress-seconds",
        type=_seconds,
        default=DEFAULT_PROGRESS_SECONDS,
        metavar="S",
        help="when stderr is not a terminal (a log file, CI), a progress line (step, loss, "
        f"img/s, ETA; or images done of a long step) every S seconds and at every epoch's end "
        f"instead of a bar (default {DEFAULT_PROGRESS_SECONDS:g}; 0: every step)",
    )


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number of minutes > 0, got {text}")
    return value


def _exit_status(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 255:
        raise argparse.ArgumentTypeError(f"must be an exit status 0..255, got {text}")
    return value


def add_checkpoint_options(parser: argparse.ArgumentParser) -> None:
    """``train``'s step checkpoints, kept checkpoints and preemption (docs/training.md)."""
    group = parser.add_argument_group("checkpoints and preemption")
    group.add_argument(
        "--checkpoint-every",
        type=_at_least_one,
        metavar="N",
        help="also checkpoint inside an epoch every N steps, with the position in the epoch "
        "(a resume continues at the next batch); the end of every epoch checkpoints anyway "
        "(default: at epoch ends only)",
    )
    group.add_argument(
        "--checkpoint-every-minutes",
        type=_minutes,
        metavar="M",
        help="also checkpoint inside an epoch when M minutes passed since the last checkpoint "
        "(default: at epoch ends only)",
    )
    group.add_argument(
        "--keep",
        type=_at_least_one,
        default=1,
        metavar="K",
        help="keep the last K checkpoints (the older in RUN/checkpoints/; a resume falls back "
        "to them when the newest is damaged). Default 1",
    )
    group.add_argument(
        "--async-checkpoint",
        action="store_true",
        help="copy the state at each checkpoint and write it in a background thread while "
        "training goes on (the previous checkpoint stays valid until the new one is complete)",
    )
    group.add_argument(
        "--preempted-exit-code",
        type=_exit_status,
        default=PREEMPTED_EXIT_CODE,
        metavar="STATUS",
        help="on SIGTERM or SIGUSR1 the ranks finish their step, write a checkpoint and exit "
        f"with STATUS (default {PREEMPTED_EXIT_CODE} = 128 + SIGTERM, for a requeue rule)",
    )


def add_backbone_source_arguments(group: Any) -> None:
    """A pretrained backbone instead of a run folder (``evaluate``, ``ijb``): ``--backbone
    FILE`` or ``--onnx FILE``, ``--model``, ``--bgr``, ``--embedding-dim`` (the arguments of
    :func:`~marginface.models.pretrained.load_backbone`)."""
    source = group.add_mutually_exclusive_group()
    source.add_argument(
        "--backbone",
        type=Path,
        metavar="FILE",
        help="a backbone state_dict (.pth/.pt/.ckpt/.safetensors: insightface's backbone.pth, "
        "an AdaFace IR checkpoint, marginface's export), opened safely; for evaluate also a "
        "pretrained model's name (`marginface models`)",
    )
    source.add_argument(
        "--onnx", type=Path, metavar="FILE", help="an ONNX embedding model (w600k_r50.onnx...)"
    )
    group.add_argument(
        "--model",
        help="architecture of --backbone: r18 ... r200, mbf, vit_t (not needed for the files "
        "marginface writes: they carry their description)",
    )
    group.add_argument(
        "--bgr",
        action="store_true",
        help="the model expects BGR input (the images are RGB; reversed before the model)",
    )
    group.add_argument(
        "--embedding-dim",
        type=int,
        default=None,
        help="D (default: the file's description, else 512)",
    )
