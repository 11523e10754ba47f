"""Extra memory of one training step of a head, as a training loop sees it (issue 9).

The method, per configuration (loss, N, D, C, dtype, executor):

* **step process** (a fresh interpreter per measurement): builds the head, the embeddings
  ``x[N, D]`` and the labels, runs one warm-up step, sets the gradients to None (as
  ``optimizer.zero_grad()`` does), resets the kernel's peak-RSS mark (``echo 5 >
  /proc/self/clear_refs``; only if the kernel honours it, see below), runs one more step
  (gradients set to None first) and reads the whole-process peak resident set ``VmHWM`` from
  ``/proc/self/status``. Nothing is subtracted inside this process: whatever the warm-up step
  left behind (allocator caches, thread pools, library buffers, code pages) is part of the peak,
  as it is in a training loop's second step.
* **baseline process** (another fresh interpreter): the same imports and the same tensors built
  the same way, plus ``W.grad`` and ``x.grad`` allocated and touched (filled), and nothing run.
  Its ``VmHWM`` is reported too.
* **extra** = step peak - baseline peak: the memory the step needs beyond what a training loop
  holds anyway (inputs, weight, the weight's and the inputs' gradients).

The peak-RSS reset is *valid* only if, right after writing ``5`` to ``/proc/self/clear_refs``,
``VmHWM`` equals ``VmRSS`` (some kernels and sandboxes accept the write and do nothing). The
step process checks that; if the reset is not valid it skips the warm-up and reports the peak
over setup plus one step instead (``reset = no`` in the output), which can only be higher.

Medians over ``--repeats`` pairs of processes. Example (the commands in docs/benchmarks.md)::

    PYTHONPATH=src python benchmarks/bench_memory.py --classes 100000 --repeats 5
    PYTHONPATH=src python benchmarks/bench_memory.py --classes 100000 --impls dense chunked \\
        --dtypes float32 bfloat16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch

import marginface

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
IMPLS = ("chunked", "dense")
MB = 2**20


# ---------------------------------------------------------------- /proc/self/status
def status_bytes(field: str) -> int:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``, ``RssAnon``...) in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> bool:
    """Reset ``VmHWM`` to the current ``VmRSS`` (``echo 5 > /proc/self/clear_refs``).

    Returns whether the reset is valid: the write succeeded and ``VmHWM`` is now within one
    page (plus what the interpreter may touch in between, 256 kB) of ``VmRSS``.
    """
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        return False
    return status_bytes("VmHWM") - status_bytes("VmRSS") <= 256 * 1024


def memory_report() -> dict[str, int]:
    """This process's peak and current resident set, and the current anon/file split."""
    return {key: status_bytes(key) for key in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}


