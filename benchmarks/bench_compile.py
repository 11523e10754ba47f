"""``torch.compile`` and the executors: step time, compile time and peak memory (issue 16).

Variants, all on the same inputs (``x[N, D]``, ``W[C, D]``, labels; ArcFace s = 64, m = 0.5):

* ``gemm4``: the four bare GEMMs of a loss that never stores ``N×C`` (logits, the backward's
  recompute, ``∂x``, ``∂W``), eager: the floor. It holds its own ``N×C`` products.
* ``chunked_eager`` / ``chunked_compiled``: ``ArcFaceLoss(impl="chunked")``, called as is or
  through ``torch.compile(loss)`` (Inductor, default options).
* ``dense_eager`` / ``dense_compiled``: the same with ``impl="dense"``.
* ``plain_compiled``: a plain PyTorch ArcFace (``F.normalize``, ``F.linear``, the target's
  ``cos(θ + m)`` with insightface's fallback, ``scatter``, ``F.cross_entropy``; in the inputs'
  dtype) under ``torch.compile``.

Each variant runs in its own fresh interpreter (so one variant's caches, compiled code and
allocator state never reach another's numbers): build, the first step (for compiled variants
this is where compilation happens; ``compile s`` = first step - median step), a reset of the
kernel's peak-RSS mark (``benchmarks/bench_memory.py``'s method), then ``--steps`` timed steps
(gradients set to None before each, as ``optimizer.zero_grad()``). ``step s`` is their median,
``peak MB`` the whole-process ``VmHWM`` over them, ``extra MB`` that peak minus the peak of a
baseline process (another fresh interpreter) that builds the same tensors and holds the
gradients a training loop holds anyway (``W.grad``, ``x.grad``, touched) and, for compiled
variants, has compiled and run (forward and backward) a tiny function, so that the compiler's
own resident cost (Dynamo, Inductor, its runtime) is in the baseline too.
``over pre-step MB`` is the peak minus the resident set right before the timed steps (which
holds the inputs, the weight, the first step's gradients, and whatever compilation left
resident): the step's own workspace. Ratios are to ``gemm4`` of the same (C, dtype) in the
same run.

Example (the command recorded in docs/benchmarks.md; each invocation stays under 10 minutes)::

    PYTHONPATH=src python benchmarks/bench_compile.py --classes 100000 --dtypes float32 bfloat16
    PYTHONPATH=src python benchmarks/bench_compile.py --classes 1000000 --dtypes float32 \\
        --variants gemm4 chunked_eager chunked_compiled
"""

from __future__ import annotations

import argparse
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
from bench_memory import memory_report, reset_peak

