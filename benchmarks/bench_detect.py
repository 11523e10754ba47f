"""MTCNN on LFW: the share of photos whose main face is found, and the time per 250×250 photo
on this CPU (1 and 2 threads), batched (16 photos of one size per call) and one at a time.

    PYTHONPATH=src python benchmarks/bench_detect.py --time-sample 500 --find-every 1

(``--skip-timing`` / ``--skip-find`` run one half; ``--find-threads`` sets the find run's).

The photos are read from ``../shared/data/lfw/lfw-deepfunneled.tar.gz`` (13,233 JPEGs, one
main face each, centred by deep funnelling). "Found" means a face whose box holds the photo's
centre (125, 125); the share of photos with any face is printed too. Timing: decoded photos
in memory (decoding excluded), one warm-up batch, then the whole sample, for each thread
count. Prints markdown lines, the machine and its load.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import machine_lines
from marginface.detect import MTCNN

ARCHIVE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "lfw"


def lfw_photos(every: int, limit: int | None):
    """``(name, uint8[250, 250, 3])`` of every ``every``-th LFW photo, in archive order."""
    seen = 0
    with tarfile.open(ARCHIVE / "lfw-deepfunneled.tar.gz") as tar:
        for member in tar:
            if not (member.isfile() and member.name.endswith(".jpg")):
                continue
            seen += 1
            if (seen - 1) % every:
                continue
            data = tar.extractfile(member).read()
            yield member.name, np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
            if limit is not None and (seen - 1) // every + 1 >= limit:
                return


def time_per_photo(detector: MTCNN, images: list[np.ndarray], batch: int) -> float:
    detector.detect(images[:batch])  # warm-up
    start = time.perf_counter()
    for i in range(0, len(images), batch):
        detector.detect(images[i : i + batch])
    return (time.perf_counter() - start) / len(images)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-sample", type=int, default=500, help="photos timed")
    parser.add_argument("--find-every", type=int, default=1, help="every k-th photo (1: all)")
    parser.add_argument("--find-limit", type=int, help="at most this many photos")
    parser.add_argument("--find-threads", type=int, default=1, help="threads of the find run")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--skip-find", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    detector = MTCNN()
    if not args.skip_timing:
        images = [image for _, image in lfw_photos(1, args.time_sample)]
        for threads in (1, 2):
            torch.set_num_threads(threads)
            one = time_per_photo(detector, images, 1)
            batched = time_per_photo(detector, images, 16)
            print(
                f"| {threads} | {len(images)} | {1000 * one:.1f} | {1000 * batched:.1f} | "
                f"{one / batched:.2f}x |",
                flush=True,
            )
    if not args.skip_find:
        torch.set_num_threads(args.find_threads)
        found = anyface = total = 0
        start = time.perf_counter()
        names, batch = [], []
        for name, image in lfw_photos(args.find_every, args.find_limit):
            names.append(name)
            batch.append(image)
            if len(batch) == 16:
                for faces in detector.detect(batch):
                    total += 1
                    anyface += faces.count > 0
                    b = faces.boxes
                    found += bool(
                        np.any(
                            (b[:, 0] <= 125)
                            & (b[:, 2] >= 125)
                            & (b[:, 1] <= 125)
                            & (b[:, 3] >= 125)
                        )
                    )
                batch = []
                if total % 1024 == 0:
                    print(
                        f"... {total} photos, {found} main faces found", file=sys.stderr, flush=True
                    )
        for faces in detector.detect(batch) if batch else []:
            total += 1
            anyface += faces.count > 0
            b = faces.boxes
            found += bool(
                np.any((b[:, 0] <= 125) & (b[:, 2] >= 125) & (b[:, 1] <= 125) & (b[:, 3] >= 125))
            )
        seconds = time.perf_counter() - start
        print(
            f"find rate: {found}/{total} = {100 * found / total:.2f} % main face found; "
            f"{100 * anyface / total:.2f} % with any face; {seconds:.0f} s "
            f"({1000 * seconds / total:.1f} ms/photo incl. decoding, {args.find_threads} thread(s))"
        )
    print("\n".join(machine_lines(load_before, os.getloadavg(), " ".join(sys.argv))))


if __name__ == "__main__":
    main()
