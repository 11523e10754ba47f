"""The small parts of step checkpoints: kept checkpoints, links, the signal flag, the policy's
refusals and the epoch's continuation (issue 28)."""

from __future__ import annotations

import os
import signal
import threading
from types import SimpleNamespace

import pytest
import torch

from marginface.train.config import TrainConfig
from marginface.train.state import step_position
from marginface.train.state.checkpoint_writer import CheckpointPolicy, CheckpointWriter
from marginface.train.state.kept_checkpoints import kept_checkpoints, link_as, prune_kept
from marginface.train.state.layout import KEPT_NAME
from marginface.train.state.preemption import StopSignals, TrainingPreemptedError, agree
from marginface.train.state.run_state import RunObjects, save_run_state
from marginface.train.state.step_position import EpochTally, StepPosition, continue_epoch


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


def test_epoch_tally_sums_the_steps_and_says_where_the_epoch_stands(monkeypatch):
    clock = iter([10.0, 12.0, 15.5, 20.0, 21.0])
    monkeypatch.setattr(step_position, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    generator = torch.Generator().manual_seed(5)
    tally = EpochTally.resume(2, None, generator)  # a new epoch: clock read (10)
    assert (tally.epoch, tally.step, tally.loss_total, tally.images) == (2, 0, 0.0, 0)
    tally.start_clock()  # 12
    tally.add(2.0, 4)
    tally.add(1.0, 2)
    assert tally.step == 2 and tally.images == 6 and tally.mean_loss == pytest.approx(10 / 6)
    assert tally.global_step(5) == 12
    where = tally.position()  # 15.5
    assert (where.epoch, where.step, where.loss_total, where.images) == (2, 2, 10.0, 6)
    assert where.seconds == pytest.approx(3.5)
    assert torch.equal(where.augment_state, generator.get_state())
    assert EpochTally.resume(0, None).position().augment_state is None  # no augmentation


def test_epoch_tally_resumes_a_step_checkpoint():
    saved = torch.Generator().manual_seed(7)
    generator = torch.Generator().manual_seed(5)
    position = StepPosition(1, 3, 2.5, 60, 1.25, saved.get_state())
    tally = EpochTally.resume(1, position, generator)
    assert (tally.step, tally.loss_total, tally.images, tally.seconds_before) == (3, 2.5, 60, 1.25)
    assert torch.equal(generator.get_state(), saved.get_state())
    tally.add(0.5, 20)
    assert tally.mean_loss == pytest.approx(12.5 / 80) and tally.position().seconds >= 1.25


def _tally_after(steps: int, epoch: int = 0) -> EpochTally:
    tally = EpochTally.resume(epoch, None)
    for _ in range(steps):
        tally.add(1.0, 2)
    return tally


def test_after_step_saves_when_due_but_leaves_the_epoch_end_to_its_checkpoint(tmp_path):
    writer = CheckpointWriter(tmp_path, CheckpointPolicy(every_steps=2))
    saved = []

    def save(epoch, position, wait=False):
        saved.append((epoch, position.step, wait))

    hook = {"steps_per_epoch": 4, "signals": StopSignals(), "distributed": False,
            "device": "cpu", "save": save}  # fmt: skip
    for steps in (1, 2, 3):
        writer.after_step(_tally_after(steps, epoch=1), **hook)
    assert saved == [(1, 2, False)]  # global step 6
    writer.after_step(_tally_after(4, epoch=1), **hook)  # global step 8: the epoch's end
    assert saved == [(1, 2, False)]


def test_after_step_on_a_signal_saves_waiting_then_stops(tmp_path):
    writer = CheckpointWriter(tmp_path)  # no interval: only the signal
    saved = []
    signals = StopSignals()
    signals.received = signal.SIGTERM
    with pytest.raises(TrainingPreemptedError, match=r"SIGTERM .*step 4 of 4 of epoch 1"):
        writer.after_step(
            _tally_after(4), steps_per_epoch=4, signals=signals, distributed=False,
            device="cpu", save=lambda epoch, position, wait: saved.append((epoch, wait)),
        )  # fmt: skip
    assert saved == [(0, True)]  # also at the epoch's last step


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
