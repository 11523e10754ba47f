"""Step time and extra peak memory of the one-vs-all (binary) reduction: SphereFace2 (variant C,
the authors' defaults) chunked against its own dense path and the GEMM floors, with ArcFace's
chunked softmax step beside it for reference.

Methods, on the same inputs (N×D embeddings, C×D class centers, labels), one forward + backward
each (gradients set to None first):

* ``gemm3`` / ``gemm4``: the bare GEMMs (cosines, ∂x, ∂W; plus the backward's recompute) -- the
  floors (``benchmarks/bench_fused.py``'s).
* ``dense``: ``SphereFace2Loss(impl="dense")`` (``N×C`` logits).
* ``chunked``: ``SphereFace2Loss(impl="chunked")`` (one pass forward, one backward).
* ``softmax``: ``ArcFaceLoss(impl="chunked")``, the softmax reduction's chunked step.
* ``function``: the same SphereFace2 step on the autograd Function the class-sharded head runs
  on each rank (``ChunkedBinaryLoss``, here without a shard: one rank's share at W = 1).

Times are medians over ``--repeats`` rounds, methods interleaved within a round (a slow spell of
a shared machine hits all alike); ratios are to the floors of the same run. Extra peak memory
(``--memory``) is measured as ``bench_fused.py`` does: the whole-process peak resident set of a
fresh process over one step after a warm-up, minus that of a fresh process holding the same
inputs, weight and gradients.

    PYTHONPATH=src python benchmarks/bench_binary.py --classes 100000 --repeats 3 --memory
    PYTHONPATH=src python benchmarks/bench_binary.py --classes 1000000 --repeats 1 --memory \\
        --methods gemm3 gemm4 chunked softmax
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

import marginface
from bench_fused import Step
from bench_fused import make_step as fused_step
from bench_memory import measure_step, memory_report

METHODS = ("gemm3", "gemm4", "dense", "chunked", "softmax", "function")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make_step(method: str, n: int, d: int, c: int, dtype: torch.dtype) -> Step:
    """One forward + backward of ``method`` on seeded inputs."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=generator).to(dtype).requires_grad_(True)
    labels = torch.randint(0, c, (n,), generator=generator)
    if method in ("gemm3", "gemm4"):  # the floors, as bench_fused.py measures them
        return fused_step(method, n, d, c, dtype, None)
    if method == "softmax":
        head = marginface.ArcFaceLoss(c, d, impl="chunked", dtype=dtype)
    elif method in ("dense", "chunked"):
        head = marginface.SphereFace2Loss(c, d, impl=method, dtype=dtype)
    elif method == "function":
        return _function_step(x, labels, c, d, dtype)
    else:
        raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")

    def loss_step() -> None:
        for parameter in head.parameters():
            parameter.grad = None
        x.grad = None
        head(x, labels).backward()

    return Step(loss_step, [head.weight, x])


def _function_step(x: torch.Tensor, labels: torch.Tensor, c: int, d: int, dtype) -> Step:
    """SphereFace2's chunked step through ``ChunkedBinaryLoss`` (the sharded head's path)."""
    from marginface.executors.binary_loop import ChunkedBinaryLoss
    from marginface.executors.chunk_plan import gemm_dtype
    from marginface.executors.dense import compute_dtype

    head = marginface.SphereFace2Loss(c, d, impl="chunked", dtype=dtype)
    margin = head.margin

    def loss_step() -> None:
        for parameter in head.parameters():
            parameter.grad = None
        x.grad = None
        x_compute = x.to(compute_dtype(x, head.weight))
        loss = ChunkedBinaryLoss.apply(
            x_compute, head.weight, margin.bias, labels, labels, margin, 1, None,
            gemm_dtype(x, head.weight), None, None, False,
        )  # fmt: skip
        loss.mean().backward()

    return Step(loss_step, [head.weight, x])


def time_methods(
    methods: list[str], n: int, d: int, c: int, dtype: torch.dtype, repeats: int
) -> dict[str, float]:
    steps = {m: make_step(m, n, d, c, dtype) for m in methods}
    for step in steps.values():  # warm-up
        step()
    samples: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(repeats):
        for method, step in steps.items():
            start = time.perf_counter()
            step()
            samples[method].append(time.perf_counter() - start)
    return {m: statistics.median(v) for m, v in samples.items()}


def memory_in_subprocess(method: str, n: int, d: int, c: int, dtype_name: str) -> int | None:
    """Extra peak bytes: step process minus baseline process, each a fresh interpreter."""
    peaks = []
    for kind in ("step", "baseline"):
        command = [sys.executable, __file__, "--probe", method, "--probe-kind", kind]
        command += ["--batch", str(n), "--dim", str(d), "--classes", str(c), "--dtypes", dtype_name]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            return None
        peaks.append(json.loads(result.stdout.strip().splitlines()[-1])["VmHWM"])
    return peaks[0] - peaks[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, nargs="+", default=[100_000])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="also measure peak memory")
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--probe-kind", default="step", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    n, d = args.batch, args.dim
    if args.probe is not None:
        step = make_step(args.probe, n, d, args.classes[0], DTYPES[args.dtypes[0]])
        if args.probe_kind == "baseline":
            step.hold_gradients()
            print(json.dumps(memory_report()))
        else:
            print(json.dumps(measure_step(step)))
        return
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, N={n}, D={d}")
    print("| C | dtype | method | median s | / gemm3 | / gemm4 | extra peak MB |")
    print("|" + "---|" * 7)
    results = []
    for c in args.classes:
        for name in args.dtypes:
            times = time_methods(args.methods, n, d, c, DTYPES[name], args.repeats)
            for method in args.methods:
                row = {"C": c, "dtype": name, "method": method, "seconds": times[method]}
                mem = "-"
                if args.memory and not method.startswith("gemm"):
                    extra = memory_in_subprocess(method, n, d, c, name)
                    if extra is not None:
                        row["extra_mb"] = extra / 2**20
                        mem = f"{extra / 2**20:.0f}"
                r3 = times[method] / times["gemm3"] if "gemm3" in times else float("nan")
                r4 = times[method] / times["gemm4"] if "gemm4" in times else float("nan")
                print(
                    f"| {c} | {name} | {method} | {times[method]:.3f} | {r3:.2f} | {r4:.2f} "
                    f"| {mem} |",
                    flush=True,
                )
                results.append(row)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
