"""Where the fused loss's step time goes on a CUDA GPU, and how it moves with the chunk size.

The race (``bench_gpu.py``) times whole steps; this probe says why a step takes what it takes.
For ArcFace (s = 64, m = 0.5) at ``N = D = 512``, ``--dtype`` (bf16), ``C`` classes, with the
chunked executor's Triton kernels and with PyTorch per chunk (``kernels="torch"``):

* each ``--chunks`` size (0: the executor's default, :func:`~marginface.executors.chunk_plan.
  default_chunk_size`): the median step (CUDA events, ``--repeats`` rounds interleaved after a
  warm-up) and the workspace beyond inputs, weights and gradients (``bench_gpu.step_memory``),
  beside the 4-GEMM floor measured in the same run;
* at the default chunk, one profiled step (``torch.profiler``): the host's wall time, the GPU's
  busy time (the kernels' summed device time), the number of kernel launches, and the kernels
  that take the most device time. Busy time far below the wall time means the step waits on the
  host (launches, Python), not on the GPU.

Command (docs/gpu.md; ``--smoke`` runs the logic on tiny shapes, on the CPU without CUDA)::

    PYTHONPATH=src python3 benchmarks/probe_gpu_chunks.py --classes 1000000 --json $OUT/probe.json
    PYTHONPATH=src python3 benchmarks/probe_gpu_chunks.py --chunks 0 --kernels triton \
        --weight-gradient-bytes 0 --json $OUT/probe.json  # before/after: one launch per chunk
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import bench_gpu
import marginface
from bench_compile import MARGIN, SCALE


def fused_step(
    n: int, d: int, c: int, dtype: torch.dtype, chunk: int | None, kernels: str,
    weight_gradient_bytes: int | None = None,
) -> bench_gpu.Step:  # fmt: skip
    """One forward + backward of ``ArcFaceLoss(impl="chunked", chunk_size=chunk)`` on the
    executor's ``kernels``, on seeded inputs; ``weight_gradient_bytes``: the Triton weight
    gradient's workspace bound for this step
    (:data:`~marginface.executors.triton_dispatch.WEIGHT_GRADIENT_WORKSPACE_BYTES`; 0: one
    launch per chunk)."""
    from marginface.executors import triton_dispatch

    device = torch.device(bench_gpu.DEVICE)
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, d, generator=generator, device=device).to(dtype).requires_grad_(True)
    labels = torch.randint(0, c, (n,), generator=generator, device=device)
    head = marginface.ArcFaceLoss(
        c, d, MARGIN, SCALE, impl="chunked", chunk_size=chunk, dtype=dtype, device=device
    )

    def run() -> None:
        bound = triton_dispatch.WEIGHT_GRADIENT_WORKSPACE_BYTES
        if weight_gradient_bytes is not None:
            triton_dispatch.WEIGHT_GRADIENT_WORKSPACE_BYTES = weight_gradient_bytes
        try:
            with bench_gpu.kernels_from_environment(kernels):
                head(x, labels).backward()
        finally:
            triton_dispatch.WEIGHT_GRADIENT_WORKSPACE_BYTES = bound

    return bench_gpu.Step(run, [head.weight, x])


def profile(step: bench_gpu.Step, top: int) -> dict:
    """One profiled step after a warm-up: host wall ms, GPU busy ms, kernel launches, and the
    ``top`` kernels by device time (name, ms, calls)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    step()
    bench_gpu._synchronize()
    activities = [ProfilerActivity.CPU]
    if bench_gpu.DEVICE == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with torch_profile(activities=activities) as prof:
        began = time.perf_counter()
        step()
        bench_gpu._synchronize()
        wall_ms = 1000.0 * (time.perf_counter() - began)
    kernels = []
    for event in prof.key_averages():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        device_us = getattr(event, "self_device_time_total", None)
        if device_us is None:
            device_us = event.self_cuda_time_total
        kernels.append((event.key, device_us / 1000.0, event.count))
    kernels.sort(key=lambda row: -row[1])
    return {
        "wall_ms": wall_ms,
        "gpu_busy_ms": sum(ms for _, ms, _ in kernels),
        "launches": sum(count for _, _, count in kernels),
        "top": [{"kernel": k[:90], "ms": ms, "calls": calls} for k, ms, calls in kernels[:top]],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, default=1_000_000)
    parser.add_argument("--dtype", default="bfloat16", choices=list(bench_gpu.DTYPES))
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 65536, 262144])
    parser.add_argument("--kernels", nargs="+", default=["triton", "torch"])
    parser.add_argument(
        "--weight-gradient-bytes",
        type=int,
        nargs="*",
        default=[],
        help="also time the Triton path at the default chunk with these weight-gradient "
        "workspace bounds (0: one launch per chunk)",
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--json", default=None)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU without CUDA)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        if not args.smoke:
            sys.exit("probe_gpu_chunks.py needs CUDA (or --smoke)")
        bench_gpu.DEVICE = "cpu"
        args.kernels = ["torch"]
    if args.smoke:
        args.batch, args.dim, args.classes, args.repeats = 16, 16, 200, 1
        args.chunks = [0, 64]
    n, d, c = args.batch, args.dim, args.classes
    dtype = bench_gpu.DTYPES[args.dtype]
    name = torch.cuda.get_device_name() if bench_gpu.DEVICE == "cuda" else "CPU (smoke)"
    print(f"# {name}, torch {torch.__version__}, N={n}, D={d}, C={c}, {args.dtype}", flush=True)
    steps = {"gemm4": bench_gpu.make_step("gemm4", n, d, c, dtype)}
    rows: dict[str, dict] = {"gemm4": {"workspace_mb": bench_gpu.step_memory(steps["gemm4"])}}
    for kernels in args.kernels:
        for chunk in args.chunks:
            key = f"{kernels}:{chunk or 'default'}"
            try:
                steps[key] = fused_step(n, d, c, dtype, chunk or None, kernels)
                rows[key] = {"workspace_mb": bench_gpu.step_memory(steps[key])}
            except Exception as error:  # a chunk that does not fit is reported, not fatal
                rows[key] = {"error": f"{type(error).__name__}: {str(error)[:160]}"}
                steps.pop(key, None)
                if bench_gpu.DEVICE == "cuda":
                    torch.cuda.empty_cache()
    if "triton" in args.kernels:
        for bound in args.weight_gradient_bytes:
            key = f"triton:default:wg={bound}"
            steps[key] = fused_step(n, d, c, dtype, None, "triton", bound)
            rows[key] = {"workspace_mb": bench_gpu.step_memory(steps[key])}
    samples: dict[str, list[float]] = {key: [] for key in steps}
    for _ in range(args.repeats):
        for key, step in steps.items():
            samples[key].append(bench_gpu.timed_ms(step))
    floor = statistics.median(samples["gemm4"])
    print("| method:chunk | median ms | / gemm4 | workspace MB |\n|---|---:|---:|---:|")
    for key, values in samples.items():
        rows[key]["ms"] = statistics.median(values)
        rows[key]["ratio"] = rows[key]["ms"] / floor
        print(f"| {key} | {rows[key]['ms']:.3f} | {rows[key]['ratio']:.2f} | "
              f"{rows[key]['workspace_mb']:.0f} |", flush=True)  # fmt: skip
    profiles = {}
    for kernels in args.kernels:
        key = f"{kernels}:default"
        if key in steps:
            profiles[key] = profile(steps[key], args.top)
            summary = {k: v for k, v in profiles[key].items() if k != "top"}
            print(f"# profile {key}: {json.dumps(summary)}", flush=True)
            for row in profiles[key]["top"]:
                print(f"#   {row['ms']:8.3f} ms {row['calls']:5d}x {row['kernel']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"steps": rows, "profiles": profiles}, indent=1))


if __name__ == "__main__":
    main()
