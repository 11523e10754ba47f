"""The ``marginface`` command: demo, train, evaluate, compare, plot, export, convert, align, ijb.

Every subcommand has ``--help``. Training options come from defaults, then ``--config
FILE.toml``, then the command line (``--set key=value`` reaches any configuration key).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["DEMO_LOSSES", "demo_config", "main"]

DEMO_LOSSES = ("normface", "cosface", "arcface", "curricularface")

# Flags that map one-to-one onto TrainConfig keys: (flag, key, type, help).
_TRAIN_FLAGS: list[tuple[str, str, type, str]] = [
    ("--dataset", "dataset", str, "registered dataset (digits, mnist, lfw, insightface, ...)"),
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
    ("--threads", "threads", int, "CPU threads for torch"),
    ("--seed", "seed", int, "random seed"),
    ("--sample-rate", "sample_rate", float, "Partial FC: share of the classes per step (0, 1]"),
    ("--workers", "workers", int, "DataLoader workers for streamed datasets"),
    ("--dist-timeout", "dist_timeout", float, "seconds before a collective fails (torchrun)"),
    ("--verify-every", "verify_every", int, "also evaluate .bin sets every N steps"),
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


def _add_train_options(parser: argparse.ArgumentParser, *, with_loss: bool = True) -> None:
    group = parser.add_argument_group("training configuration")
    group.add_argument("--config", type=Path, help="TOML file with configuration keys")
    if with_loss:
        group.add_argument(
            "--loss",
            help="registered loss (normface, arcface, adacos, ...; default curricularface)",
        )
    for flag, key, kind, text in _TRAIN_FLAGS:
        group.add_argument(flag, dest=key, type=kind, help=text)
    group.add_argument(
        "--loss-option",
        action="append",
        metavar="KEY=VALUE",
        help="keyword argument of the loss, e.g. margin=0.5 scale=64 (repeatable). Default: "
        "scale=30 for every loss that takes a scale (not the library's 64, the papers' value "
        "for 512-D faces: 30 suits the small embeddings trained here); AdaCos chooses its own. "
        "The run's config.toml records the options used",
    )
    group.add_argument(
        "--augment",
        action="append",
        metavar="KEY=VALUE",
        help="training augmentation: translate=PIXELS rotate=DEGREES scale=FRACTION "
        "hflip=PROBABILITY (repeatable)",
    )
    group.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="any configuration key (repeatable)"
    )
    group.add_argument("--flip", action="store_true", default=None, help="flip-averaged eval")
    group.add_argument(
        "--tensorboard", action="store_true", default=None, help="also log to TensorBoard"
    )
    group.add_argument(
        "--compile", action="store_true", default=None, help="train through torch.compile"
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
    from .config import TrainConfig

    values: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        values.update(_read_toml_table(args.config))
    for _, key, _, _ in _TRAIN_FLAGS:
        if getattr(args, key, None) is not None:
            values[key] = getattr(args, key)
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
    return values


def _read_toml_table(path: Path) -> dict[str, Any]:
    from .config import load_config

    load_config(path)  # the file's own errors (missing, not TOML, not UTF-8, bad keys)
    with Path(path).open("rb") as handle:
        return tomllib.load(handle)


def _named_option_errors(build):
    """Call ``build()``; a :class:`~marginface.config.ConfigValueError` is re-raised naming
    the command-line option instead of the configuration key."""
    from .config import ConfigValueError

    try:
        return build()
    except ConfigValueError as error:
        message = str(error)
        if message.startswith(error.key):
            message = option_name(error.key) + message[len(error.key) :]
        raise ValueError(message) from None


def _config_from_args(args: argparse.Namespace):
    from .config import config_from_dict

    values = _explicit_values(args)
    source = str(args.config) if getattr(args, "config", None) else "the command line"
    return _named_option_errors(lambda: config_from_dict(values, source=source))


def _resumed_config(args: argparse.Namespace, run_dir: Path):
    """``(configuration, saved run)`` of a ``--resume``: the run in ``run_dir``, read once
    (:func:`~marginface.train.run_state.read_saved_run`), with the options that may change on
    resume (:data:`~marginface.train.RESUMABLE_KEYS`) taken from the command line; any other
    option that contradicts the saved run is an error naming it."""
    from .train.checkpoint import CheckpointError
    from .train.run_state import CHECKPOINT_NAME, has_saved_run, read_saved_run, resumed_config

    if not has_saved_run(run_dir):
        raise CheckpointError(f"cannot resume: no {CHECKPOINT_NAME} in {run_dir}")
    saved = read_saved_run(run_dir)
    explicit = _explicit_values(args)
    config = _named_option_errors(lambda: resumed_config(saved, explicit, spell=option_name))
    return config, saved


class _StderrHandler(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is at the time of each record (so a
    redirected or captured stderr receives the lines)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class _Formatter(logging.Formatter):
    """INFO records as their bare message (progress lines, "downloading ..."); others with
    their level and logger: ``WARNING marginface.data.lfw: ...``."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno == logging.INFO:
            return record.getMessage()
        return f"{record.levelname} {record.name}: {super().format(record)}"


