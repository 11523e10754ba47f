"""Per-rank memory and step time of the class-sharded head and Partial FC (issue 9).

For each world size ``W``, sample rate and weight dtype, this script launches ``W`` fresh Python
processes on 127.0.0.1 (gloo, a free port), each building
``marginface.create_loss(loss, C, D, process_group=WORLD, sample_rate=..., dtype=...)`` (rank
``r`` holds classes ``[r·⌈C/W⌉, ...)``) and its share of a seeded global batch of ``N`` rows
(``N/W`` rows per rank). Each rank:

* runs one warm-up step, resets its peak-RSS mark, runs one step and reads its whole-process
  peak ``VmHWM`` (``benchmarks/bench_memory.py``'s method: every step sets the gradients to None
  first, as ``optimizer.zero_grad()`` does), then runs more steps for the timing;
* step time: forward + backward of the head only (all-gathers and all-reduces included), each
  step started after a barrier; a step's time is the slowest rank's, and the reported time is
  the median over the steps after the warm-up.

Memory baseline: another group of ``W`` fresh processes, with the process group up, holding the
same local embeddings, the weight shard, and the gradients of both (allocated and every page
written), running nothing. Per rank:

* ``extra`` = step peak - baseline peak (what a training step needs beyond the tensors a
  training loop holds anyway);
* ``head`` = extra + the weight shard + its gradient (their bytes): the head's whole per-rank
  footprint, which is what should scale as ``1/W``.

Threads: ``torch.set_num_threads(max(1, cores // W))`` per process (``--threads`` overrides);
with more processes than cores (W = 4 on 2 cores) the machine is oversubscribed and step times
are not a scaling measurement.

Example (the commands in docs/benchmarks.md)::

    PYTHONPATH=src python benchmarks/bench_sharded.py --classes 1000000 --worlds 1 2 4 \\
        --sample-rates 1.0 0.1 --dtypes float32 bfloat16 --steps 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

import marginface
from bench_memory import DTYPES, memory_report, reset_peak

MB = 2**20


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------- one rank
def build(
    args: argparse.Namespace, rank: int, world: int
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """This rank's head and its rows of the seeded global batch (``x`` and labels)."""
    dtype = DTYPES[args.dtype]
    head = marginface.create_loss(
        args.loss,
        args.classes,
        args.dim,
        process_group=dist.group.WORLD,
        sample_rate=args.sample_rate,
        dtype=dtype,
        chunk_size=args.chunk_size,
    )
    generator = torch.Generator().manual_seed(0)
    x_global = torch.randn(args.batch, args.dim, generator=generator)  # (N, D)
    labels_global = torch.randint(0, args.classes, (args.batch,), generator=generator)  # (N,)
    rows = torch.arange(args.batch).tensor_split(world)[rank]
    x = x_global[rows].to(dtype).requires_grad_(True)  # (N/W, D), a copy
    labels = labels_global[rows].clone()
    del x_global, labels_global
    return head, x, labels


