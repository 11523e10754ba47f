"""Step-time cost of checkpointing a class-sharded head every k steps: none, synchronous,
asynchronous (``train --async-checkpoint``), on W gloo processes on 127.0.0.1 (issue 28).

Each rank builds ``marginface.create_loss(loss, C, D, process_group=WORLD)`` (rank ``r`` holds
``C/W`` class centers), a ``Linear(D, D)`` standing in for the backbone, SGD with momentum (so
the checkpoint holds the centers and their momentum: ``2·C·D`` floats over the group) and its
rows of a seeded global batch of ``N`` embeddings. It runs ``--steps`` optimizer steps and,
every ``--every`` steps, writes a step checkpoint into its run folder through the trainer's own
:class:`~marginface.train.state.checkpoint_writer.CheckpointWriter`
(``torch.distributed.checkpoint``:
every rank its share, a sidecar, the folder swap), the last background write finished before
the clock stops. Every step starts after a barrier; a step's time is the slowest rank's.

Reported per mode: the median step time of the steps without a checkpoint, the median of the
steps with one (the checkpoint's own time included; for ``async``: the copy, and the wait for
the previous background write), and the total; ``overhead`` = (total - total of ``none``) /
number of checkpoints: the training time one checkpoint costs. The three modes run in one
launch (same processes, same memory state), in the order none, sync, async, repeated
``--repeats`` times; medians over repeats.

Example (the command in docs/benchmarks.md)::

    PYTHONPATH=src python benchmarks/bench_checkpoint.py --classes 1000000 --dim 512 \\
        --batch 64 --steps 12 --every 4 --repeats 1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import marginface
from marginface.train.config import TrainConfig
from marginface.train.state.checkpoint_writer import CheckpointPolicy, CheckpointWriter
from marginface.train.state.run_state import RunObjects
from marginface.train.state.step_position import StepPosition

MODES = ("none", "sync", "async")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------- one rank
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
        torch.manual_seed(0)
        head = marginface.create_loss(
            args.loss, args.classes, args.dim, process_group=dist.group.WORLD
        )
        model = torch.nn.Linear(args.dim, args.dim)
        optimizer = torch.optim.SGD(
            [*model.parameters(), *head.parameters()], lr=0.01, momentum=0.9
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        objects = RunObjects(model, head, optimizer, scheduler, scaler, torch.device("cpu"))
        generator = torch.Generator().manual_seed(1)
        x_all = torch.randn(args.batch, args.dim, generator=generator)  # (N, D)
        labels_all = torch.randint(0, args.classes, (args.batch,), generator=generator)  # (N,)
        rows = torch.arange(args.batch).tensor_split(world)[rank]
        x, labels = x_all[rows].clone(), labels_all[rows].clone()  # (N/W, D), (N/W,)
        config = TrainConfig(dataset="digits", loss=args.loss, embedding_dim=args.dim)
        meta = {"world_size": world, "num_classes": args.classes}
        report: dict[str, Any] = {"rank": rank}
        for repeat in range(args.repeats):
            for mode in MODES:
                run = Path(args.root) / f"{mode}-{repeat}"
                writer = CheckpointWriter(run, CheckpointPolicy(asynchronous=mode == "async"))
                if rank == 0:
                    run.mkdir(parents=True, exist_ok=True)
                dist.barrier()
                times, marks = [], []
                began = time.perf_counter()
                for step in range(1, args.steps + 1):
                    dist.barrier()
                    start = time.perf_counter()
                    optimizer.zero_grad(set_to_none=True)
                    head(model(x), labels).backward()
                    optimizer.step()
                    checkpoint = mode != "none" and step % args.every == 0
                    if checkpoint:
                        writer.write(
                            objects,
                            epoch=0,
                            position=StepPosition(0, step),
                            distributed=True,
                            config=config,
                            meta=meta,
                            history=[],
                        )
                    times.append(time.perf_counter() - start)
                    marks.append(checkpoint)
                writer.finish()
                dist.barrier()
                total = time.perf_counter() - began
                report.setdefault(mode, []).append({"times": times, "marks": marks, "total": total})
                if rank == 0:
                    shutil.rmtree(run, ignore_errors=True)
        return report
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- the launcher
def launch(args: argparse.Namespace) -> list[dict[str, Any]]:
    port = free_port()
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.world)
    root = tempfile.mkdtemp(prefix="bench-checkpoint-", dir=args.dir)
    common = [sys.executable, __file__, "--worker", "--world", str(args.world)]
    common += ["--port", str(port), "--threads", str(threads), "--loss", args.loss]
    common += ["--classes", str(args.classes), "--dim", str(args.dim), "--batch", str(args.batch)]
    common += ["--steps", str(args.steps), "--every", str(args.every), "--root", root]
    common += ["--repeats", str(args.repeats)]
    common += ["--collective-timeout", str(args.collective_timeout)]
    try:
        processes = [
            subprocess.Popen(
                [*common, "--rank", str(rank)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(args.world)
        ]
        reports, failures = [], []
        deadline = time.monotonic() + args.deadline
        for rank, process in enumerate(processes):
            try:
                out, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for other in processes:
                    other.kill()
                raise RuntimeError(f"no result within {args.deadline} s") from None
            if process.returncode != 0:
                failures.append(f"--- rank {rank} (exit {process.returncode}) ---\n{err}")
            else:
                reports.append(json.loads(out.strip().splitlines()[-1]))
        if failures:
            raise RuntimeError("failed:\n" + "\n".join(failures))
        return reports
    finally:
        shutil.rmtree(root, ignore_errors=True)


def summarize(reports: list[dict[str, Any]], mode: str) -> dict[str, float]:
    plain, with_checkpoint, totals = [], [], []
    for repeat in range(len(reports[0][mode])):
        runs = [r[mode][repeat] for r in reports]
        for step, marks in enumerate(zip(*(run["marks"] for run in runs), strict=True)):
            slowest = max(run["times"][step] for run in runs)
            (with_checkpoint if marks[0] else plain).append(slowest)
        totals.append(max(run["total"] for run in runs))
    return {
        "step_s": statistics.median(plain),
        "checkpoint_step_s": statistics.median(with_checkpoint) if with_checkpoint else 0.0,
        "total_s": statistics.median(totals),
        "checkpoints": len(with_checkpoint) // len(totals),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=2, help="gloo processes (default 2)")
    parser.add_argument("--loss", default="arcface")
    parser.add_argument("--classes", type=int, default=1_000_000, help="C (default 1M)")
    parser.add_argument("--dim", type=int, default=512, help="D (default 512)")
    parser.add_argument("--batch", type=int, default=64, help="global batch N (default 64)")
    parser.add_argument("--steps", type=int, default=12, help="steps per mode (default 12)")
    parser.add_argument("--every", type=int, default=4, help="checkpoint every k steps")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="per process (cores // W)")
    parser.add_argument("--dir", default=None, help="where the run folders go (a temp dir)")
    parser.add_argument("--deadline", type=float, default=1800.0, help="seconds for the launch")
    parser.add_argument("--collective-timeout", type=float, default=600.0)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    reports = launch(args)
    base = summarize(reports, "none")
    print(
        f"C = {args.classes}, D = {args.dim}, N = {args.batch}, W = {args.world}, "
        f"checkpoint every {args.every} of {args.steps} steps, torch {torch.__version__}"
    )
    print("| mode | step (s) | step with checkpoint (s) | total (s) | per checkpoint (s) |")
    print("|---|---|---|---|---|")
    for mode in MODES:
        row = summarize(reports, mode)
        overhead = (
            (row["total_s"] - base["total_s"]) / row["checkpoints"] if row["checkpoints"] else 0.0
        )
        print(
            f"| {mode} | {row['step_s']:.3f} | {row['checkpoint_step_s']:.3f} | "
            f"{row['total_s']:.2f} | {overhead:.3f} |"
        )


if __name__ == "__main__":
    main()
