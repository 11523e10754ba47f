"""Training-step time of the seeds' CNN at MNIST size (batch 1024, 28×28, 3-D CurricularFace):
memory format, autocast and fused (``SeedCNN(fused=True)``: fused first block, bit-mask dropout)
variants, each as a ratio to plain fp32 NCHW and the fused ones also to their unfused twin,
all measured in the same run (variants interleaved round by round, medians per variant).

Usage: ``python benchmarks/bench_seed_cnn_step.py [--steps 6] [--rounds 1] [--threads N]
[--only NAME ...]``. Prints the median seconds per step of each variant and the implied seconds
per MNIST epoch (59 steps), and the 1-minute load average (time only below ~1.5).

``--floor`` measures instead how close fp32 can get: the machine's fp32 GEMM throughput
(2048² matmul, median of 10), the multiply-adds of conv2 and conv3 (forward, input gradient,
weight gradient), the time those alone would take per epoch at that throughput, and a
``torch.profiler`` breakdown of the fused fp32 channels_last step by operator.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

import marginface
from marginface.models import SeedCNN

VARIANTS = {  # name: (channels_last, bf16, fused)
    "fp32 NCHW": (False, False, False),
    "fp32 channels_last": (True, False, False),
    "bf16 autocast NCHW": (False, True, False),
    "bf16 autocast channels_last": (True, True, False),
    "fused fp32 channels_last": (True, False, True),
    "fused bf16 autocast channels_last": (True, True, True),
}


def training_step(channels_last: bool, bf16: bool, fused: bool) -> Callable[[], None]:
    """One seeded MNIST-size training step (batch 1024, 3-D CurricularFace, Adam) as a closure."""
    torch.manual_seed(0)
    model = SeedCNN(3, image_size=28, fused=fused)
    loss_fn = marginface.create_loss("curricularface", 10, 3, scale=30.0)
    params = list(model.parameters()) + list(loss_fn.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-3)
    images = torch.rand(1024, 1, 28, 28)  # (N, 1, 28, 28)
    labels = torch.randint(0, 10, (1024,))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            embeddings = model(images)
        loss = loss_fn(embeddings.float(), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def step_times(channels_last: bool, bf16: bool, fused: bool, steps: int) -> list[float]:
    step = training_step(channels_last, bf16, fused)
    times = []
    for _ in range(steps + 1):  # the first step (kernel creation) is dropped
        began = time.perf_counter()
        step()
        times.append(time.perf_counter() - began)
    return times[1:]


def gemm_gflops(size: int = 2048, repeats: int = 10) -> float:
    """Median fp32 matmul throughput (GFLOP/s): the practical peak of this CPU and thread count."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - began)
    return 2 * size**3 / statistics.median(times) / 1e9


def conv_macs(model: torch.nn.Module, image_size: int = 28) -> list[tuple[str, int]]:
    """Multiply-adds per image of each unfused ``nn.Conv2d`` (forward), from forward hooks."""
    found: list[tuple[str, int]] = []

    def hook(module: torch.nn.Conv2d, _inputs: tuple, output: torch.Tensor) -> None:
        kh, kw = module.kernel_size
        per_output = module.in_channels // module.groups * kh * kw
        found.append((name_of[module], output[0].numel() * per_output))

    name_of = {m: n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)}
    handles = [m.register_forward_hook(hook) for m in name_of]
    with torch.no_grad():
        model(torch.rand(1, 1, image_size, image_size))
    for handle in handles:
        handle.remove()
    return found


def floor_report(steps: int) -> None:
    """The fp32 lower bound of conv2 + conv3 against the measured step, and the op profile."""
    from torch.profiler import ProfilerActivity, profile

    peak = gemm_gflops()
    model = SeedCNN(3, image_size=28, fused=True)
    macs = conv_macs(model)
    print(f"fp32 GEMM 2048x2048: {peak:.0f} GFLOP/s (median of 10)")
    total = 0
    for name, count in macs:
        # forward + input gradient + weight gradient: 3 x the forward multiply-adds, 2 FLOP each
        flops = 3 * 2 * count * 1024 * 59
        total += flops
        print(
            f"  {name}: {count / 1e6:.2f} M MAC/image fwd; {flops / peak / 1e9:5.1f} s/epoch "
            "(fwd+bwd, 59 steps of 1024) at that throughput"
        )
    print(f"  unfused convs together: {total / peak / 1e9:.1f} s/epoch at the GEMM throughput")
    median = statistics.median(step_times(True, False, True, steps))
    print(f"fused fp32 channels_last step: {median:.3f} s (~{median * 59:.1f} s/epoch)")
    step = training_step(True, False, True)
    step()  # kernel creation, outside the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per variant and round")
    parser.add_argument("--rounds", type=int, default=1, help="passes over all variants")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--only", nargs="+", choices=sorted(VARIANTS), default=None)
    parser.add_argument("--floor", action="store_true", help="fp32 lower bound and profile")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    print(
        f"{os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    if args.floor:
        floor_report(args.steps)
        return
    names = args.only or list(VARIANTS)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in names:
            times[name] += step_times(*VARIANTS[name], args.steps)
    medians = {name: statistics.median(values) for name, values in times.items()}
    baseline = medians[names[0]]
    for name, median in medians.items():
        line = (
            f"{name:34s} {median:6.3f} s/step  ~{median * 59:6.1f} s/epoch  "
            f"x{baseline / median:4.2f} vs {names[0]}"
        )
        twin = name.removeprefix("fused ")
        if twin != name and twin in medians:
            line += f"  x{medians[twin] / median:4.2f} vs {twin}"
        print(line, flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