VARIANTS = (
    "gemm4",
    "chunked_eager",
    "chunked_compiled",
    "dense_eager",
    "dense_compiled",
    "plain_compiled",
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SCALE, MARGIN = 64.0, 0.5
MB = 2**20


def plain_arcface(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """ArcFace as a user writes it in plain PyTorch (insightface's formulation), mean loss."""
    cosine = F.linear(F.normalize(x), F.normalize(weight)).clamp(-1.0, 1.0)  # (N, C)
    index = labels.unsqueeze(1)  # (N, 1)
    target = cosine.gather(1, index)  # (N, 1)
    sine = (1.0 - target * target).clamp_min(0.0).sqrt()
    shifted = target * math.cos(MARGIN) - sine * math.sin(MARGIN)  # cos(θ + m)
    fallback = target - MARGIN * math.sin(MARGIN)  # where θ + m > π
    shifted = torch.where(target > -math.cos(MARGIN), shifted, fallback)
    logits = cosine.scatter(1, index, shifted) * SCALE
    return F.cross_entropy(logits, labels)


def make_step(
    variant: str, n: int, d: int, c: int, dtype: torch.dtype
) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """One training step of ``variant`` (gradients set to None first) and the tensors whose
    gradients a training loop holds anyway."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=generator).to(dtype).requires_grad_(True)
    labels = torch.randint(0, c, (n,), generator=generator)
    if variant == "gemm4":
        w = (torch.randn(c, d, generator=generator) * 0.01).to(dtype)
        xd = x.detach()

        def gemms() -> None:
            logits = xd @ w.t()  # (N, C)
            logits = xd @ w.t()  # the backward's recompute
            _ = logits @ w  # ∂x
            _ = logits.t() @ xd  # ∂W

        return gemms, []
    if variant == "plain_compiled":
        weight = (torch.randn(c, d, generator=generator) * 0.01).to(dtype).requires_grad_(True)
        function = torch.compile(plain_arcface)

        def plain_step() -> None:
            weight.grad, x.grad = None, None
            function(x, weight, labels).backward()

        return plain_step, [weight, x]
    impl, mode = variant.split("_")
    head = marginface.ArcFaceLoss(c, d, MARGIN, SCALE, impl=impl, dtype=dtype)
    call = torch.compile(head) if mode == "compiled" else head

    def loss_step() -> None:
        head.weight.grad, x.grad = None, None
        call(x, labels).backward()

    return loss_step, [head.weight, x]


def probe(variant: str, kind: str, n: int, d: int, c: int, dtype: torch.dtype, steps: int) -> dict:
    """In this (fresh) process: ``kind = "step"`` times and measures the variant;
    ``"baseline"`` builds the same tensors and holds the gradients (see the module doc)."""
    step, holds = make_step(variant, n, d, c, dtype)
    if kind == "baseline":
        if variant.endswith("_compiled"):  # the compiler's fixed resident cost
            tiny = torch.ones(4, requires_grad=True)
            torch.compile(lambda a: (a * 2.0).exp().sum())(tiny).backward()
        for tensor in holds:
            tensor.grad = torch.empty_like(tensor).fill_(1.0)
        return memory_report()
    start = time.perf_counter()
    step()  # compiles, for the compiled variants
    first = time.perf_counter() - start
    valid = reset_peak()
    before = memory_report()["VmRSS"]  # holds the gradients of the first step, as a loop does
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    report = memory_report()
    return {**report, "reset": valid, "first": first, "seconds": seconds, "before": before}


def run_probe(variant: str, kind: str, argv: list[str]) -> dict | None:
    command = [sys.executable, __file__, "--probe", variant, "--probe-kind", kind, *argv]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        print(f"# {variant} {kind} failed: {result.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, nargs="+", default=[100_000])
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=list(DTYPES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant")
    parser.add_argument("--json", default=None, help="append the results to this file")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--probe-kind", default="step", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.probe is not None:
        report = probe(
            args.probe,
            args.probe_kind,
            args.batch,
            args.dim,
            args.classes[0],
            DTYPES[args.dtypes[0]],
            args.steps,
        )
        print(json.dumps(report))
        return

    n, d = args.batch, args.dim
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, N={n}, D={d}")
    print(
        "| C | dtype | variant | compile s | step s | × gemm4 | peak MB | extra MB "
        "| over pre-step MB |"
    )
    print("|" + "---|" * 9, flush=True)
    results = []
    for c in args.classes:
        for name in args.dtypes:
            floor = None
            for variant in args.variants:
                common = ["--batch", str(n), "--dim", str(d), "--classes", str(c)]
                common += ["--dtypes", name, "--steps", str(args.steps)]
                step = run_probe(variant, "step", common)
                base = run_probe(variant, "baseline", common)
                if step is None or base is None:
                    print(f"| {c} | {name} | {variant} | failed | | | | | |", flush=True)
                    continue
                median = statistics.median(step["seconds"])
                if variant == "gemm4":
                    floor = median
                compile_s = step["first"] - median if variant.endswith("compiled") else 0.0
                ratio = f"{median / floor:.2f}" if floor else "-"
                peak, extra = step["VmHWM"] / MB, (step["VmHWM"] - base["VmHWM"]) / MB
                over = (step["VmHWM"] - step["before"]) / MB
                reset = "" if step["reset"] else " (no reset)"
                print(
                    f"| {c} | {name} | {variant} | {compile_s:.1f} | {median:.2f} | {ratio} "
                    f"| {peak:.0f}{reset} | {extra:.0f} | {over:.0f} |",
                    flush=True,
                )
                results.append(
                    {
                        "C": c,
                        "dtype": name,
                        "variant": variant,
                        "compile_s": compile_s,
                        "step_s": median,
                        "seconds": step["seconds"],
                        "first_s": step["first"],
                        "peak_mb": peak,
                        "extra_mb": extra,
                        "over_pre_step_mb": over,
                        "baseline_peak_mb": base["VmHWM"] / MB,
                        "reset": step["reset"],
                    }
                )
    if args.json:
        with open(args.json, "a") as handle:
            handle.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
