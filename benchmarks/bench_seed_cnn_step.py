"""Training-step time of the seeds' CNN at MNIST size (batch 1024, 28×28, 3-D CurricularFace):
memory format and autocast variants, each as a ratio to plain fp32 NCHW measured in the same run.

Usage: ``python benchmarks/bench_seed_cnn_step.py [--steps 6] [--threads N]``. Prints the
median seconds per step of each variant and the implied seconds per MNIST epoch (59 steps).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import marginface
from marginface.models import SeedCNN

VARIANTS = {
    "fp32 NCHW": (False, False),
    "fp32 channels_last": (True, False),
    "bf16 autocast NCHW": (False, True),
    "bf16 autocast channels_last": (True, True),
}


def step_times(channels_last: bool, bf16: bool, steps: int) -> list[float]:
    torch.manual_seed(0)
    model = SeedCNN(3, image_size=28)
    loss_fn = marginface.create_loss("curricularface", 10, 3, scale=30.0)
    params = list(model.parameters()) + list(loss_fn.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-3)
    images = torch.rand(1024, 1, 28, 28)  # (N, 1, 28, 28)
    labels = torch.randint(0, 10, (1024,))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    times = []
    for _ in range(steps + 1):  # the first step (kernel creation) is dropped
        began = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            embeddings = model(images)
        loss = loss_fn(embeddings.float(), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - began)
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    print(f"{os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads")
    baseline = None
    for name, (channels_last, bf16) in VARIANTS.items():
        median = statistics.median(step_times(channels_last, bf16, args.steps))
        baseline = baseline or median
        print(
            f"{name:30s} {median:6.3f} s/step  ~{median * 59:6.1f} s/epoch  "
            f"speed-up x{baseline / median:4.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
