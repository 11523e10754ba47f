"""Each registered face backbone at 112×112: parameters, forward FLOPs, CPU img/s of the
forward pass (eval, no grad) and of a training step with the chunked ArcFace head at
C = 10 000 classes (forward, loss, backward, SGD step).

    PYTHONPATH=src python benchmarks/bench_backbones.py --threads 2 --batch 8 --repeats 3

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` on one image in eval mode
(2 per multiply-add of convolutions and matrix products; attention through PyTorch's math
kernel so its two products are counted; BatchNorm, activations and additions are not).
Timings: one warm-up call, then the median of ``--repeats`` calls (``--batch`` images each;
the big models take ``--big-batch``), and their ratios to ``--baseline`` (r50) measured in the
same run. Prints a markdown table and the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import machine_lines
from marginface import create_loss
from marginface.models import create_model

BACKBONES = ("r18", "r34", "r50", "r100", "r200", "mbf", "mbf_large", "vit_t", "vit_s", "vit_b")
BIG = ("r100", "r200", "vit_b", "mbf_large")


def count_flops(model: torch.nn.Module, size: int) -> int:
    """Forward FLOPs of one ``3 × size × size`` image (eval mode)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model.eval()
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
        model(torch.randn(1, 3, size, size))
    return int(counter.get_total_flops())


def median_seconds(call, repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, batch: int, repeats: int, classes: int, size: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = create_model(name, embedding_dim=512, in_channels=3, image_size=size)
    model = model.to(memory_format=torch.channels_last)
    params = sum(p.numel() for p in model.parameters())
    flops = count_flops(model, size)
    images = torch.randn(batch, 3, size, size).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, classes, (batch,))

    def forward() -> None:
        with torch.no_grad():
            model(images)

    model.eval()
    forward_s = median_seconds(forward, repeats)

    loss = create_loss("arcface", classes, 512, impl="chunked")
    optimizer = torch.optim.SGD([*model.parameters(), *loss.parameters()], lr=0.01)
    model.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss(model(images), labels).backward()
        optimizer.step()

    step_s = median_seconds(step, repeats)
    return {
        "params": params,
        "gflops": flops / 1e9,
        "forward": batch / forward_s,
        "train": batch / step_s,
        "batch": batch,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(BACKBONES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--big-batch", type=int, default=4, help="batch of r100/r200/vit_b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--classes", type=int, default=10_000)
    parser.add_argument("--image-size", type=int, default=112)
    parser.add_argument("--baseline", default="r50", help="the ratios' denominator")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = []
    for name in args.models.split(","):
        batch = args.big_batch if name in BIG else args.batch
        result = measure(name, batch, args.repeats, args.classes, args.image_size)
        rows.append((name, result))
        print(f"{name}: {result}", file=sys.stderr, flush=True)
    base = dict(rows).get(args.baseline)
    print(
        f"| backbone | parameters (M) | GFLOPs (1 image, {args.image_size} px) | batch | "
        f"forward img/s | / {args.baseline} | train step img/s (chunked ArcFace, "
        f"C = {args.classes}) | / {args.baseline} |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in rows:
        forward_ratio = f"{r['forward'] / base['forward']:.2f}" if base else "-"
        train_ratio = f"{r['train'] / base['train']:.2f}" if base else "-"
        print(
            f"| {name} | {r['params'] / 1e6:.2f} | {r['gflops']:.2f} | {r['batch']} | "
            f"{r['forward']:.2f} | {forward_ratio} | {r['train']:.2f} | {train_ratio} |"
        )
    command = "PYTHONPATH=src python " + " ".join(["benchmarks/bench_backbones.py", *sys.argv[1:]])
    print()
    for line in machine_lines(load_before, os.getloadavg(), command):
        print(f"- {line}")


if __name__ == "__main__":
    main()
