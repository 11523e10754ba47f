"""Open-set verification accuracy of several margin losses, same backbone and budget.

Datasets:

* ``lfw``: LFW View 2, trained from scratch per test fold ``k`` on the identities that appear
  in no pair of fold ``k`` (``load_dataset("lfw", fold=k)``), evaluated on fold ``k``'s 600
  pairs. The LFW protocol picks each fold's threshold on the *other* folds' pairs; here the
  other folds' identities are the training identities, so their pairs would give an optimistic
  threshold. The threshold is therefore picked by 10-fold cross-validation *inside* the test
  fold (10 stratified sub-folds of 60 pairs: threshold best on 540 pairs, accuracy on the other
  60), which :func:`marginface.evaluation.verification_metrics` does when given no fold ids.
  Several ``--folds`` give one model per fold; the summary averages over them.
* ``omniglot``: train on ``images_background_small1``, evaluate on the characters of
  ``images_background_small2`` not in training (106 characters, 2,120 images) with the
  loader's 6,000 seeded balanced pairs in 10 folds (thresholds from the other 9 folds).

Metrics per loss: 10-fold verification accuracy (mean ± std over the folds), ROC AUC, EER,
TAR at FAR 1e-1 / 1e-2 / 1e-3 (empty where there are fewer than 1/FAR impostor pairs),
leave-one-out precision@1 and MAP@R over the test images, training seconds (wall clock of
``Trainer.fit``, which includes writing checkpoints; the first loss's first epoch also pays
PyTorch's warm-up, hence also the median seconds per epoch).

Every loss gets the same configuration (backbone, embedding size, scale, optimizer, schedule,
epochs, seed); only the loss name and its margin change. Runs are seeded (weights, shuffling,
dropout) and single-process, so they repeat exactly on the same machine and thread count.

Usage (from the repository root, ``PYTHONPATH=src``)::

    python benchmarks/bench_verification.py --dataset omniglot --epochs 30
    python benchmarks/bench_verification.py --dataset lfw --folds 0 --epochs 8 --image-size 32

Writes ``benchmarks/results/verification_<dataset>_<tag>.csv`` (one row per fold and loss) and
``.md`` (the table, the configuration and the command), and keeps the runs (checkpoints,
histories) under ``benchmarks/results/runs/``.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marginface.evaluation import pair_scores, retrieval_metrics, verification_metrics
from marginface.train import Trainer, TrainingDivergedError, extract_embeddings, load_bundle
from marginface.train.config import AMP_MODES, OPTIMIZERS, TrainConfig

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / ".." / "shared" / "data"
DEFAULT_OUT = REPO / "benchmarks" / "results"
DEFAULT_LOSSES = ("normface", "cosface", "arcface", "curricularface")
DEFAULT_MARGINS = {"cosface": 0.35, "arcface": 0.5, "curricularface": 0.5}
FAR_TARGETS = (1e-1, 1e-2, 1e-3)

COLUMNS = (
    "dataset",
    "fold",
    "loss",
    "scale",
    "margin",
    "status",
    "verification_accuracy",
    "verification_accuracy_std",
    "auc",
    "eer",
    *(f"tar@far={far:.0e}" for far in FAR_TARGETS),
    "precision_at_1",
    "map_at_r",
    "final_train_loss",
    "epochs",
    "train_seconds",
    "median_epoch_seconds",
    "train_images",
    "train_classes",
    "test_images",
    "pairs",
    "threshold_folds",
)


def _key_floats(
    parser: argparse.ArgumentParser, items: list[str], flag: str, form: str
) -> dict[str, float]:
    """``["a=1", "b=0.5"]`` -> ``{"a": 1.0, "b": 0.5}``; anything else is a usage error."""
    result: dict[str, float] = {}
    for item in items:
        key, _, value = item.partition("=")
        if not key or not value:
            parser.error(f"{flag} wants {form}, got {item!r}")
        result[key] = float(value)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", choices=("lfw", "omniglot"), required=True)
    parser.add_argument("--losses", nargs="+", default=list(DEFAULT_LOSSES))
    parser.add_argument(
        "--margin",
        action="append",
        default=[],
        metavar="LOSS=M",
        help="override a loss's margin (defaults: cosface 0.35, arcface 0.5, "
        "curricularface 0.5); repeatable",
    )
    parser.add_argument("--scale", type=float, default=30.0, help="s for every loss")
    parser.add_argument("--folds", type=int, nargs="+", default=[0], help="LFW test folds")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--warmup-epochs", type=float, default=1.0)
    parser.add_argument("--schedule", choices=("constant", "cosine", "step"), default="cosine")
    parser.add_argument("--model", default="seed-cnn-bn")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--embedding-dim", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=None, help="default: 32 LFW, 28 Omn.")
    parser.add_argument("--rgb", action="store_true", help="LFW in colour (default: grey)")
    parser.add_argument(
        "--lfw-crop",
        default="150",
        help="LFW: centred square crop in pixels before resizing (default 150 of the 250 "
        "deep-funneled pixels); 'none' for the whole image, e.g. --data-dir holding "
        "lfw/lfw-deepfunneled/ as 112x112 crops of `marginface align --detector mtcnn`",
    )
    parser.add_argument(
        "--min-images-per-identity",
        type=int,
        default=1,
        help="LFW: drop training identities with fewer images",
    )
    parser.add_argument("--limit", type=int, default=None, help="cap on training images")
    parser.add_argument("--flip", action="store_true", help="flip-averaged test embeddings")
    parser.add_argument(
        "--augment",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="training augmentation, e.g. hflip=0.5 translate=2 (TrainConfig.augment)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--device", default="cpu", help="cpu (default: the recorded CPU runs), cuda, auto"
    )
    parser.add_argument("--amp", default="none", choices=AMP_MODES, help="autocast on the device")
    parser.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--tag", default=None, help="suffix of the result files")
    args = parser.parse_args(argv)
    args.margins = {**DEFAULT_MARGINS, **_key_floats(parser, args.margin, "--margin", "LOSS=M")}
    args.augment = _key_floats(parser, args.augment, "--augment", "KEY=VALUE")
    if args.image_size is None:
        args.image_size = 32 if args.dataset == "lfw" else 28
    if args.tag is None:
        args.tag = f"{args.model}_{args.image_size}px_e{args.epochs}_s{args.scale:g}"
    return args


def make_config(args: argparse.Namespace, loss: str, fold: int | None) -> TrainConfig:
    """The shared configuration with ``loss`` (and its margin, if it has one)."""
    options: dict[str, Any] = {"download": False}
    if args.dataset == "lfw":
        options.update(
            fold=fold,
            rgb=args.rgb,
            min_images_per_identity=args.min_images_per_identity,
            crop=None if args.lfw_crop == "none" else int(args.lfw_crop),
        )
    loss_options: dict[str, Any] = {"scale": args.scale}
    if loss in args.margins and loss != "normface":
        loss_options["margin"] = args.margins[loss]
    return TrainConfig(
        dataset=args.dataset,
        data_dir=str(args.data_dir),
        image_size=args.image_size,
        limit=args.limit,
        dataset_options=options,
        model=args.model,
        model_options={"dropout": args.dropout},
        embedding_dim=args.embedding_dim,
        loss=loss,
        loss_options=loss_options,
        epochs=args.epochs,
        batch_size=args.batch_size,
        optimizer=args.optimizer,
        lr=args.lr,
        weight_decay=args.weight_decay,
        schedule=args.schedule,
        warmup_epochs=args.warmup_epochs,
        device=args.device,
        amp=args.amp,
        threads=args.threads,
        seed=args.seed,
        flip=args.flip,
        augment=args.augment,
    )


def evaluate(model: torch.nn.Module, bundle: Any, *, flip: bool) -> dict[str, Any]:
    """Verification on the bundle's pairs and leave-one-out retrieval on its test images.

    When every pair is in one fold (an LFW test fold), the threshold is chosen by 10 stratified
    sub-folds of those pairs (``verification_metrics(..., folds=None)``).
    """
    device = next(model.parameters()).device
    embeddings = extract_embeddings(
        model, bundle.test.images, batch_size=1024, flip=flip, device=device
    )
    pairs = bundle.pairs
    scores = pair_scores(embeddings, pairs.index)
    one_fold = np.unique(pairs.fold).shape[0] < 2
    folds = None if one_fold else pairs.fold
    verification = verification_metrics(scores, pairs.same, folds=folds, far_targets=FAR_TARGETS)
    row: dict[str, Any] = {
        "verification_accuracy": verification.accuracy,
        "verification_accuracy_std": verification.accuracy_std,
        "auc": verification.auc,
        "eer": verification.eer,
        "pairs": len(pairs),
        "threshold_folds": "10 sub-folds of the test fold" if one_fold else "the pairs' folds",
    }
    for far, tar in verification.tar_at_far.items():
        row[f"tar@far={far:.0e}"] = tar
    row.update(retrieval_metrics(embeddings, bundle.test.labels))
    row.pop("num_queries", None)
    return row


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of the rows (accuracy ± std in percent), plus a per-loss mean over folds
    when there are several folds."""
    header = (
        "| fold | loss | s | m | verif. acc. (%) | AUC | EER | TAR@FAR=1e-1 | TAR@FAR=1e-2 | "
        "TAR@FAR=1e-3 | P@1 | MAP@R | final train loss | train s | median s/epoch |"
    )
    lines = [header, "|" + "|".join(["---"] * (header.count("|") - 1)) + "|"]

    def line(row: dict[str, Any], fold: str) -> str:
        acc = row["verification_accuracy"]
        acc_text = (
            "–"
            if acc is None or not math.isfinite(acc)
            else f"{100 * acc:.2f} ± {100 * row['verification_accuracy_std']:.2f}"
        )
        cells = [
            fold,
            row["loss"] + ("" if row["status"] == "ok" else f" ({row['status']})"),
            _fmt(row["scale"], 0),
            _fmt(row["margin"], 2),
            acc_text,
            _fmt(row["auc"]),
            _fmt(row["eer"]),
            *(_fmt(row[f"tar@far={far:.0e}"]) for far in FAR_TARGETS),
            _fmt(row["precision_at_1"]),
            _fmt(row["map_at_r"]),
            _fmt(row["final_train_loss"], 3),
            _fmt(row["train_seconds"], 0),
            _fmt(row["median_epoch_seconds"], 1),
        ]
        return "| " + " | ".join(cells) + " |"

    for row in rows:
        lines.append(line(row, str(row["fold"])))
    folds = sorted({row["fold"] for row in rows}, key=str)
    if len(folds) > 1:
        for loss in dict.fromkeys(row["loss"] for row in rows):
            mine = [r for r in rows if r["loss"] == loss and r["status"] == "ok"]
            if len(mine) < 2:
                continue
            mean = {"loss": loss, "status": "ok", "scale": mine[0]["scale"]}
            mean["margin"] = mine[0]["margin"]
            for key in COLUMNS:
                values = [r[key] for r in mine]
                if key not in mean and all(isinstance(v, (int, float)) for v in values):
                    mean[key] = float(np.mean(values))
                mean.setdefault(key, None)
            accs = np.asarray([r["verification_accuracy"] for r in mine])
            mean["verification_accuracy_std"] = float(accs.std())
            lines.append(line(mean, f"mean of {len(mine)}"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = "PYTHONPATH=src python " + " ".join(
        shlex.quote(a) for a in ["benchmarks/bench_verification.py", *(argv or sys.argv[1:])]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"verification_{args.dataset}_{args.tag}"
    folds: list[int | None] = list(args.folds) if args.dataset == "lfw" else [None]
    rows: list[dict[str, Any]] = []
    began_all = time.perf_counter()
    with open(f"{stem}.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for fold in folds:
            bundle = load_bundle(make_config(args, args.losses[0], fold))
            print(
                f"{args.dataset} fold={fold}: train {bundle.train.images.shape} "
                f"({bundle.train.num_classes} classes), test {bundle.test.images.shape}, "
                f"{len(bundle.pairs)} pairs",
                flush=True,
            )
            for loss in args.losses:
                config = make_config(args, loss, fold)
                run_dir = args.out / "runs" / f"{args.dataset}_{args.tag}" / f"fold{fold}" / loss
                trainer = Trainer(config, run_dir, bundle=bundle)
                row: dict[str, Any] = {key: None for key in COLUMNS}
                row.update(
                    dataset=args.dataset,
                    fold="all" if fold is None else fold,
                    loss=loss,
                    scale=args.scale,
                    margin=config.loss_options.get("margin", 0.0),
                    train_images=len(bundle.train),
                    train_classes=bundle.train.num_classes,
                    test_images=len(bundle.test),
                )
                began = time.perf_counter()
                try:
                    history = trainer.fit(overwrite=True)
                    row["status"] = "ok"
                except TrainingDivergedError as error:
                    history = trainer.history
                    row["status"] = "diverged"
                    print(f"  {loss}: {error}", flush=True)
                row["train_seconds"] = time.perf_counter() - began
                row["epochs"] = len(history)
                row["final_train_loss"] = history[-1]["loss"] if history else None
                if history:
                    row["median_epoch_seconds"] = float(np.median([h["seconds"] for h in history]))
                if row["status"] == "ok":
                    row.update(evaluate(trainer.model, bundle, flip=args.flip))
                writer.writerow(row)
                handle.flush()
                rows.append(row)
                print(
                    f"  {loss}: acc {_fmt(row['verification_accuracy'])} "
                    f"auc {_fmt(row['auc'])} eer {_fmt(row['eer'])} "
                    f"p@1 {_fmt(row['precision_at_1'])} map@r {_fmt(row['map_at_r'])} "
                    f"loss {_fmt(row['final_train_loss'], 3)} ({row['train_seconds']:.0f} s)",
                    flush=True,
                )
    total = time.perf_counter() - began_all
    machine = (
        f"{platform.platform()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} logical CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    text = "\n".join(
        [
            f"## {args.dataset}: {', '.join(args.losses)}",
            "",
            f"Command: `{command}`",
            "",
            f"Machine: {machine}. Total wall time: {total:.0f} s.",
            "",
            f"Configuration: {make_config(args, '<loss>', folds[0]).to_dict()}",
            "",
            markdown_table(rows),
            "",
        ]
    )
    Path(f"{stem}.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {stem}.csv and {stem}.md")


if __name__ == "__main__":
    main()
