"""Step time and extra memory of the executors, row-block tiling included (issue 24).

Methods, on the same inputs (ArcFace s = 64, m = 0.5, ``reduction="mean"``, D = 512):

* ``gemm3`` / ``gemm4``: the bare GEMMs a step needs (logits, ∂x, ∂W; plus the backward's
  recompute of the logits): the floors (``benchmarks/bench_fused.py``'s).
* ``dense``: ``ArcFaceLoss(impl="dense")`` (materializes ``N×C``).
* ``chunked``: ``ArcFaceLoss(impl="chunked")``: classes tiled, 4 GEMMs, 16 MiB workspace.
* ``row_block:B``: ``ArcFaceLoss(impl="row_block", row_block=B)`` (``row_block:all``: one
  block of all ``N`` rows): rows tiled in blocks of ``B`` too, forward and backward in one
  pass per block (3 GEMMs, a ``B×C`` store of products); ``row_block`` alone: the default
  block (``MarginSoftmaxLoss.row_block_rows``).

Time: median seconds of forward + backward over ``--repeats`` rounds after one warm-up step;
within a round the methods run one after another (interleaved), so a slow spell of the shared
machine hits all alike; ratios are to ``gemm4`` of the same run. Memory (``--memory``): the
method of ``benchmarks/bench_memory.py``: the whole-process peak resident set of a fresh
process over one step (after a warm-up step whose peak is reset; gradients set to None first)
minus the peak of another fresh process holding the same inputs, weight and gradients
(touched). For the bare GEMMs the baseline holds the inputs only, so their extra includes
their own ``N×C`` products. A method whose step would not fit ``--max-gb`` of estimated
memory is skipped (``-``).

Example (the commands in docs/benchmarks.md, "Row blocks")::

    PYTHONPATH=src python benchmarks/bench_row_block.py --batch 512 2048 --classes 100000 \\
        --methods gemm4 dense chunked row_block:64 row_block:512 --repeats 3 --memory
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
from bench_memory import measure_step, memory_report

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SCALE, MARGIN = 64.0, 0.5
BASE_METHODS = ("gemm3", "gemm4", "dense", "chunked", "row_block")


def check_method(method: str) -> str:
    """``method`` if it is one of :data:`BASE_METHODS` or ``row_block:B`` with ``B >= 1``."""
    name, _, rows = method.partition(":")
    valid_rows = rows.isdigit() or rows == "all"
    if name not in BASE_METHODS or (rows and (name != "row_block" or not valid_rows)):
        raise argparse.ArgumentTypeError(
            f"method must be one of {BASE_METHODS} or row_block:B, got {method!r}"
        )
    if rows == "all":
        return method
    if rows and int(rows) < 1:
        raise argparse.ArgumentTypeError(f"row_block:B needs B >= 1, got {method!r}")
    return method


def estimated_bytes(method: str, n: int, c: int, d: int, dtype: torch.dtype) -> int:
    """A rough peak of a step: weight and gradient, plus the method's ``N×C``-sized part."""
    size = dtype.itemsize
    weight = 2 * c * d * size
    if method in ("gemm3", "gemm4"):
        return weight // 2 + 2 * n * c * size
    if method == "dense":
        return weight + 4 * n * c * 4
    if method == "row_block:all":
        return weight + n * c * size
    if method.startswith("row_block:"):
        return weight + int(method.split(":")[1]) * c * size
    if method == "row_block":
        return weight + min(n * c * size, marginface.head.DEFAULT_ROW_BLOCK_BYTES)
    return weight + (1 << 24)


def make_step(
    method: str, x: torch.Tensor, labels: torch.Tensor, weight: torch.nn.Parameter
) -> Step:
    """One forward + backward of ``method`` (gradients set to None first) on ``x[N, D]`` and
    the shared class centers ``weight[C, D]``."""
    c, d = weight.shape
    if method in ("gemm3", "gemm4"):
        xd, w = x.detach(), weight.detach()

        def gemms() -> None:
            logits = xd @ w.t()  # (N, C)
            if method == "gemm4":
                logits = xd @ w.t()  # the backward's recompute
            _ = logits @ w  # ∂x
            _ = logits.t() @ xd  # ∂W

        return Step(gemms, [])
    name, _, rows = method.partition(":")
    block = x.shape[0] if rows == "all" else int(rows) if rows else None
    head = marginface.ArcFaceLoss(c, d, MARGIN, SCALE, impl=name, row_block=block, device="meta")
    head.weight = weight  # every method computes with the same centers

    def loss_step() -> None:
        weight.grad, x.grad = None, None
        head(x, labels).backward()

    return Step(loss_step, [weight, x])


