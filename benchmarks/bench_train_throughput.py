"""Training throughput (global img/s) of `marginface train --dataset insightface` with 1 and 2
processes: real LFW faces converted to insightface's layout at 112x112, IResNet-18.

    PYTHONPATH=src python benchmarks/bench_train_throughput.py --images 384 --repeats 3

Builds the dataset once under --work (LFW identities from ../shared/data/lfw, each image a
JPEG in train.rec), then for each world size runs one epoch ``--repeats`` times (torchrun for
2 processes, gloo) and reports the median of the ``images_per_second`` column of history.csv
(the epoch's training images over its training seconds, evaluation excluded) and the ratio to
one process measured in the same run. Prints a markdown table and the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_dataset(work: Path, images: int) -> Path:
    """``work/data``: LFW identities with >= 2 images, ``images`` faces in all."""
    data = work / "data"
    if (data / "train.rec").is_file():
        return data
    source = work / "faces"
    shutil.rmtree(source, ignore_errors=True)
    archive = ROOT.parent / "shared" / "data" / "lfw" / "lfw-deepfunneled.tar.gz"
    by_name: dict[str, list[tarfile.TarInfo]] = {}
    with tarfile.open(archive) as tar:
        members = [m for m in tar if m.isfile() and m.name.endswith(".jpg")]
        for member in members:
            by_name.setdefault(member.name.split("/")[-2], []).append(member)
        written = 0
        for name in sorted(n for n, v in by_name.items() if len(v) >= 2):
            for member in by_name[name]:
                if written == images:
                    break
                (source / name).mkdir(parents=True, exist_ok=True)
                (source / name / Path(member.name).name).write_bytes(tar.extractfile(member).read())
                written += 1
    command = [sys.executable, "-m", "marginface", "--quiet", "convert", str(source), str(data)]
    subprocess.run([*command, "--image-size", "112", "--crop", "150"], check=True, env=_env())
    return data


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def run_epoch(data: Path, run: Path, world: int, batch: int, threads: int) -> float:
    """One epoch; returns its images_per_second."""
    shutil.rmtree(run, ignore_errors=True)
    options = [
        "train", "--dataset", "insightface", "--recipe", "sphere", "--data-dir", str(data),
        "--model", "iresnet18",
        "--embedding-dim", "512", "--loss", "arcface", "--batch-size", str(batch),
        "--epochs", "1", "--device", "cpu", "--threads", str(threads), "--out", str(run),
        "--quiet",
    ]  # fmt: skip
    if world == 1:
        command = [sys.executable, "-m", "marginface", *options]
    else:
        torchrun = Path(sys.executable).with_name("torchrun")
        command = [str(torchrun), f"--nproc_per_node={world}", "-m", "marginface", *options]
    subprocess.run(command, check=True, env=_env(), stdout=subprocess.DEVNULL)
    sys.path.insert(0, str(ROOT / "src"))
    from marginface.train import read_history

    return float(read_history(run / "history.csv")[-1]["images_per_second"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("runs/bench-throughput"))
    args = parser.parse_args()
    data = build_dataset(args.work, args.images)
    results: dict[int, list[float]] = {}
    for world in (1, 2):
        threads = max(1, (os.cpu_count() or 1) // world)
        results[world] = [
            run_epoch(data, args.work / f"run{world}", world, args.batch, threads)
            for _ in range(args.repeats)
        ]
    base = statistics.median(results[1])
    print(f"load average: {os.getloadavg()}  cpus: {os.cpu_count()}  at {time.ctime()}")
    print("| processes | threads each | img/s (median) | runs | vs 1 process |")
    print("| --- | --- | --- | --- | --- |")
    for world, values in results.items():
        threads = max(1, (os.cpu_count() or 1) // world)
        median = statistics.median(values)
        runs = ", ".join(f"{v:.1f}" for v in values)
        print(f"| {world} | {threads} | {median:.1f} | {runs} | {median / base:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