# ---------------------------------------------------------------- what is measured
def build(
    loss: str, n: int, d: int, c: int, dtype: torch.dtype, impl: str, chunk: int | None
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The head (weight ``N(0, 0.01²)`` drawn in place), ``x[N, D]`` and labels, seeded."""
    generator = torch.Generator().manual_seed(0)
    head = marginface.create_loss(loss, c, d, impl=impl, chunk_size=chunk, dtype=dtype)
    x = torch.randn(n, d, generator=generator).to(dtype).requires_grad_(True)
    labels = torch.randint(0, c, (n,), generator=generator)
    return head, x, labels


def training_step(head: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor) -> None:
    """Gradients set to None (``optimizer.zero_grad()``), then forward + backward."""
    head.zero_grad(set_to_none=True)
    x.grad = None
    head(x, labels).backward()


def hold_gradients(head: torch.nn.Module, x: torch.Tensor) -> None:
    """What the baseline holds besides the inputs and the weight: ``W.grad`` and ``x.grad``,
    allocated and every page written."""
    for tensor in (head.weight, x):
        tensor.grad = torch.empty_like(tensor).fill_(1.0)


def measure_step(step: Callable[[], None], reset: bool = True) -> dict[str, Any]:
    """Whole-process peak over ``step()``: warm-up, reset of ``VmHWM``, step (see module doc).

    ``step`` must set the gradients to None itself. Without a valid reset (or with
    ``reset=False``) there is no warm-up: the peak covers setup and one step.
    """
    valid = reset and reset_peak()  # does this kernel honour the reset at all?
    if valid:
        step()  # warm-up: what it leaves behind stays, as in a training loop
        valid = reset_peak()
    step()
    return {**memory_report(), "reset": valid}


def probe(args: argparse.Namespace) -> dict[str, Any]:
    dtype = DTYPES[args.dtypes[0]]
    head, x, labels = build(
        args.loss, args.batch, args.dim, args.classes[0], dtype, args.impls[0], args.chunk_size
    )
    if args.probe == "baseline":
        hold_gradients(head, x)
        return {**memory_report(), "reset": False}
    return measure_step(lambda: training_step(head, x, labels), reset=not args.no_reset)


def run_probe(kind: str, argv: list[str]) -> dict[str, Any]:
    """One fresh interpreter running ``--probe kind``; its JSON report."""
    command = [sys.executable, __file__, "--probe", kind, *argv]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"probe {kind} failed ({' '.join(command)}):\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(
    loss: str,
    n: int,
    d: int,
    c: int,
    dtype_name: str,
    impl: str,
    chunk: int | None,
    repeats: int,
    no_reset: bool = False,
) -> dict[str, Any]:
    """Medians over ``repeats`` (step process, baseline process) pairs, in MB."""
    argv = ["--loss", loss, "--batch", str(n), "--dim", str(d), "--classes", str(c)]
    argv += ["--dtypes", dtype_name, "--impls", impl]
    if chunk is not None:
        argv += ["--chunk-size", str(chunk)]
    if no_reset:
        argv.append("--no-reset")
    steps, bases = [], []
    for _ in range(repeats):  # interleaved, so a drift hits both alike
        steps.append(run_probe("step", argv))
        bases.append(run_probe("baseline", argv))
    extras = [s["VmHWM"] - b["VmHWM"] for s, b in zip(steps, bases, strict=True)]
    return {
        "loss": loss,
        "N": n,
        "D": d,
        "C": c,
        "dtype": dtype_name,
        "impl": impl,
        "chunk": chunk,
        "repeats": repeats,
        "reset": all(s["reset"] for s in steps),
        "step_peak_mb": statistics.median(s["VmHWM"] for s in steps) / MB,
        "baseline_peak_mb": statistics.median(b["VmHWM"] for b in bases) / MB,
        "baseline_rss_mb": statistics.median(b["VmRSS"] for b in bases) / MB,
        "extra_mb": statistics.median(extras) / MB,
        "extra_range_mb": (min(extras) / MB, max(extras) / MB),
        "anon_after_step_minus_baseline_mb": statistics.median(
            s["RssAnon"] - b["RssAnon"] for s, b in zip(steps, bases, strict=True)
        )
        / MB,
        "file_after_step_minus_baseline_mb": statistics.median(
            s["RssFile"] - b["RssFile"] for s, b in zip(steps, bases, strict=True)
        )
        / MB,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loss", default="arcface")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, nargs="+", default=[100_000])
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=list(DTYPES))
    parser.add_argument("--impls", nargs="+", default=["chunked"], choices=IMPLS)
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-reset", action="store_true", help="no warm-up, no VmHWM reset")
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument("--probe", choices=("step", "baseline"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.probe is not None:
        print(json.dumps(probe(args)))
        return

    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, loss {args.loss}")
    print("| C | dtype | impl | chunk | reset | step peak MB | baseline peak MB | extra MB |")
    print("|" + "---|" * 8)
    results = []
    for c in args.classes:
        for name in args.dtypes:
            for impl in args.impls:
                row = measure(
                    args.loss,
                    args.batch,
                    args.dim,
                    c,
                    name,
                    impl,
                    args.chunk_size,
                    args.repeats,
                    args.no_reset,
                )
                low, high = row["extra_range_mb"]
                print(
                    f"| {c} | {name} | {impl} | {args.chunk_size or 'default'} "
                    f"| {'yes' if row['reset'] else 'no'} | {row['step_peak_mb']:.0f} "
                    f"| {row['baseline_peak_mb']:.0f} | **{row['extra_mb']:.0f}** "
                    f"({low:.0f}-{high:.0f}) |",
                    flush=True,
                )
                results.append(row)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