def setup_logging(*, quiet: bool = False, verbose: bool = False) -> None:
    """Send the ``marginface`` loggers to stderr: INFO and above by default (progress lines,
    downloads), WARNING and above with ``quiet``, DEBUG with ``verbose`` (``verbose`` wins).
    Other libraries' loggers are left alone. Calling it again replaces the previous set-up."""
    package = logging.getLogger("marginface")
    for handler in list(package.handlers):
        if isinstance(handler, _StderrHandler):
            package.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(_Formatter("%(message)s"))
    package.addHandler(handler)
    if verbose:
        package.setLevel(logging.DEBUG)
    else:
        package.setLevel(logging.WARNING if quiet else logging.INFO)


def _echo(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, flush=True)


def _epoch_printer(args: argparse.Namespace, label: str = ""):
    from .report import format_table

    def callback(row: dict[str, Any]) -> None:
        keys = [k for k in row if k not in ("lr",)]
        line = format_table([row], keys).splitlines()
        prefix = f"[{label}] " if label else ""
        if row["epoch"] == 1:
            _echo(args, prefix + line[0])
        _echo(args, prefix + line[2])

    return callback


def _verification_printer(args: argparse.Namespace):
    """Print each verification set as insightface does: ``[lfw][2000]Accuracy-Flip: a+-s``."""

    def callback(row: dict[str, Any]) -> None:
        for key, value in row.items():
            if key.endswith("_accuracy"):
                name = key[: -len("_accuracy")]
                std = row.get(f"{name}_accuracy_std", float("nan"))
                _echo(args, f"[{name}][{row['step']}]Accuracy-Flip: {value:.5f}+-{std:.5f}")

    return callback


# ------------------------------------------------------------------ commands
def cmd_train(args: argparse.Namespace) -> int:
    if args.init_from is not None and args.drop_non_dominant is not None:
        raise ValueError("--init-from and --drop-non-dominant both choose the starting weights")
    if args.drop_non_dominant is not None:
        return _train_with_dominant_centers(args)
    if args.drop_outliers is not None:
        raise ValueError("--drop-outliers goes with --drop-non-dominant RUN")
    if args.init_from is not None:
        return _train_from_backbone(args)
    if args.resume and args.out is not None:
        out = args.out
    else:
        config = _config_from_args(args)
        out = args.out or Path("runs") / f"{config.dataset}-{config.loss}"
    if args.resume:
        config, saved = _resumed_config(args, out)
        return _fit(args, config, out, resume=saved)
    return _fit(args, config, out)