def inputs(
    n: int, d: int, c: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.nn.Parameter]:
    """Seeded ``x[N, D]`` (requires grad), labels ``[N]`` and centers ``N(0, 0.01²)``."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=generator).to(dtype).requires_grad_(True)
    labels = torch.randint(0, c, (n,), generator=generator)
    weight = torch.empty(c, d, dtype=dtype)
    weight.normal_(std=0.01, generator=generator)
    return x, labels, torch.nn.Parameter(weight)


def time_methods(
    methods: list[str], n: int, d: int, c: int, dtype: torch.dtype, repeats: int
) -> dict[str, float]:
    """Median seconds per forward + backward, methods interleaved round by round (one warm-up
    step each first); NaN for ``repeats = 0`` (nothing timed: ``--memory`` alone)."""
    if repeats == 0:
        return {m: float("nan") for m in methods}
    x, labels, weight = inputs(n, d, c, dtype)
    steps = {m: make_step(m, x, labels, weight) for m in methods}
    for step in steps.values():
        step()
    samples: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(repeats):
        for method, step in steps.items():
            start = time.perf_counter()
            step()
            samples[method].append(time.perf_counter() - start)
    return {m: statistics.median(v) for m, v in samples.items()}


def probe_memory(kind: str, method: str, n: int, d: int, c: int, dtype: torch.dtype) -> dict:
    """``kind = "step"``: the whole-process peak over a step after a warm-up;
    ``"baseline"``: the same setup holding the gradients."""
    step = make_step(method, *inputs(n, d, c, dtype))
    if kind == "baseline":
        step.hold_gradients()
        return memory_report()
    return measure_step(step)


def extra_memory(method: str, n: int, d: int, c: int, dtype_name: str, pairs: int) -> float | None:
    """Median over ``pairs`` of (step process peak - baseline process peak), in MB."""
    extras = []
    for _ in range(pairs):
        peaks = []
        for kind in ("step", "baseline"):
            command = [sys.executable, __file__, "--probe", method, "--probe-kind", kind]
            command += ["--batch", str(n), "--dim", str(d), "--classes", str(c)]
            command += ["--dtypes", dtype_name]
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                print(result.stderr[-2000:], file=sys.stderr)
                return None
            peaks.append(json.loads(result.stdout.strip().splitlines()[-1])["VmHWM"])
        extras.append(peaks[0] - peaks[1])
    return statistics.median(extras) / 2**20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[512])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, nargs="+", default=[100_000])
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=list(DTYPES))
    parser.add_argument(
        "--methods",
        nargs="+",
        type=check_method,
        default=["gemm3", "gemm4", "dense", "chunked", "row_block"],
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="also measure extra memory")
    parser.add_argument("--memory-pairs", type=int, default=1)
    parser.add_argument("--max-gb", type=float, default=12.0, help="skip bigger steps")
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--probe-kind", default="step", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if args.probe is not None:
        dtype = DTYPES[args.dtypes[0]]
        report = probe_memory(
            args.probe_kind, args.probe, args.batch[0], args.dim, args.classes[0], dtype
        )
        print(json.dumps(report))
        return

    d = args.dim
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, D={d}", flush=True)
    print("| N | C | dtype | method | median s | / gemm4 | extra MB |")
    print("|" + "---|" * 7, flush=True)
    results = []
    for c in args.classes:
        for n in args.batch:
            for name in args.dtypes:
                dtype = DTYPES[name]
                limit = args.max_gb * 2**30
                methods = [m for m in args.methods if estimated_bytes(m, n, c, d, dtype) <= limit]
                start = time.time()
                times = time_methods(methods, n, d, c, dtype, args.repeats)
                for method in args.methods:
                    if method not in times:
                        print(f"| {n} | {c} | {name} | {method} | - | - | - |", flush=True)
                        continue
                    row = {"N": n, "C": c, "dtype": name, "method": method}
                    row["seconds"] = times[method]
                    mem = "-"
                    if args.memory:
                        extra = extra_memory(method, n, d, c, name, args.memory_pairs)
                        if extra is not None:
                            row["extra_mb"] = extra
                            mem = f"{extra:.0f}"
                    ratio = times[method] / times["gemm4"] if "gemm4" in times else float("nan")
                    print(
                        f"| {n} | {c} | {name} | {method} | {times[method]:.3f} | {ratio:.2f} "
                        f"| {mem} |",
                        flush=True,
                    )
                    results.append(row)
                print(f"# N={n} C={c} {name}: {time.time() - start:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
