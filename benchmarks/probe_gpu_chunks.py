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
from typing import Any

import torch

import bench_gpu
import marginface
from bench_compile import MARGIN, SCALE
from marginface.executors import kernel_options


def fused_step(
    n: int, d: int, c: int, dtype: torch.dtype, chunk: int | None, kernels: str,
    settings: dict[str, Any] | None = None,
) -> bench_gpu.Step:  # fmt: skip
    """One forward + backward of ``ArcFaceLoss(impl="chunked", chunk_size=chunk)`` on the
    executor's ``kernels``, on seeded inputs (the same for every call), with the variant's
    ``settings`` (``bench_gpu.SETTINGS``: the Triton backward, the workspace bounds, tuned
    tiles, the value checks)."""
    device = torch.device(bench_gpu.DEVICE)
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, d, generator=generator, device=device).to(dtype).requires_grad_(True)
    labels = torch.randint(0, c, (n,), generator=generator, device=device)
    torch.manual_seed(0)  # the head's weight
    head = marginface.ArcFaceLoss(
        c, d, MARGIN, SCALE, impl="chunked", chunk_size=chunk, dtype=dtype, device=device
    )

    def run() -> None:
        with (
            bench_gpu.settings_applied(settings or {}),
            bench_gpu.kernels_from_environment(kernels),
        ):
            head(x, labels).backward()

    return bench_gpu.Step(run, [head.weight, x])


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|a - e| / max|e|`` in float32 (``e`` the reference variant's)."""
    scale = float(expected.float().abs().max())
    return float((actual.float() - expected.float()).abs().max()) / (scale or 1.0)


def profile(step: bench_gpu.Step, top: int) -> dict:
    """One profiled step after a warm-up: host wall ms, GPU busy ms, kernel launches, and the
    ``top`` kernels by device time and the ``top`` most launched ones (name, ms, calls): the
    launches are what a step that waits on the host spends its time on."""
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
        "most_launched": [
            {"kernel": k[:90], "ms": ms, "calls": calls}
            for k, ms, calls in sorted(kernels, key=lambda row: -row[2])[:top]
        ],
    }