def _fit(
    args: argparse.Namespace,
    config: Any,
    out: Path,
    *,
    resume: Any = False,
    initial_state: dict[str, Any] | None = None,
) -> int:
    """Train ``config`` into ``out`` with the command line's progress, printers and
    ``--overwrite``; say where the run is. ``resume``: the saved run to continue
    (:class:`~marginface.train.run_state.SavedRun`), or False."""
    from .train import Trainer

    trainer = Trainer(
        config,
        out,
        progress=not args.quiet,
        progress_seconds=args.progress_seconds,
        callbacks=[_epoch_printer(args)],
        initial_state=initial_state,
    )
    trainer.step_callbacks.append(_verification_printer(args))
    trainer.fit(resume=resume, overwrite=args.overwrite)
    if trainer.is_main:
        _echo(args, f"run written to {out} (config.toml, history.csv, checkpoint)")
    return 0


def _train_from_backbone(args: argparse.Namespace) -> int:
    """``train --init-from FILE``: a new run whose backbone starts from FILE's weights (a
    backbone state_dict: fine-tuning); the class centers, optimizer and schedule start
    afresh."""
    from .models.pretrained import load_backbone

    if args.resume:
        raise ValueError("--init-from starts a new run from FILE's weights; it cannot --resume")
    config = _config_from_args(args)
    out = args.out or Path("runs") / f"{config.dataset}-{config.loss}"
    backbone = load_backbone(
        args.init_from,
        model=config.model,
        embedding_dim=config.embedding_dim,
        image_size=config.image_size or 112,
        **config.model_options,
    )
    _echo(args, f"backbone {config.model} initialized from {args.init_from}")
    return _fit(args, config, out, initial_state={"model": backbone.state_dict()})


def _train_with_dominant_centers(args: argparse.Namespace) -> int:
    """``train --drop-non-dominant RUN``: a new run from RUN's checkpoint with one center per
    class (each class's dominant sub-center), the command line's options applied."""
    from .train.cleaning import continue_with_dominant_centers

    if args.resume:
        raise ValueError("--drop-non-dominant starts a new run from RUN; it cannot --resume")
    source = Path(args.drop_non_dominant)
    overrides = _explicit_values(args)
    device = overrides.get("device", "auto")
    config, state, dominant = _named_option_errors(
        lambda: continue_with_dominant_centers(
            source, overrides, device=device, drop_outliers=args.drop_outliers
        )
    )
    out = args.out or source.with_name(source.name + "-dominant")
    moved = sum(1 for k in dominant.tolist() if k != 0)
    _echo(
        args,
        f"kept the dominant sub-center of each of {dominant.numel()} classes ({moved} not "
        f"sub-center 0); training with one center per class into {out}"
        + (
            f", leaving out {len(config.exclude)} training samples (exclude)"
            if config.exclude
            else ""
        ),
    )
    return _fit(args, config, out, initial_state=state)