def worker(args: argparse.Namespace) -> dict[str, Any]:
    rank, world = args.rank, args.world
    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=args.collective_timeout),
    )
    try:
        head, x, labels = build(args, rank, world)
        shard_bytes = head.weight.numel() * head.weight.element_size()
        report: dict[str, Any] = {"rank": rank, "shard_mb": shard_bytes / MB}
        if args.mode == "baseline":
            for tensor in (head.weight, x):
                tensor.grad = torch.empty_like(tensor).fill_(1.0)
            dist.barrier()
            report.update(memory_report())
            return report

        def step() -> float:
            head.zero_grad(set_to_none=True)
            x.grad = None
            dist.barrier()
            start = time.perf_counter()
            head(x, labels).backward()
            return time.perf_counter() - start

        valid = reset_peak()
        times = [step()]  # warm-up
        if valid:
            head.zero_grad(set_to_none=True)
            x.grad = None
            valid = reset_peak()
        times.append(step())
        report.update(memory_report())
        report["reset"] = valid
        for _ in range(args.steps - 1):
            times.append(step())
        report["times"] = times
        return report
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- the launcher
def launch(args: argparse.Namespace, world: int, mode: str, sample_rate: float, dtype: str) -> list:
    """``world`` fresh processes in ``mode``; their reports in rank order."""
    port = free_port()
    threads = args.threads or max(1, (os.cpu_count() or 1) // world)
    common = [sys.executable, __file__, "--worker", "--mode", mode, "--world", str(world)]
    common += ["--port", str(port), "--threads", str(threads), "--loss", args.loss]
    common += ["--classes", str(args.classes[0]), "--dim", str(args.dim)]
    common += ["--batch", str(args.batch), "--sample-rate", str(sample_rate)]
    common += ["--dtype", dtype, "--steps", str(args.steps)]
    common += ["--collective-timeout", str(args.collective_timeout)]
    if args.chunk_size is not None:
        common += ["--chunk-size", str(args.chunk_size)]
    processes = [
        subprocess.Popen(
            [*common, "--rank", str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    reports, failures = [], []
    deadline = time.monotonic() + args.deadline
    for rank, process in enumerate(processes):
        try:
            out, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise RuntimeError(
                f"world {world} {mode}: no result within {args.deadline} s"
            ) from None
        if process.returncode != 0:
            failures.append(f"--- rank {rank} (exit {process.returncode}) ---\n{err}")
        else:
            reports.append(json.loads(out.strip().splitlines()[-1]))
    if failures:
        raise RuntimeError(f"world {world} {mode} failed:\n" + "\n".join(failures))
    return reports


def measure(args: argparse.Namespace, world: int, sample_rate: float, dtype: str) -> dict[str, Any]:
    """Medians over ``--repeats`` launches of (step group, baseline group)."""
    extras: list[list[float]] = []
    step_peaks: list[list[float]] = []
    base_peaks: list[list[float]] = []
    times: list[float] = []
    resets = []
    shard_mb: list[float] = []
    for _ in range(args.repeats):
        steps = launch(args, world, "step", sample_rate, dtype)
        bases = launch(args, world, "baseline", sample_rate, dtype)
        extras.append([(s["VmHWM"] - b["VmHWM"]) / MB for s, b in zip(steps, bases, strict=True)])
        step_peaks.append([s["VmHWM"] / MB for s in steps])
        base_peaks.append([b["VmHWM"] / MB for b in bases])
        resets += [s["reset"] for s in steps]
        shard_mb = [s["shard_mb"] for s in steps]
        per_step = zip(*(s["times"][1:] for s in steps), strict=True)  # after the warm-up
        times += [max(ranks) for ranks in per_step]  # the slowest rank's time per step

    def per_rank(values: list[list[float]]) -> list[float]:
        return [statistics.median(column) for column in zip(*values, strict=True)]

    extra = per_rank(extras)
    head = [e + 2 * s for e, s in zip(extra, shard_mb, strict=True)]
    return {
        "world": world,
        "sample_rate": sample_rate,
        "dtype": dtype,
        "C": args.classes[0],
        "N": args.batch,
        "D": args.dim,
        "repeats": args.repeats,
        "steps": len(times),
        "reset": all(resets),
        "shard_mb": shard_mb,
        "step_peak_mb": per_rank(step_peaks),
        "baseline_peak_mb": per_rank(base_peaks),
        "extra_mb": extra,
        "head_mb": head,
        "step_s": statistics.median(times),
        "step_s_all": times,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loss", default="arcface")
    parser.add_argument("--classes", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--batch", type=int, default=512, help="global batch N")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sample-rates", type=float, nargs="+", default=[1.0, 0.1])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=DTYPES)
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up")
    parser.add_argument("--repeats", type=int, default=1, help="launches per configuration")
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--threads", type=int, default=0, help="per process; 0: cores // W")
    parser.add_argument("--deadline", type=float, default=1800.0, help="seconds per launch")
    parser.add_argument("--collective-timeout", type=float, default=600.0)
    parser.add_argument("--json", default=None, help="append each result to this file (JSONL)")
    # worker options (internal)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("step", "baseline"), help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sample-rate", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        args.classes = args.classes[0]
        print(json.dumps(worker(args)))
        return

    cores = os.cpu_count() or 1
    print(
        f"# torch {torch.__version__}, {cores} cores, loss {args.loss}, N={args.batch}, "
        f"D={args.dim}, load average {os.getloadavg()[0]:.2f}"
    )
    print(
        "| C | W | sample rate | dtype | threads/proc | step s (median) | extra MB per rank "
        "| head MB per rank | shard MB | baseline peak MB |"
    )
    print("|" + "---|" * 10)
    for c in args.classes:
        for dtype in args.dtypes:
            for sample_rate in args.sample_rates:
                for world in args.worlds:
                    run_args = argparse.Namespace(**{**vars(args), "classes": [c]})
                    row = measure(run_args, world, sample_rate, dtype)
                    row["threads"] = args.threads or max(1, cores // world)
                    row["load_average"] = os.getloadavg()
                    over = " (oversubscribed)" if world * row["threads"] > cores else ""
                    print(
                        f"| {c} | {world} | {sample_rate} | {dtype} | {row['threads']}{over} "
                        f"| {row['step_s']:.2f} | {max(row['extra_mb']):.0f} "
                        f"| {max(row['head_mb']):.0f} | {max(row['shard_mb']):.0f} "
                        f"| {max(row['baseline_peak_mb']):.0f} |",
                        flush=True,
                    )
                    if args.json:
                        with open(args.json, "a") as handle:
                            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
