"""The small parts of step checkpoints: kept checkpoints, links, the signal flag, the policy's
refusals and the epoch's continuation (issue 28)."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from marginface.config import TrainConfig
from marginface.train.kept_checkpoints import KEPT_NAME, kept_checkpoints, link_as, prune_kept
from marginface.train.preemption import StopSignals, agree
from marginface.train.run_state import RunObjects, save_run_state
from marginface.train.step_position import StepPosition, continue_epoch


def test_kept_checkpoints_newest_first_and_pruned(tmp_path):
    kept = tmp_path / KEPT_NAME
    kept.mkdir()
    for name in ("epoch-0001-step-0000000.pt", "epoch-0000-step-0000004.pt",
                 ".epoch-0003-step-0000000.pt.123.tmp", "notes.txt"):  # fmt: skip
        (kept / name).write_bytes(b"x")
    (kept / "epoch-0002-step-0000003").mkdir()  # a sharded one
    assert [p.name for p in kept_checkpoints(tmp_path)] == [
        "epoch-0002-step-0000003", "epoch-0001-step-0000000.pt", "epoch-0000-step-0000004.pt"
    ]  # fmt: skip
    prune_kept(tmp_path, 1)
    assert [p.name for p in kept_checkpoints(tmp_path)] == ["epoch-0002-step-0000003"]
    assert (kept / "notes.txt").exists()  # never anything else
    assert kept_checkpoints(tmp_path / "nowhere") == []


def test_link_as_replaces_atomically_and_copies_without_hard_links(tmp_path, monkeypatch):
    source, target = tmp_path / "a.pt", tmp_path / "checkpoint.pt"
    source.write_bytes(b"new")
    target.write_bytes(b"old")
    link_as(source, target)
    assert target.read_bytes() == b"new" and target.samefile(source)

    def no_links(*args):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    other = tmp_path / "b.pt"
    other.write_bytes(b"copied")
    link_as(other, target)
    assert target.read_bytes() == b"copied" and not target.samefile(other)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "b.pt", "checkpoint.pt"]


def test_stop_signals_set_a_flag_and_restore_the_handlers():
    before = signal.getsignal(signal.SIGUSR1)
    with StopSignals() as signals:
        assert signals.installed and signals.received is None
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: the first is the one reported
        assert signals.received == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) is before


def test_stop_signals_outside_the_main_thread_do_nothing():
    seen = []

    def enter() -> None:
        with StopSignals() as signals:
            seen.append(signals.installed)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join(10)
    assert seen == [False]


def test_agree_without_a_process_group_is_the_flags():
    assert agree([True, False], distributed=False) == [True, False]


def test_continue_epoch():
    generator = torch.Generator().manual_seed(5)
    assert continue_epoch(None, generator) == (0, 0.0, 0, 0.0)
    saved = torch.Generator().manual_seed(7)
    position = StepPosition(1, 3, 2.5, 60, 1.25, saved.get_state())
    assert continue_epoch(position, generator) == (3, 2.5, 60, 1.25)
    assert torch.equal(generator.get_state(), saved.get_state())


def test_save_run_state_refuses_a_bad_keep_and_a_foreign_position(tmp_path):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    objects = RunObjects(
        model,
        torch.nn.Linear(2, 2),
        optimizer,
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        torch.amp.GradScaler("cpu", enabled=False),
        torch.device("cpu"),
    )
    run = {"config": TrainConfig(dataset="digits"), "meta": {}, "history": []}
    with pytest.raises(ValueError, match="keep must be an integer >= 1, got 0"):
        save_run_state(tmp_path, objects, epoch=0, keep=0, **run)
    with pytest.raises(ValueError, match="position.epoch 2 is not epoch 1"):
        save_run_state(tmp_path, objects, epoch=1, position=StepPosition(2, 1), **run)
