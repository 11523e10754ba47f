"""Forward + backward time and peak memory of margin cross-entropy implementations (issue 4).

Methods, all on the same inputs (N×D embeddings, C×D class centers, ArcFace s = 64, m = 0.5):

* ``gemm3`` / ``gemm4``: the bare GEMMs the loss needs (logits, ∂x, ∂W; plus the backward's
  recompute of the logits) -- the floors.
* ``dense``: marginface ``ArcFaceLoss(impl="dense")``.
* ``fused``: marginface ``ArcFaceLoss(impl="chunked")``.
* ``fused_ref``: the same from another copy of marginface, importable as
  ``--reference-package`` (e.g. an older commit's ``src/marginface`` copied to
  ``/tmp/ref/mf_ref`` and ``PYTHONPATH=src:/tmp/ref``): a before/after comparison whose rounds
  interleave both versions, so a loaded machine slows both alike.
* ``pml``: pytorch-metric-learning's ``ArcFaceLoss`` (if installed).
* ``torch_lce``: ``F.linear_cross_entropy`` on normalized inputs (no margin), chunked options.

Times are medians over ``--repeats`` rounds; within a round the methods run one after another
(interleaved), so a slow spell of a shared machine hits all of them alike. Ratios are to the
floors measured in the same run. Peak memory (``--memory``) is measured as
``benchmarks/bench_memory.py`` does: the whole-process peak resident set of a fresh process over
one step (after a warm-up step, gradients set to None first) minus the peak of another fresh
process holding only the same inputs, weight and gradients (touched); for the bare GEMMs that
baseline holds the inputs only, so their extra includes their ``N×C`` products.

Example (the command recorded in docs/benchmarks_fused.md)::

    PYTHONPATH=src python benchmarks/bench_fused.py --classes 10000 100000 --repeats 5 --memory
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import marginface
from bench_memory import measure_step, memory_report

METHODS = ("gemm3", "gemm4", "dense", "fused", "fused_ref", "pml", "torch_lce")
REFERENCE_PACKAGE = "mf_ref"  # --reference-package
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SCALE, MARGIN = 64.0, 0.5


def _has_pml() -> bool:
    try:
        import pytorch_metric_learning  # noqa: F401
    except ImportError:
        return False
    return True


class Step:
    """One forward + backward of a method (gradients set to None first), and the tensors whose
    gradients a training loop holds anyway (the memory baseline allocates those)."""

    def __init__(self, run: Callable[[], None], holds: list[torch.Tensor]) -> None:
        self.run = run
        self.holds = holds

    def __call__(self) -> None:
        self.run()

    def hold_gradients(self) -> None:
        """Allocate and write every page of the gradients of :attr:`holds`."""
        for tensor in self.holds:
            tensor.grad = torch.empty_like(tensor).fill_(1.0)


def make_step(
    method: str, n: int, d: int, c: int, dtype: torch.dtype, chunk_size: int | None
) -> Step:
    """One forward + backward of ``method`` on seeded inputs (gradients reset each call)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=generator).to(dtype).requires_grad_(True)
    labels = torch.randint(0, c, (n,), generator=generator)

    if method in ("gemm3", "gemm4"):
        w = (torch.randn(c, d, generator=generator) * 0.01).to(dtype)
        xd = x.detach()

        def gemms() -> None:
            logits = xd @ w.t()  # (N, C)
            if method == "gemm4":
                logits = xd @ w.t()  # the backward's recompute
            _ = logits @ w  # ∂x
            _ = logits.t() @ xd  # ∂W

        return Step(gemms, [])

    if method in ("dense", "fused", "fused_ref"):
        impl = "dense" if method == "dense" else "chunked"
        package = (
            importlib.import_module(REFERENCE_PACKAGE) if method == "fused_ref" else marginface
        )
        head = package.ArcFaceLoss(
            c, d, MARGIN, SCALE, impl=impl, chunk_size=chunk_size, dtype=dtype
        )

        def loss_step() -> None:
            head.weight.grad, x.grad = None, None
            head(x, labels).backward()

        return Step(loss_step, [head.weight, x])

    if method == "pml":
        from pytorch_metric_learning.losses import ArcFaceLoss

        pml = ArcFaceLoss(c, d, margin=math.degrees(MARGIN), scale=SCALE).to(dtype)

        def pml_step() -> None:
            pml.W.grad, x.grad = None, None
            pml(x, labels).backward()

        return Step(pml_step, [pml.W, x])

    if method == "torch_lce":
        weight = (torch.randn(c, d, generator=generator) * 0.01).to(dtype).requires_grad_(True)
        options = torch.nn.LinearCrossEntropyOptions()

        def lce_step() -> None:
            weight.grad, x.grad = None, None
            x_hat = F.normalize(x, dim=1) * SCALE
            w_hat = F.normalize(weight, dim=1)
            F.linear_cross_entropy(x_hat, w_hat, labels, options=options).backward()

        return Step(lce_step, [weight, x])

    raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")


