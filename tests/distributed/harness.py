"""Run a test function on W gloo processes on 127.0.0.1, with a free port and timeouts.

Every collective gets the process group's timeout (a bug fails instead of hanging CI) and the
whole group has a wall-clock deadline after which every process is killed.

A rank that finished cleanly leaves with ``os._exit(0)`` after destroying the process group, as
a forked child does: a spawned child otherwise runs the interpreter's finalization, during which
gloo's C++ threads may still be torn down and abort the process (SIGABRT, "terminate called
without an active exception", seen once in a CI run under load) after every
check of the test had passed. ``faulthandler`` prints every thread's stack if a rank aborts.

No rank leaves before every rank has destroyed its group (a multiprocessing barrier, not a
collective): rank 0 hosts the TCPStore, and under load a rank 0 that exited first closed the
store, and its gloo pairs, under a rank still tearing its group down ("Connection closed by
peer"). A failing rank aborts the barrier, so the others do not wait for it.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVE_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(
    rank: int,
    world: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple,
    errors: Any,
    timeout_s: float = COLLECTIVE_TIMEOUT_S,
    finished: Any = None,
) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    faulthandler.enable()
    try:
        dist.init_process_group(
            "gloo",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        try:
            fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        if finished is not None:
            finished.abort()
        raise
    if finished is not None:
        # every rank has destroyed its group; broken: another rank failed (and reported it)
        with contextlib.suppress(threading.BrokenBarrierError):
            finished.wait(timeout_s)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_distributed(
    fn: Callable[..., Any],
    world: int,
    *args: Any,
    deadline_s: float = 120.0,
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` processes; raise with every failing rank's
    traceback, or if the group does not finish within ``deadline_s``."""
    context = mp.get_context("spawn")
    errors = context.SimpleQueue()
    finished = context.Barrier(world)
    port = free_port()
    processes = [
        context.Process(
            target=_entry,
            args=(rank, world, port, fn, args, errors, collective_timeout_s, finished),
            daemon=True,
        )
        for rank in range(world)
    ]
    for process in processes:
        process.start()
    finish = time.monotonic() + deadline_s
    for process in processes:
        process.join(max(0.0, finish - time.monotonic()))
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        process.kill()
        process.join()
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    if failures:
        text = "\n".join(f"--- rank {rank} ---\n{trace}" for rank, trace in sorted(failures))
        raise AssertionError(f"distributed test failed:\n{text}")
    if alive:
        raise AssertionError(f"distributed test did not finish within {deadline_s} s")
    codes = [p.exitcode for p in processes]
    if any(code != 0 for code in codes):
        raise AssertionError(f"distributed test processes exited with {codes}")
