"""``marginface embed``'s pipeline against the same model in a bare loop: decode the aligned
112x112 crops of a folder, normalise, embed, write the ``.npz``, versus the model called on
tensors already in memory, batch by batch (eval, no grad). The pipeline's overhead is their
ratio.

    PYTHONPATH=src python benchmarks/bench_embed.py --threads 2 --images 32 --repeats 2

Each backbone (random weights, 512-D, exported with its description to ``backbone.pt`` so the
pipeline opens it as a user's file) embeds ``--images`` PNG crops (``--mbf-images`` for mbf,
whose forward pass is fast enough for decoding to matter); the two methods alternate, median of
``--repeats`` after a warm-up. "overhead" is the ratio of the two medians; "paired" is the
median over repeats of each repeat's own ratio (pipeline time / the bare loop's time just
before it, which shares that moment's load), with the lowest and highest. Prints a markdown
table and the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import machine_lines
from marginface.export import export_state_dict
from marginface.inference import FaceModel
from marginface.inference.folder import embed_folder
from marginface.models import create_model
from marginface.models.description import ModelDescription


def write_crops(folder: Path, count: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        identity = folder / f"id{i % 8}"
        identity.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (112, 112, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(identity / f"{i}.png")


def measure(name: str, images: int, batch: int, repeats: int, work: Path) -> dict[str, float]:
    torch.manual_seed(0)
    model = create_model(name, embedding_dim=512, in_channels=3, image_size=112).eval()
    description = ModelDescription(architecture=name, embedding_dim=512, image_size=112)
    weights = export_state_dict(model, work / f"{name}.pt", description=description)
    crops = work / f"crops-{name}"
    write_crops(crops, images)
    face_model = FaceModel(weights, batch_size=batch, flip=False)
    bare = face_model.module  # the same module, called directly
    x = torch.rand(images, 3, 112, 112) * 2 - 1

    def bare_loop() -> None:
        with torch.no_grad():
            for start in range(0, images, batch):
                bare(x[start : start + batch])

    def pipeline() -> None:
        out = work / f"{name}.npz"
        out.unlink(missing_ok=True)
        result = embed_folder(face_model, crops, out, workers=1)
        assert result.embedded == images

    bare_loop(), pipeline()  # warm-up
    times: dict[str, list[float]] = {"bare": [], "pipeline": []}
    for _ in range(repeats):
        for label, call in (("bare", bare_loop), ("pipeline", pipeline)):
            start = time.perf_counter()
            call()
            times[label].append(time.perf_counter() - start)
    bare_s, pipe_s = (statistics.median(times[k]) for k in ("bare", "pipeline"))
    paired = [p / b - 1 for b, p in zip(times["bare"], times["pipeline"], strict=True)]
    return {
        "bare": images / bare_s,
        "pipeline": images / pipe_s,
        "overhead": pipe_s / bare_s - 1,
        "paired": statistics.median(paired),
        "paired_min": min(paired),
        "paired_max": max(paired),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--mbf-images", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", default="r18,r50,mbf")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    print(
        "| backbone | images | batch | repeats | bare loop img/s | embed pipeline img/s | "
        "overhead | paired overhead, median (min to max) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            images = args.mbf_images if name.startswith("mbf") else args.images
            row = measure(name, images, args.batch, args.repeats, Path(folder))
            print(
                f"| {name} | {images} | {args.batch} | {args.repeats} | {row['bare']:.2f} | "
                f"{row['pipeline']:.2f} | {100 * row['overhead']:+.1f} % | "
                f"{100 * row['paired']:+.1f} % ({100 * row['paired_min']:+.1f} to "
                f"{100 * row['paired_max']:+.1f} %) |",
                flush=True,
            )
    command = "PYTHONPATH=src python benchmarks/bench_embed.py " + " ".join(sys.argv[1:])
    for line in machine_lines(load_before, os.getloadavg(), command):
        print(line)


if __name__ == "__main__":
    main()
