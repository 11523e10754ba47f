"""Throughput of sub-center clean-up's embedding pass over a training set streamed from disk
(``train.rec``), against the same pass over the same images held in memory.

The dataset is real faces, as in ``bench_decode.py``: the first ``--images`` JPEGs of LFW
deep-funneled (``../shared/data/lfw/lfw-deepfunneled.tar.gz``), centre-cropped to 150 px and
stored at 112×112 (JPEG q95) in insightface's layout by
:func:`marginface.data.convert.convert_folder`; one class per LFW identity. The pass timed is
:func:`marginface.train.cleaning.training_embeddings`, what ``marginface outliers`` and
``train --drop-non-dominant`` run: for the streamed set, the records read in order by a
``DataLoader`` with 0, 1, 2 workers (decode, no flip, ``float32[3, 112, 112]``), batches of
``--batch-size`` (the run's ``eval_batch_size``), through the model; for the in-memory
baseline, the same decoded images as one array (decoded once, untimed). Two models:

* ``pool-linear``: 4×4 average pooling and a linear layer to 512 (almost no compute): the
  reading pipeline's own rate, what bounds the pass when the model runs on a fast GPU;
* ``seed-cnn-bn``: marginface's small CNN at 112×112, embedding 512 (a model's cost on CPU).

Each configuration runs ``--repeat`` timed passes after one untimed warm-up (``train.rec`` in
the page cache; workers are started inside every pass, as the command does); best and median
reported, with the ratio of the medians to the in-memory pass of the same model. The
dominance/outlier computation (:meth:`~marginface.head.MarginSoftmaxLoss.find_outliers`,
K = 3, D = 512) is timed on the streamed embeddings. The streamed and in-memory embeddings are
checked to be equal.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_streamed_cleanup.py --images 4000 --repeat 3

Prints a Markdown table with the machine, the load average before and after, and the command.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import DEFAULT_ARCHIVE, build_dataset, machine_lines
from marginface.data.base import DatasetBundle, ImageSet
from marginface.data.insightface import load_insightface
from marginface.models import create_model
from marginface.registry import create_loss
from marginface.train.cleaning import training_embeddings
from marginface.train.config import TrainConfig
from marginface.train.state.loaded_run import LoadedRun

DIM = 512


def pool_linear() -> nn.Module:
    """``(B, 3, H, W) → (B, 512)``: 4×4 average pooling and a linear layer."""
    return nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, DIM))


def timed(fn, repeat: int) -> tuple[list[float], object]:
    """Seconds of ``repeat`` calls after one untimed call, and the last result."""
    result = fn()
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - start)
    return seconds, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archive", type=Path, default=DEFAULT_ARCHIVE)
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", default="0,1,2", help="comma-separated worker counts")
    parser.add_argument("--models", default="pool-linear,seed-cnn-bn")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        root = build_dataset(args.archive, args.images, Path(scratch))
        size = (root / "train.rec").stat().st_size
        streamed = load_insightface(root, decoder="auto")
        train = streamed.train
        plain = train.unaugmented().dataset
        images = np.stack([plain[i][0].numpy() for i in range(len(plain))])  # (N, 3, 112, 112)
        in_memory = DatasetBundle("lfw", ImageSet(images, train.labels), streamed.test)
        count, classes = len(train), train.num_classes
        config = TrainConfig(eval_batch_size=args.batch_size)
        for name in args.models.split(","):
            if name == "pool-linear":
                model = pool_linear()
            else:
                model = create_model(name, embedding_dim=DIM, in_channels=3, image_size=112)
            loss = create_loss("subcenter-arcface", classes, DIM, sub_centers=3)
            run = LoadedRun(config, model.eval(), loss.eval(), {}, 0, Path(scratch), [])
            seconds, reference = timed(
                lambda run=run: training_embeddings(run, in_memory)[0], args.repeat
            )
            base = statistics.median(seconds)
            rows.append((name, "in memory (baseline)", count / min(seconds), count / base, 1.0))
            for workers in (int(w) for w in args.workers.split(",")):
                seconds, found = timed(
                    lambda run=run, w=workers: training_embeddings(run, streamed, workers=w)[0],
                    args.repeat,
                )
                if not torch.equal(found, reference):
                    raise SystemExit(f"{name}, {workers} workers: embeddings differ in memory")
                median = statistics.median(seconds)
                pipeline = f"streamed, {workers} worker{'s' if workers != 1 else ''}"
                rows.append((name, pipeline, count / min(seconds), count / median, median / base))
            labels = torch.as_tensor(train.labels)
            seconds, _ = timed(
                lambda loss=loss, x=found, y=labels: loss.find_outliers(x, y), args.repeat
            )
            outlier_ms = 1e3 * statistics.median(seconds)
    load_after = os.getloadavg()
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv])
    lines = [
        f"{count} LFW faces of {classes} identities at 112×112 (train.rec {size / 1e6:.1f} MB), "
        f"batch {args.batch_size}, torch threads {args.threads}, decoder {plain.decoder}",
        "",
        "| model | pass | images/s (best) | images/s (median) | time vs in memory (median) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, pipeline, best, median, ratio in rows:
        lines.append(f"| {name} | {pipeline} | {best:,.0f} | {median:,.0f} | {ratio:.2f}× |")
    lines += [
        "",
        f"find_outliers (K = 3, D = {DIM}, {count} samples, {classes} classes), median of "
        f"{args.repeat}: {outlier_ms:.1f} ms",
        *machine_lines(load_before, load_after, command),
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
