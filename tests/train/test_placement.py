"""Where a training process runs (train/distributed.py's :func:`join_process_group`): one
process, or torchrun's rank on its own GPU."""

from __future__ import annotations

import torch

from marginface.train import distributed
from marginface.train.distributed import Placement, join_process_group


def test_without_torchrun_one_process_on_the_device_asked(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    placement = join_process_group(torch.device("cpu"), 30.0)
    assert placement == Placement(torch.device("cpu"), False, 0, 1)
    assert (placement.distributed, placement.rank, placement.world) == (False, 0, 1)


def _fake_group(monkeypatch, calls: list) -> None:
    def init(device_type: str, timeout_s: float) -> bool:
        calls.append((device_type, timeout_s))
        return True

    monkeypatch.setattr(distributed, "init_from_environment", init)
    monkeypatch.setattr(distributed, "torchrun_environment", lambda: (2, 4, 3))
    monkeypatch.setattr(distributed.dist, "get_rank", lambda *args, **kwargs: 2)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda *args, **kwargs: 4)


def test_under_torchrun_the_rank_the_world_and_the_ranks_own_gpu(monkeypatch):
    calls: list = []
    _fake_group(monkeypatch, calls)
    placement = join_process_group(torch.device("cuda"), 12.5)
    assert placement == Placement(torch.device("cuda", 3), True, 2, 4)  # LOCAL_RANK 3
    assert calls == [("cuda", 12.5)]


def test_under_torchrun_on_cpu_the_device_stays(monkeypatch):
    calls: list = []
    _fake_group(monkeypatch, calls)
    assert join_process_group(torch.device("cpu"), 5.0) == Placement(
        torch.device("cpu"), True, 2, 4
    )
    assert calls == [("cpu", 5.0)]