def cmd_outliers(args: argparse.Namespace) -> int:
    from .train.cleaning import run_outliers, write_outliers_csv

    if args.workers is not None and args.workers < 0:
        raise ValueError(f"--workers must be >= 0, got {args.workers}")
    outliers, labels, names = run_outliers(
        args.run_dir, threshold_degrees=args.threshold, device=args.device, workers=args.workers
    )
    out = args.out or Path(args.run_dir) / "outliers.csv"
    path = write_outliers_csv(out, outliers, labels, names)
    flagged, total = outliers.indices.numel(), labels.numel()
    print(
        f"{flagged} of {total} training samples ({100.0 * flagged / total:.2f}%) are farther "
        f"than {outliers.threshold_degrees:g} degrees from their class's dominant sub-center"
    )
    _echo(args, f"written to {path}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .report import format_table
    from .train import EVALUATION_NAME, evaluate_run, write_evaluation

    if args.backbone is not None or args.onnx is not None:
        return _evaluate_backbone(args)
    if args.run_dir is None:
        raise ValueError("evaluate needs RUN_DIR, or --backbone FILE/--onnx FILE with --data-dir")
    for flag in ("model", "data_dir", "pairs"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} goes with --backbone or --onnx")
    evaluation = evaluate_run(args.run_dir, device=args.device, flip=args.flip)
    path = write_evaluation(evaluation, Path(args.run_dir) / EVALUATION_NAME)
    rows = [{"metric": k, "value": v} for k, v in evaluation.metrics.items()]
    print(format_table(rows))
    _echo(args, f"written to {path}")
    if evaluation.erc is not None:  # a MagFace run: its magnitude as a quality score
        _echo(args, f"report: {_write_quality_report(Path(args.run_dir), evaluation)}")
    return 0


def _evaluate_backbone(args: argparse.Namespace) -> int:
    """``evaluate --backbone FILE --model NAME --data-dir DIR`` (or ``--onnx FILE``): a
    pretrained backbone on DIR's ``.bin`` verification sets, or on DIR's image folder and the
    pairs of ``--pairs FILE``; no run folder."""
    from .models.pretrained import load_backbone
    from .report import format_table
    from .train.backbone_evaluation import evaluate_backbone
    from .train.run import resolve_device

    if args.run_dir is not None:
        raise ValueError("--backbone/--onnx evaluate a file, not RUN_DIR: leave RUN_DIR out")
    if args.data_dir is None:
        raise ValueError("--backbone/--onnx need --data-dir DIR (.bin sets, or images + --pairs)")
    device = resolve_device(args.device)
    model = load_backbone(
        args.backbone,
        onnx=args.onnx,
        model=args.model,
        embedding_dim=args.embedding_dim,
        image_size=args.image_size,
        bgr=args.bgr,
        device=device,
    )
    metrics = evaluate_backbone(
        model,
        args.data_dir,
        pairs=args.pairs,
        image_size=args.image_size,
        device=device,
        batch_size=args.batch_size,
        flip=True,  # insightface's protocol
    )
    print(format_table([{"metric": k, "value": v} for k, v in metrics.items()]))
    if args.out is not None:
        import json

        from ._atomic import atomic_write_text

        clean = {k: (v if v == v else None) for k, v in metrics.items()}  # NaN → null
        path = atomic_write_text(args.out, json.dumps(clean, indent=2, sort_keys=True) + "\n")
        _echo(args, f"written to {path}")
    return 0


def _write_quality_report(run_dir: Path, evaluation) -> Path:
    """``RUN/erc.png`` (error versus reject, feature magnitude as quality) and
    ``RUN/evaluation.html`` (the metrics and that figure)."""
    from .plots import plot_error_versus_reject, save_figure
    from .report import write_evaluation_report

    caption = "Error versus reject: pairs of lowest quality (min ‖x‖ of the two) rejected"
    image = save_figure(
        plot_error_versus_reject({run_dir.name: evaluation.erc}), run_dir / "erc.png"
    )
    return write_evaluation_report(
        run_dir / "evaluation.html",
        title=f"marginface evaluation: {run_dir.name}",
        metrics=evaluation.metrics,
        images={caption: image},
    )


def _run_compare(
    args: argparse.Namespace, losses: Sequence[str], config, out: Path, *, title: str, demo: bool
) -> int:
    from .report import format_table
    from .train import TABLE_COLUMNS, compare_losses

    started = time.perf_counter()
    rows_seen: list[dict[str, Any]] = []

    def on_row(row: dict[str, Any]) -> None:
        rows_seen.append(row)
        _echo(
            args, f"{row['loss']}: accuracy {row['accuracy']:.4f}  ({row['train_seconds']:.1f} s)"
        )

    command = "marginface " + " ".join(sys.argv[1:]) if sys.argv[1:] else "marginface"
    result = compare_losses(
        losses,
        config,
        out,
        overwrite=args.overwrite,
        replace_own=demo,
        progress=not args.quiet,
        progress_seconds=args.progress_seconds,
        on_row=on_row,
        title=title,
        notes=[f"command: {command}", "configuration: " + repr(config)],
    )
    print(format_table(result.rows, TABLE_COLUMNS))
    _echo(args, f"report: {result.report}  ({time.perf_counter() - started:.1f} s in all)")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    config = _config_from_args(args)
    losses = [name.strip() for name in args.losses.split(",") if name.strip()]
    out = args.out or Path("runs") / f"compare-{config.dataset}"
    return _run_compare(
        args, losses, config, out, title=f"Loss comparison on {config.dataset}", demo=False
    )


def demo_config():
    """The demo's recipe on digits (3-D embedding): BatchNorm seed CNN, light dropout, Adam
    with a cosine schedule, the pipeline's per-loss defaults (scale 30 for each of the four
    losses, :data:`~marginface.config.PIPELINE_SCALE`); one thread (faster than two on 8×8
    images). Sized to train the four losses in a few minutes on 2 CPU cores (its time is in
    docs/benchmarks.md)."""
    from .config import TrainConfig

    return TrainConfig(
        dataset="digits",
        model="seed-cnn-bn",
        model_options={"dropout": 0.1},
        embedding_dim=3,
        epochs=30,
        batch_size=64,
        lr=3e-3,
        schedule="cosine",
        threads=1,
        device="cpu",
    )


def cmd_demo(args: argparse.Namespace) -> int:
    config = demo_config()
    if args.epochs is not None:
        config.epochs = args.epochs
    return _run_compare(
        args,
        DEMO_LOSSES,
        config,
        args.out,
        title="marginface demo: digits, 3-D embeddings",
        demo=True,
    )


def cmd_plot(args: argparse.Namespace) -> int:
    from .train import draw_run_pictures, evaluate_run, load_run, resolve_device

    run_dir = Path(args.run_dir)
    run = load_run(run_dir, device=resolve_device(args.device))  # read once, evaluated as is
    history = run.history  # the checkpoint's own: complete even if history.csv lags
    evaluation = evaluate_run(run)
    out = args.out or run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    pictured = {run.config.loss: (history, evaluation, run.head.cpu())}  # drawn on the CPU
    images = draw_run_pictures(pictured, out)
    for caption, path in images.items():
        _echo(args, f"{caption}: {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    import torch

    from .export import export_onnx, export_safetensors, export_torchscript
    from .train import load_run

    run = load_run(args.run_dir)
    meta = run.meta
    size = meta["image_size"]
    height, width = (size, size) if isinstance(size, int) else size
    example = torch.rand(args.batch, meta["in_channels"], height, width)
    out = args.out or Path(args.run_dir)
    # the folders this command will create (``--out new/deeper`` creates both)
    created = [folder for folder in (out, *out.parents) if not folder.exists()]
    model = run.model.float().to(memory_format=torch.contiguous_format)
    try:
        if args.format in ("torchscript", "both"):
            path = export_torchscript(model, example, out / "model.ts")
            _echo(args, f"TorchScript (verified): {path}")
        if args.format in ("onnx", "both"):
            path = export_onnx(model, example, out / "model.onnx")
            _echo(args, f"ONNX (verified): {path}")
        if args.format == "safetensors":
            path = export_safetensors(model, out / "backbone.safetensors")
            _echo(args, f"safetensors (the backbone's state_dict, verified): {path}")
    except BaseException:
        for folder in created:  # deepest first: a failed export leaves no empty folder behind
            if not folder.is_dir() or any(folder.iterdir()):
                break
            folder.rmdir()
        raise
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .convert import run_convert

    return run_convert(args, echo=lambda text: _echo(args, text))


def cmd_align(args: argparse.Namespace) -> int:
    from .evaluation_commands import run_align

    return run_align(args, echo=lambda text: _echo(args, text))


def cmd_ijb(args: argparse.Namespace) -> int:
    from .evaluation_commands import run_ijb

    return run_ijb(args, echo=lambda text: _echo(args, text))


# ------------------------------------------------------------------ parser
def _seconds(text: str) -> float:
    value = float(text)
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def _add_progress_option(parser: argparse.ArgumentParser) -> None:
    from .train.progress import DEFAULT_PROGRESS_SECONDS

    parser.add_argument(
        "--progress-seconds",
        type=_seconds,
        default=DEFAULT_PROGRESS_SECONDS,
        metavar="S",
        help="when stderr is not a terminal (a log file, CI), a progress line (step, loss, "
        f"img/s, ETA) every S seconds and at every epoch's end instead of a bar (default "
        f"{DEFAULT_PROGRESS_SECONDS:g}; 0: every step)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``marginface`` (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="marginface",
        description="Train, evaluate and show embeddings learned with margin-based softmax losses.",
    )
    parser.add_argument(
        "--quiet", "-q", action="store_true", help="no progress output or chatter (warnings only)"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    # the same two flags after the subcommand (``marginface train ... --quiet``); SUPPRESS keeps
    # a flag given before the subcommand from being reset by the subcommand's default
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quiet", "-q", action="store_true", default=argparse.SUPPRESS)
    common.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        parents=[common],
        name="demo",
        help="digits, four losses, 3-D sphere pictures and report (no arguments needed)",
        description="Train NormFace, CosFace, ArcFace and CurricularFace on scikit-learn's digits "
        "with a 3-D embedding; write runs/demo/report.html and print the metrics table.",
    )
    demo.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder")
    demo.add_argument("--epochs", type=int, help="override the demo's epochs (30)")
    demo.add_argument("--overwrite", action="store_true", help="replace a non-demo folder")
    _add_progress_option(demo)
    demo.set_defaults(func=cmd_demo)

    train = sub.add_parser(
        parents=[common], name="train", help="train one model", description="Train one model."
    )
    _add_train_options(train)
    train.add_argument("--out", type=Path, help="run folder (default runs/<dataset>-<loss>)")
    mode = train.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue the run in --out")
    mode.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    train.add_argument(
        "--drop-non-dominant",
        type=Path,
        metavar="RUN",
        help="start from RUN's checkpoint (a sub-center run) keeping only each class's dominant "
        "sub-center (K = 1; Sub-center ArcFace's clean-up) and train into --out (default "
        "RUN-dominant) with RUN's configuration and this command line's options; the optimizer "
        "and schedule start afresh",
    )
    train.add_argument(
        "--drop-outliers",
        type=float,
        nargs="?",
        const=75.0,
        default=None,
        metavar="DEGREES",
        help="with --drop-non-dominant: also leave out of training the samples farther than "
        "DEGREES (default 75, the paper's) from their class's dominant sub-center (config key "
        "'exclude'; `marginface outliers RUN` lists them)",
    )
    train.add_argument(
        "--init-from",
        type=Path,
        metavar="FILE",
        help="start the backbone from FILE's weights (a state_dict: insightface's "
        "backbone.pth, .safetensors, an AdaFace IR checkpoint), --model naming its "
        "architecture; the class centers, optimizer and schedule start afresh (fine-tuning)",
    )
    _add_progress_option(train)
    train.set_defaults(func=cmd_train)

    evaluate = sub.add_parser(
        parents=[common],
        name="evaluate",
        help="metrics of a trained run",
        description="Closed-set accuracy, 10-fold pair verification (accuracy, AUC, EER, "
        "TAR@FAR) and retrieval (P@1, MAP@R) of a run; writes evaluation.json. For a MagFace "
        "run also the error-versus-reject curve (feature magnitude as quality: accuracy as the "
        "lowest-quality pairs are rejected): erc.png and evaluation.html. On insightface's .bin "
        "sets: insightface's numbers (Accuracy-Flip on its squared-L2 0.01 grid, best threshold, "
        "XNorm, VAL@FAR=1e-3), marginface's finer midpoint search (*_accuracy_midpoint), AUC, EER "
        "and TAR@FAR (docs/evaluation.md).",
    )
    evaluate.add_argument("run_dir", type=Path, nargs="?", help="a run folder (or --backbone)")
    evaluate.add_argument("--device", default="auto")
    evaluate.add_argument("--flip", action="store_true", default=None, help="flip-averaged")
    pretrained = evaluate.add_argument_group(
        "a pretrained backbone, no run folder (docs/backbones.md)"
    )
    source = pretrained.add_mutually_exclusive_group()
    source.add_argument(
        "--backbone",
        type=Path,
        metavar="FILE",
        help="a backbone state_dict (.pth/.pt/.ckpt/.safetensors: insightface's backbone.pth, "
        "an AdaFace IR checkpoint, marginface's export), opened safely",
    )
    source.add_argument(
        "--onnx", type=Path, metavar="FILE", help="an ONNX embedding model (w600k_r50.onnx...)"
    )
    pretrained.add_argument("--model", help="architecture of --backbone: r18 ... r200, mbf, vit_t")
    pretrained.add_argument(
        "--data-dir",
        type=Path,
        help="DIR with insightface .bin sets (lfw.bin, cfp_fp.bin...), or an image folder "
        "DIR/<identity>/<image> with --pairs",
    )
    pretrained.add_argument(
        "--pairs", type=Path, metavar="FILE", help="LFW-format pairs over --data-dir's images"
    )
    pretrained.add_argument(
        "--bgr",
        action="store_true",
        help="the model expects BGR input (the images are RGB; reversed before the model)",
    )
    pretrained.add_argument("--embedding-dim", type=int, default=512, help="D (default 512)")
    pretrained.add_argument("--image-size", type=int, default=112, help="side (default 112)")
    pretrained.add_argument("--batch-size", type=int, default=256, help="embedding batch")
    pretrained.add_argument("--out", type=Path, help="also write the metrics as JSON here")
    evaluate.set_defaults(func=cmd_evaluate)

    outliers = sub.add_parser(
        parents=[common],
        name="outliers",
        help="training samples far from their class's dominant sub-center (CSV)",
        description="Sub-center ArcFace's noise detection: embed the run's training set, find "
        "each class's dominant sub-center (the one most samples are nearest to) and write the "
        "samples whose angle to it exceeds --threshold degrees as a CSV (index, label, "
        "class_name, angle_degrees, dominant_sub_center). A streamed training set (train.rec) "
        "is read in batches by --workers processes.",
    )
    outliers.add_argument("run_dir", type=Path)
    outliers.add_argument(
        "--threshold", type=float, default=75.0, help="angle in degrees (default 75, the paper's)"
    )
    outliers.add_argument("--out", type=Path, help="CSV file (default RUN_DIR/outliers.csv)")
    outliers.add_argument("--device", default="auto")
    outliers.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers reading a streamed training set (train.rec; default: the run's)",
    )
    outliers.set_defaults(func=cmd_outliers)

    compare = sub.add_parser(
        parents=[common],
        name="compare",
        help="train several losses with the same budget and report",
        description="Train each loss with the same configuration, evaluate, and write "
        "report.html with pictures and a metrics table.",
    )
    compare.add_argument(
        "--losses", default=",".join(DEMO_LOSSES), help="comma-separated loss names"
    )
    _add_train_options(compare, with_loss=False)
    compare.add_argument("--out", type=Path, help="output folder (default runs/compare-<data>)")
    compare.add_argument("--overwrite", action="store_true", help="replace --out")
    _add_progress_option(compare)
    compare.set_defaults(func=cmd_compare)

    plot = sub.add_parser(
        parents=[common],
        name="plot",
        help="pictures of a trained run",
        description="Embeddings (circle/sphere), margin curve, ROC, training and state curves.",
    )
    plot.add_argument("run_dir", type=Path)
    plot.add_argument("--out", type=Path, help="folder for the PNGs (default RUN_DIR/plots)")
    plot.add_argument("--device", default="auto")
    plot.set_defaults(func=cmd_plot)

    export = sub.add_parser(
        parents=[common],
        name="export",
        help="export the embedding model (TorchScript, ONNX), verified",
        description="Export the run's backbone; the exported model's outputs are checked "
        "against PyTorch's on a batch. ONNX needs the marginface[onnx] extra.",
    )
    export.add_argument("run_dir", type=Path)
    export.add_argument(
        "--format",
        choices=("torchscript", "onnx", "both", "safetensors"),
        default="torchscript",
        help="both: TorchScript and ONNX; safetensors: the backbone's weights under "
        "insightface's names (backbone.safetensors, for evaluate --backbone and "
        "train --init-from)",
    )
    export.add_argument("--out", type=Path, help="folder (default RUN_DIR)")
    export.add_argument("--batch", type=int, default=4, help="verification batch size")
    export.set_defaults(func=cmd_export)

    from .convert import add_convert_arguments

    convert = sub.add_parser(
        parents=[common],
        name="convert",
        help="an image folder to insightface's train.rec/.idx/property, or pairs to a .bin",
        description="SRC/<identity>/<image> -> OUT/train.rec, train.idx, property (insightface's "
        "layout, readable by MXNet); with --pairs FILE (LFW's pairs.txt format), the pairs "
        "of SRC's images -> the verification set OUT (a .bin).",
    )
    add_convert_arguments(convert)
    convert.set_defaults(func=cmd_convert)

    from .evaluation_commands import add_align_arguments

    align = sub.add_parser(
        parents=[common],
        name="align",
        help="five landmarks per image -> 112x112 ArcFace crops (no face detector)",
        description="SRC/NAME -> OUT/NAME: the similarity transform of each image's five "
        "landmarks (from your face detector) onto the ArcFace template, as insightface's "
        "face_align.norm_crop (needs OpenCV: pip install 'marginface[align]').",
    )
    add_align_arguments(align)
    align.set_defaults(func=cmd_align)

    from .evaluation_commands import add_ijb_arguments

    ijb = sub.add_parser(
        parents=[common],
        name="ijb",
        help="IJB-B/IJB-C 1:1 TAR@FAR and 1:N rank/TPIR of a run (insightface's protocol)",
        description="Align DATA_DIR/loose_crop on meta/*_name_5pts_score.txt, embed with the "
        "run's model (flip test), pool templates (detector-score weighted, mean per media, "
        "sum over media), score the 1:1 pairs and the 1:N gallery/probe lists as insightface's "
        "eval_ijbc.py and ijb_1n.py; features cached in OUT.",
    )
    add_ijb_arguments(ijb)
    ijb.set_defaults(func=cmd_ijb)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (errors: 2 with a one-line message)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(quiet=args.quiet, verbose=args.verbose)
    prefix = f"marginface {args.command}"
    try:
        return int(args.func(args))
    except KeyboardInterrupt as error:
        # TrainingInterrupted says what was kept; a bare Ctrl-C elsewhere wrote nothing partial
        print(f"{prefix}: {error or 'interrupted'}", file=sys.stderr)
        return 130
    except (ValueError, TypeError, ImportError) as error:
        print(f"{prefix}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # read-only folder, path under a file, full disk, missing file
        print(f"{prefix}: error: {describe_os_error(error)}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # TrainingDivergedError, export verification
        print(f"{prefix}: error: {error}", file=sys.stderr)
        return 1


def describe_os_error(error: OSError) -> str:
    """One line for a failed file operation: what went wrong and which path, with a hint for
    the common cases (read-only folder, a file where a folder should be)."""
    import errno

    from ._atomic import DiskFullError

    if isinstance(error, DiskFullError):
        return error.strerror or str(error)  # names the file (and, in training, what is kept)
    if error.filename is None or type(error).__str__ is not OSError.__str__:
        return str(error)  # our own errors (DataFilesMissingError...) say it all
    path = error.filename
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write {path}: {error.strerror} (choose a writable folder with --out)"
    if error.errno == errno.ENOTDIR:
        return f"cannot use {path}: a part of this path is a file, not a folder"
    if error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return f"disk full: could not write {path}"
    return f"{error.strerror or error}: {path}"
