"""MTCNN on LFW: the share of photos whose main face is found, and the time per 250×250 photo
on this CPU (1 and 2 threads), batched (16 photos of one size per call) and one at a time;
and (``--versus N``) the comparison with facenet-pytorch 2.6.0's own ``detect_face``.

    PYTHONPATH=src python benchmarks/bench_detect.py --time-sample 500 --find-every 1
    PYTHONPATH=src python benchmarks/bench_detect.py --versus 560 --skip-timing --skip-find
    PYTHONPATH=src python benchmarks/bench_detect.py --versus 560 --skip-timing --skip-find \
        --before ../wt-base --batch-networks

(``--skip-timing`` / ``--skip-find`` run one half; ``--find-threads`` sets the find run's).

``--versus N``: the first N LFW photos, one thread, in chunks of 16: facenet-pytorch's
``detect_face`` one photo per call (as its ``MTCNN.detect`` runs a photo; loaded by
``tests/detect/_facenet_pytorch.py``, with torchvision's ``batched_nms`` restated in Python
when torchvision is absent), marginface with the 16 as one batch, and marginface one photo per
call, interleaved, the first of them rotating from chunk to chunk. ``--before TREE`` adds the
``MTCNN`` of another checkout (``TREE/src``, loaded as the package ``marginface_before``) and
``--batch-networks`` ``MTCNN(batch_networks=True)``, each with 16 photos per call, to the
rotation. For each marginface run, per photo against facenet-pytorch: the boxes, scores and
landmarks equal bit for bit, within 1e-4 (px and probability), or worse
(another face count or a larger difference). Times: per chunk, wall (``perf_counter``) and
CPU (``process_time``) ms per photo; medians over the chunks, and the ratio of the medians.
The Python ``batched_nms`` stand-in is slower than torchvision's C++ one: its time is
measured too, and the ratio is also given against facenet-pytorch without it (a lower bound
of the ratio against facenet-pytorch with torchvision).

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


def load_before(tree: str):
    """``MTCNN`` of the checkout ``tree`` (its ``src/marginface`` imported as the package
    ``marginface_before``, so both trees load in one process)."""
    import importlib.util

    root = Path(tree).resolve() / "src" / "marginface"
    spec = importlib.util.spec_from_file_location(
        "marginface_before", root / "__init__.py", submodule_search_locations=[str(root)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules["marginface_before"] = package
    spec.loader.exec_module(package)
    return importlib.import_module("marginface_before.detect.mtcnn").MTCNN


def versus_facenet(count: int, before: str | None = None, batch_networks: bool = False) -> None:
    """The ``--versus`` comparison (see the module docstring); prints markdown lines."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.detect._facenet_pytorch import load_facenet_mtcnn

    torch.set_num_threads(1)
    reference, detector = load_facenet_mtcnn(), MTCNN()
    stand_in = reference.module.batched_nms
    nms_seconds = [0.0, 0.0]  # wall, CPU

    def timed_nms(*args):
        wall, cpu = time.perf_counter(), time.process_time()
        kept = stand_in(*args)
        nms_seconds[0] += time.perf_counter() - wall
        nms_seconds[1] += time.process_time() - cpu
        return kept

    reference.module.batched_nms = timed_nms
    images = [image for _, image in lfw_photos(1, count)]
    runs = {
        "facenet": lambda chunk: [reference.detect(image) for image in chunk],
        "batched": lambda chunk: detector.detect(chunk),
        "single": lambda chunk: [detector.detect(image)[0] for image in chunk],
    }
    labels = {
        "facenet": "facenet-pytorch detect_face, 1 photo/call",
        "batched": "marginface MTCNN, 16 photos/call",
        "single": "marginface MTCNN, 1 photo/call",
    }
    if before:
        old = load_before(before)()
        runs["before"] = lambda chunk: old.detect(chunk)
        labels["before"] = f"marginface MTCNN of {before}, 16 photos/call"
    if batch_networks:
        whole = MTCNN(batch_networks=True)
        runs["whole"] = lambda chunk: whole.detect(chunk)
        labels["whole"] = "marginface MTCNN(batch_networks=True), 16 photos/call"
    agree = {name: {"exact": 0, "1e-4": 0, "worse": 0, "gap": 0.0} for name in runs}
    for run in runs.values():  # warm-up
        run(images[:2])
    times = {name: ([], []) for name in runs}  # wall, CPU ms per photo, per chunk
    nms_ms = []
    for number, start in enumerate(range(0, len(images), 16)):
        chunk = images[start : start + 16]
        names = list(runs)
        names = names[number % len(names) :] + names[: number % len(names)]
        out = {}
        for name in names:
            nms_seconds[:] = [0.0, 0.0]
            wall, cpu = time.perf_counter(), time.process_time()
            out[name] = runs[name](chunk)
            times[name][0].append(1000 * (time.perf_counter() - wall) / len(chunk))
            times[name][1].append(1000 * (time.process_time() - cpu) / len(chunk))
            if name == "facenet":
                nms_ms.append([1000 * t / len(chunk) for t in nms_seconds])
        for name in runs:
            if name == "facenet":
                continue
            tally = agree[name]
            for expected, faces in zip(out["facenet"], out[name], strict=True):
                got = (faces.boxes, faces.scores, faces.landmarks)
                if any(a.shape != np.shape(b) for a, b in zip(got, expected, strict=True)):
                    tally["worse"] += 1
                    continue
                gap = max(
                    (float(np.abs(a - np.asarray(b, np.float32)).max(initial=0.0)))
                    for a, b in zip(got, expected, strict=True)
                )
                tally["gap"] = max(tally["gap"], gap)
                tally["exact" if gap == 0 else "1e-4" if gap <= 1e-4 else "worse"] += 1
    total = len(images)
    for name in runs:
        if name == "facenet":
            continue
        tally = agree[name]
        print(
            f"| equality, {total} LFW photos ({labels[name]}) | {tally['exact']} exact | "
            f"{tally['1e-4']} within 1e-4 | {tally['worse']} worse (another face count or "
            f"further) | largest gap among equal counts {tally['gap']:g} |"
        )
    median = {name: (np.median(w), np.median(c)) for name, (w, c) in times.items()}
    stand_in_ms = np.median(np.asarray(nms_ms), axis=0)  # wall, CPU
    print("| 1 thread, ms/photo (median of chunks) | wall | CPU |")
    print("|---|---|---|")
    for name, label in labels.items():
        print(f"| {label} | {median[name][0]:.1f} | {median[name][1]:.1f} |")
    print(
        f"| (facenet-pytorch's Python batched_nms stand-in inside it) | {stand_in_ms[0]:.1f} | "
        f"{stand_in_ms[1]:.1f} |"
    )
    for name in (name for name in runs if name != "facenet"):
        wall, cpu = median[name]
        print(
            f"ratio facenet/{name}: wall {median['facenet'][0] / wall:.2f}x, "
            f"CPU {median['facenet'][1] / cpu:.2f}x; without the NMS stand-in: wall "
            f"{(median['facenet'][0] - stand_in_ms[0]) / wall:.2f}x, "
            f"CPU {(median['facenet'][1] - stand_in_ms[1]) / cpu:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-sample", type=int, default=500, help="photos timed")
    parser.add_argument("--find-every", type=int, default=1, help="every k-th photo (1: all)")
    parser.add_argument("--find-limit", type=int, help="at most this many photos")
    parser.add_argument("--find-threads", type=int, default=1, help="threads of the find run")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--skip-find", action="store_true")
    parser.add_argument("--versus", type=int, default=0, help="photos against facenet-pytorch")
    parser.add_argument("--before", help="--versus: also time the MTCNN of this checkout")
    parser.add_argument(
        "--batch-networks", action="store_true", help="--versus: also MTCNN(batch_networks=True)"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    if args.versus:
        versus_facenet(args.versus, args.before, args.batch_networks)
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
