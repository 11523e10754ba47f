"""The one embedder's own cost per batch (issue 45): ``embed_batches`` against the loop it
replaced in ``FaceModel.embed_pixels`` (restated inline: normalise, forward, mirrored forward,
sum, L2 normalisation), on a tiny model and batches of one image, so that the model's time
hardly counts and what is left is the loop's overhead. The two alternate in one process
(median of ``--repeats``); both must give the same embeddings to the bit.

    PYTHONPATH=src python benchmarks/bench_embedder_overhead.py --batches 2000 --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from marginface.inference.embedder import embed_batches
from marginface.models.description import normalise_pixels


def _normalise(pixels: torch.Tensor) -> torch.Tensor:
    return normalise_pixels(pixels, 0.5, 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    module = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 8)).eval()
    pixels = torch.randint(0, 256, (args.batches, 3, 4, 4), dtype=torch.uint8)

    @torch.no_grad()
    def old_loop(images: torch.Tensor) -> torch.Tensor:
        out = []
        for start in range(images.shape[0]):
            x = _normalise(images[start : start + 1].to("cpu")).to(torch.float32)
            features = module(x).float()
            features = features + module(torch.flip(x, dims=(3,))).float()
            out.append(torch.nn.functional.normalize(features, dim=1))
        return torch.cat(out)

    def embedder(images: torch.Tensor) -> torch.Tensor:
        return embed_batches(
            module, images, normalise=_normalise, flip=True, batch_size=1, dtype=torch.float32
        )

    if not torch.equal(old_loop(pixels), embedder(pixels)):
        raise SystemExit("the embedder and the old loop differ")
    old, new = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        old_loop(pixels)
        old.append(time.perf_counter() - start)
        start = time.perf_counter()
        embedder(pixels)
        new.append(time.perf_counter() - start)
    per = 1e6 / args.batches
    print(
        f"{args.batches} batches of 1 image, median of {args.repeats}: old loop "
        f"{statistics.median(old) * per:.1f} us/batch, embedder "
        f"{statistics.median(new) * per:.1f} us/batch"
    )


if __name__ == "__main__":
    main()
