"""Decode + augment throughput of :class:`marginface.data.insightface.InsightFaceDataset`:
Pillow against simplejpeg, through a ``DataLoader`` with 0, 1 and 2 workers.

The dataset is real faces: the first ``--images`` JPEGs of LFW deep-funneled (from
``../shared/data/lfw/lfw-deepfunneled.tar.gz``), centre-cropped to 150 px and stored at 112×112
(JPEG quality 95) in insightface's layout by :func:`marginface.data.convert.convert_folder`, as
faces_emore's images are. Each configuration iterates over the whole dataset ``--repeat`` times
with random flips (``flip=True``, batches of 128, shuffled, as a training epoch reads it) after
one untimed warm-up pass (workers started, ``train.rec`` in the page cache; the workers persist,
so worker start-up is not timed); the best and the median pass are reported. A decode-only
line (one thread, no torch) isolates the decoders.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_decode.py --images 2000 --repeat 3

Prints a Markdown table with the machine, the load average before and after, and the command.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from marginface.data.convert import convert_folder
from marginface.data.insightface import InsightFaceDataset, decode_rgb

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ARCHIVE = REPO / ".." / "shared" / "data" / "lfw" / "lfw-deepfunneled.tar.gz"


def machine_lines(
    load_before: tuple[float, ...], load_after: tuple[float, ...], command: str
) -> list[str]:
    """The lines a result ends with: machine, versions, load averages around the run, command."""
    return [
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, torch {torch.__version__}",
        "load average (1, 5, 15 min) before: "
        + ", ".join(f"{x:.2f}" for x in load_before)
        + "; after: "
        + ", ".join(f"{x:.2f}" for x in load_after),
        f"command: `{command}`",
    ]


def available_decoders() -> list[str]:
    decoders = ["pillow"]
    try:
        import simplejpeg  # noqa: F401

        decoders.append("simplejpeg")
    except ImportError:
        pass
    return decoders


def build_dataset(archive: Path, count: int, folder: Path) -> Path:
    """LFW's first ``count`` JPEGs as ``folder/src/<name>/<file>``, converted to
    ``folder/rec``."""
    source = folder / "src"
    taken = 0
    with tarfile.open(archive) as tar:
        for member in tar:
            if taken >= count:
                break
            if member.isfile() and member.name.endswith(".jpg"):
                name, file = member.name.split("/")[-2:]
                (source / name).mkdir(parents=True, exist_ok=True)
                (source / name / file).write_bytes(tar.extractfile(member).read())
                taken += 1
    convert_folder(source, folder / "rec", image_size=112, quality=95, crop=150)
    return folder / "rec"


def time_loader(dataset: InsightFaceDataset, workers: int, repeat: int) -> list[float]:
    """Images per second of each timed pass."""
    loader = DataLoader(
        dataset,
        batch_size=128,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(0),
    )
    rates = []
    for epoch in range(repeat + 1):
        dataset.set_epoch(epoch)
        start = time.perf_counter()
        seen = sum(int(images.shape[0]) for images, _ in loader)
        elapsed = time.perf_counter() - start
        if epoch:  # the first pass warms the workers and the page cache
            rates.append(seen / elapsed)
    return rates


def time_decode(dataset: InsightFaceDataset, decoder: str, repeat: int) -> list[float]:
    """Images per second of decoding alone (one thread, the encoded bytes in memory)."""
    blobs = [dataset.records.read(int(key))[24:] for key in dataset.keys]
    rates = []
    for _ in range(repeat + 1):
        start = time.perf_counter()
        for blob in blobs:
            decode_rgb(blob, decoder)
        rates.append(len(blobs) / (time.perf_counter() - start))
    return rates[1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archive", type=Path, default=DEFAULT_ARCHIVE)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", default="0,1,2", help="comma-separated worker counts")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        root = build_dataset(args.archive, args.images, Path(scratch))
        size = (root / "train.rec").stat().st_size
        for decoder in available_decoders():
            dataset = InsightFaceDataset(root, flip=True, seed=0, decoder=decoder)
            rates = time_decode(dataset, decoder, args.repeat)
            rows.append((decoder, "decode only", max(rates), statistics.median(rates)))
            for workers in (int(w) for w in args.workers.split(",")):
                rates = time_loader(dataset, workers, args.repeat)
                pipeline = f"DataLoader, {workers} workers"
                rows.append((decoder, pipeline, max(rates), statistics.median(rates)))
    load_after = os.getloadavg()
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv])
    lines = [
        f"{len(dataset)} LFW faces at 112×112 (train.rec {size / 1e6:.1f} MB), flip=True, "
        "batch 128, torch threads 1",
        "",
        "| decoder | pipeline | images/s (best) | images/s (median) |",
        "| --- | --- | ---: | ---: |",
    ]
    for decoder, pipeline, best, median in rows:
        lines.append(f"| {decoder} | {pipeline} | {best:,.0f} | {median:,.0f} |")
    lines += [
        "",
        *machine_lines(load_before, load_after, command),
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