def time_methods(
    methods: list[str],
    n: int,
    d: int,
    c: int,
    dtype: torch.dtype,
    repeats: int,
    chunk: int | None,
    samples: dict[str, list[float]] | None = None,
) -> dict[str, float]:
    """Median seconds per forward + backward, methods interleaved round by round (each round's
    seconds appended to ``samples[method]`` if given)."""
    steps = {m: make_step(m, n, d, c, dtype, chunk) for m in methods}
    for step in steps.values():  # warm-up
        step()
    samples = {m: [] for m in methods} if samples is None else samples
    for method in methods:
        samples.setdefault(method, [])
    for _ in range(repeats):
        for method, step in steps.items():
            start = time.perf_counter()
            step()
            samples[method].append(time.perf_counter() - start)
    return {m: statistics.median(v) for m, v in samples.items()}


def probe_memory(
    kind: str, method: str, n: int, d: int, c: int, dtype: torch.dtype, chunk: int | None
) -> dict:
    """``kind = "step"``: the whole-process peak over a step after a warm-up
    (:func:`bench_memory.measure_step`); ``"baseline"``: the same setup holding the gradients."""
    step = make_step(method, n, d, c, dtype, chunk)
    if kind == "baseline":
        step.hold_gradients()
        return memory_report()
    return measure_step(step)


def memory_in_subprocess(
    method: str, n: int, d: int, c: int, dtype_name: str, chunk: int | None
) -> int | None:
    """Extra peak bytes: step process minus baseline process, each a fresh interpreter."""
    peaks = []
    for kind in ("step", "baseline"):
        command = [sys.executable, __file__, "--probe", method, "--probe-kind", kind]
        command += ["--batch", str(n), "--dim", str(d), "--classes", str(c)]
        command += ["--dtypes", dtype_name, "--reference-package", REFERENCE_PACKAGE]
        if chunk is not None:
            command += ["--chunk-size", str(chunk)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            return None
        peaks.append(json.loads(result.stdout.strip().splitlines()[-1])["VmHWM"])
    return peaks[0] - peaks[1]


def main(argv: list[str] | None = None) -> None:
    global REFERENCE_PACKAGE
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--memory", action="store_true", help="also measure peak memory")
    parser.add_argument("--sweep-chunks", type=int, nargs="*", default=None, metavar="CHUNK")
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument(
        "--reference-package", default=REFERENCE_PACKAGE, help="module that fused_ref imports"
    )
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--probe-kind", default="step", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    REFERENCE_PACKAGE = args.reference_package

    if args.probe is not None:
        dtype = DTYPES[args.dtypes[0]]
        report = probe_memory(
            args.probe_kind,
            args.probe,
            args.batch,
            args.dim,
            args.classes[0],
            dtype,
            args.chunk_size,
        )
        print(json.dumps(report))
        return

    methods = [m for m in args.methods if m != "pml" or _has_pml()]
    if "fused_ref" in methods and importlib.util.find_spec(REFERENCE_PACKAGE) is None:
        methods.remove("fused_ref")
    n, d = args.batch, args.dim
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, N={n}, D={d}")
    results = []
    if args.sweep_chunks is not None:
        for c in args.classes:
            for name in args.dtypes:
                for chunk in args.sweep_chunks:
                    t = time_methods(["gemm4", "fused"], n, d, c, DTYPES[name], args.repeats, chunk)
                    ratio = t["fused"] / t["gemm4"]
                    print(
                        f"C={c} {name} chunk={chunk}: fused {t['fused']:.3f} s = {ratio:.2f}x gemm4"
                    )
                    results.append({"C": c, "dtype": name, "chunk": chunk, **t})
    else:
        header = "| C | dtype | method | median s | / gemm3 | / gemm4 | extra peak MB |"
        print(header)
        print("|" + "---|" * 7)
        for c in args.classes:
            for name in args.dtypes:
                dtype = DTYPES[name]
                rounds: dict[str, list[float]] = {}
                times = time_methods(methods, n, d, c, dtype, args.repeats, args.chunk_size, rounds)
                for method in methods:
                    row = {"C": c, "dtype": name, "method": method, "seconds": times[method]}
                    mem = "-"
                    if args.memory:
                        extra = memory_in_subprocess(method, n, d, c, name, args.chunk_size)
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
                if "fused" in rounds and "fused_ref" in rounds:
                    paired = [
                        a / b for a, b in zip(rounds["fused"], rounds["fused_ref"], strict=True)
                    ]
                    ratio = statistics.median(paired)
                    print(
                        f"C={c} {name}: fused / fused_ref, median of per-round ratios: {ratio:.3f}"
                    )
                    results.append({"C": c, "dtype": name, "fused_over_ref": ratio})
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
