"""The process group's lifetime: a group that marginface created from torchrun's environment
is destroyed by :func:`leave_process_group` (the command line calls it when a command ends); a
group the caller created is the caller's and stays."""

from __future__ import annotations

import os

import torch.distributed as dist
import torch.multiprocessing as mp

from marginface.train.distributed import init_from_environment, leave_process_group

from .harness import free_port, run_distributed


def _from_environment(rank: int, world: int, port: int, results, everyone) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    try:
        created = init_from_environment("cpu", 30.0)
        initialized = dist.is_initialized()
        # Every rank has its group before any rank destroys its own: otherwise a rank still
        # connecting its gloo pairs sees its peer close them ("Connection closed by peer").
        # A multiprocessing barrier, not a collective: the group's lifetime is what is tested.
        everyone.wait(60)
        left = leave_process_group()
        after = (dist.is_initialized(), leave_process_group())
        results.put((rank, created, initialized, left, *after))
        # rank 0 hosts the TCPStore: it exits only after every rank has left its group
        everyone.wait(60)
    except BaseException:
        everyone.abort()  # the other rank fails at once instead of waiting out the timeout
        raise


def test_a_group_created_from_torchrun_variables_is_destroyed_when_left() -> None:
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    everyone = context.Barrier(2)
    port = free_port()
    processes = [
        context.Process(
            target=_from_environment, args=(rank, 2, port, results, everyone), daemon=True
        )
        for rank in range(2)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        process.kill()
    assert not alive, "the ranks did not finish within 120 s"
    assert [p.exitcode for p in processes] == [0, 0]
    rows = sorted(results.get() for _ in range(2))
    # created, initialized, destroyed, no longer initialized, a second leave does nothing
    assert rows == [(0, True, True, True, False, False), (1, True, True, True, False, False)]


def _caller_owned(rank: int, world: int) -> None:
    assert leave_process_group() is False
    assert dist.is_initialized()
    dist.barrier()  # the group still works


def test_a_group_the_caller_created_is_left_alone() -> None:
    run_distributed(_caller_owned, 2, deadline_s=60)