def best_tiles(rows: dict[str, dict]) -> dict[str, str]:
    """The fastest tile per kernel among the timed variants ``triton:tiles:SPEC`` and
    ``triton:statistics:SPEC`` whose ``dx``/``dW`` errors (when checked) are within 5e-2,
    if faster than the default tiles' variant (``triton:tiles``, ``triton:default``)."""
    chosen = {}
    for kernel, prefix, default in (
        ("gradient_tile", "triton:tiles:", "triton:tiles"),
        ("statistics", "triton:statistics:", "triton:default"),
    ):
        baseline = rows.get(default, {}).get("ms", float("inf"))
        best, best_ms = None, baseline
        for key, row in rows.items():
            errors = [row.get("dx_error", 0.0), row.get("dw_error", 0.0)]
            fits = key.startswith(prefix) and "ms" in row and max(errors) <= 5e-2
            if fits and row["ms"] < best_ms:
                best, best_ms = key.removeprefix(prefix), row["ms"]
        if best is not None:
            chosen[kernel] = best
    return chosen


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
        help="also time the fused Triton backward at the default chunk with these "
        "weight-gradient workspace bounds (0: one launch per chunk)",
    )
    parser.add_argument(
        "--backwards",
        nargs="*",
        default=[],
        help="also time the Triton path at the default chunk with each of these backwards "
        "(triton_dispatch.BACKWARDS: tiles, fused)",
    )
    parser.add_argument(
        "--tile-blocks",
        nargs="*",
        default=[],
        help="also time the tiled backward with these gradient-tile tiles, NxCxDxWARPSxSTAGES",
    )
    parser.add_argument(
        "--statistics-blocks",
        nargs="*",
        default=[],
        help="also time the Triton path with these statistics-kernel tiles, NxCxDxWARPSxSTAGES",
    )
    parser.add_argument(
        "--tile-bytes",
        type=int,
        nargs="*",
        default=[],
        help="also time the tiled backward with these class-tile workspace bounds",
    )
    parser.add_argument(
        "--unchecked",
        action="store_true",
        help="also time the Triton path with the value checks off (set_value_checks(False): "
        "no read back to the host in the step)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare each Triton variant's loss gradients with those of the first one "
        "(max relative error of dx and dW)",
    )
    parser.add_argument(
        "--best",
        default=None,
        help="write the fastest tiles per kernel among the --tile-blocks and "
        "--statistics-blocks variants (and the defaults) whose errors are within 5e-2 to this "
        "JSON file (bench_gpu.py --tuned reads it)",
    )
    parser.add_argument(
        "--profile",
        nargs="*",
        default=None,
        help="the variants to profile (default: each kernels choice at the default chunk)",
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
    variants: dict[str, dict[str, Any]] = {}
    if "triton" in args.kernels:
        for bound in args.weight_gradient_bytes:
            variants[f"triton:wg={bound}"] = {"backward": "fused", "wg_bytes": bound}
        for backward in args.backwards:
            variants[f"triton:{backward}"] = {"backward": backward}
        current = dict(kernel_options.TUNED_BLOCKS)
        if args.tile_blocks or args.statistics_blocks:
            variants["triton:untuned"] = {"backward": "tiles", "tuned": {}}
        for spec in args.tile_blocks:
            tuned = {**current, "gradient_tile": bench_gpu.blocks_of(spec)}
            variants[f"triton:tiles:{spec}"] = {"backward": "tiles", "tuned": tuned}
        for spec in args.statistics_blocks:
            tuned = {**current, "statistics": bench_gpu.blocks_of(spec)}
            variants[f"triton:statistics:{spec}"] = {"tuned": tuned}
        for bound in args.tile_bytes:
            variants[f"triton:tile_bytes={bound}"] = {"backward": "tiles", "tile_bytes": bound}
        if args.unchecked:
            variants["triton:unchecked"] = {"backward": "tiles", "value_checks": False}
    reference: tuple[torch.Tensor, torch.Tensor] | None = None
    for key, settings in variants.items():
        try:
            steps[key] = fused_step(n, d, c, dtype, None, "triton", settings)
            rows[key] = {"workspace_mb": bench_gpu.step_memory(steps[key])}
            if args.check:
                gradients = (steps[key].holds[1].grad, steps[key].holds[0].grad)  # dx, dW
                if reference is None:
                    reference = tuple(g.detach().clone() for g in gradients)  # type: ignore[assignment]
                rows[key]["dx_error"] = relative_error(gradients[0], reference[0])
                rows[key]["dw_error"] = relative_error(gradients[1], reference[1])
        except Exception as error:  # a variant that fails is reported, not fatal
            rows[key] = {"error": f"{type(error).__name__}: {str(error)[:160]}"}
            steps.pop(key, None)
            if bench_gpu.DEVICE == "cuda":
                torch.cuda.empty_cache()
    reference = None
    samples: dict[str, list[float]] = {key: [] for key in steps}
    for _ in range(args.repeats):
        for key, step in steps.items():
            samples[key].append(bench_gpu.timed_ms(step))
    floor = statistics.median(samples["gemm4"])
    print("| variant | median ms | / gemm4 | workspace MB | dx, dW error |")
    print("|---|---:|---:|---:|---|")
    for key, values in samples.items():
        rows[key]["ms"] = statistics.median(values)
        rows[key]["ratio"] = rows[key]["ms"] / floor
        errors = [f"{rows[key][e]:.1e}" for e in ("dx_error", "dw_error") if e in rows[key]]
        print(f"| {key} | {rows[key]['ms']:.3f} | {rows[key]['ratio']:.2f} | "
              f"{rows[key]['workspace_mb']:.0f} | {', '.join(errors)} |", flush=True)  # fmt: skip
    for key, row in rows.items():
        if "error" in row:
            print(f"| {key} | {row['error']} |", flush=True)
    profiles = {}
    profiled = args.profile
    if profiled is None:
        profiled = [f"{kernels}:default" for kernels in args.kernels]
    for key in profiled:
        if key in steps:
            profiles[key] = profile(steps[key], args.top)
            summary = {k: v for k, v in profiles[key].items() if k not in ("top", "most_launched")}
            print(f"# profile {key}: {json.dumps(summary)}", flush=True)
            for row in profiles[key]["top"]:
                print(f"#   {row['ms']:8.3f} ms {row['calls']:5d}x {row['kernel']}", flush=True)
            print("# most launched:", flush=True)
            for row in profiles[key]["most_launched"]:
                print(f"#   {row['calls']:5d}x {row['ms']:8.3f} ms {row['kernel']}", flush=True)
    if args.best:
        Path(args.best).write_text(json.dumps(best_tiles(rows)))
        print(f"# best tiles: {Path(args.best).read_text()}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"steps": rows, "profiles": profiles}, indent=1))


if __name__ == "__main__":
    main()
