"""Step checkpoints (``train --checkpoint-every``), exact resume inside an epoch, ``--keep`` and
the fall back to an older checkpoint, stops on SIGTERM/SIGUSR1, ``--async-checkpoint`` (issue
28)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from marginface.cli import main
from marginface.train import Trainer, load_checkpoint, read_history
from marginface.train.state.checkpoint_writer import CheckpointPolicy
from marginface.train.state.kept_checkpoints import kept_checkpoints
from marginface.train.state.layout import CHECKPOINT_NAME, KEPT_NAME, position_label
from marginface.train.state.preemption import PREEMPTED_EXIT_CODE
from marginface.train.state.run_state import read_saved_run
from marginface.train.state.step_position import (
    CheckpointInterval,
    StepPosition,
    host_rng_state,
    restore_host_rng_state,
)

# 120 images, batch 20: 6 steps per epoch; dropout and augmentation draw random numbers
TINY = [
    "--dataset", "digits", "--limit", "120", "--batch-size", "20", "--threads", "1",
    "--device", "cpu", "--embedding-dim", "3", "--set", "augment={translate=1, hflip=0.5}",
]  # fmt: skip
STEPS = 6


class InjectedCrashError(RuntimeError):
    """The fault a test injects at a chosen step."""


def _crash_at(monkeypatch: pytest.MonkeyPatch, global_step: int) -> None:
    """Make the ``global_step``-th step (counted from 1 over the run) raise, once."""
    original = Trainer._train_step

    def crashing(self, epoch, step, *args):
        if epoch * self.steps_per_epoch + step + 1 == global_step:
            monkeypatch.setattr(Trainer, "_train_step", original)
            raise InjectedCrashError(f"injected crash at step {global_step}")
        return original(self, epoch, step, *args)

    monkeypatch.setattr(Trainer, "_train_step", crashing)


def _train(run: Path, epochs: int, *extra: str) -> int:
    return main(["--quiet", "train", *TINY, "--epochs", str(epochs), "--out", str(run), *extra])


def _assert_same_state(a: dict, b: dict) -> None:
    for part in ("model", "loss"):
        assert a[part].keys() == b[part].keys()
        for key, value in b[part].items():
            assert torch.equal(a[part][key], value), f"{part}.{key}"
    for index, entries in b["optimizer"]["state"].items():
        for key, value in entries.items():
            assert torch.equal(torch.as_tensor(a["optimizer"]["state"][index][key]),
                               torch.as_tensor(value)), f"optimizer {index} {key}"  # fmt: skip
    assert a["scheduler"] == b["scheduler"]
    assert torch.equal(a["rng"], b["rng"])


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """An uninterrupted 2-epoch run."""
    run = tmp_path_factory.mktemp("straight") / "run"
    assert _train(run, 2) == 0
    return run


def test_crash_mid_epoch_then_resume_is_bit_identical(straight, tmp_path, monkeypatch):
    run = tmp_path / "run"
    _crash_at(monkeypatch, 9)  # epoch 2, step 3; the last checkpoint: after global step 8
    assert _train(run, 2, "--checkpoint-every", "4", "--resume-if-exists") == 1
    saved = read_saved_run(run)
    assert saved.epoch == 1 and saved.position is not None
    assert (saved.position.epoch, saved.position.step) == (1, 2)
    assert saved.position.images == 2 * 20
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1]
    assert _train(run, 2, "--checkpoint-every", "4", "--resume-if-exists") == 0
    resumed, uninterrupted = (load_checkpoint(r / CHECKPOINT_NAME) for r in (run, straight))
    _assert_same_state(resumed, uninterrupted)
    assert resumed["position"] is None  # the epoch's end
    rows, straight_rows = (read_history(r / "history.csv") for r in (run, straight))
    assert [row["epoch"] for row in rows] == [1, 2]  # one row per epoch, none twice
    for row, expected in zip(rows, straight_rows, strict=True):
        assert row["loss"] == expected["loss"] and row["accuracy"] == expected["accuracy"]


def test_a_crash_in_the_first_epoch_resumes_inside_it(straight, tmp_path, monkeypatch):
    run = tmp_path / "run"
    _crash_at(monkeypatch, 4)
    assert _train(run, 2, "--checkpoint-every", "3") == 1
    assert read_saved_run(run).position.step == 3
    assert read_history(run / "history.csv") == []
    assert main(["--quiet", "evaluate", str(run), "--device", "cpu"]) == 0  # its weights
    assert _train(run, 2, "--resume", "--checkpoint-every", "3") == 0
    _assert_same_state(*(load_checkpoint(r / CHECKPOINT_NAME) for r in (run, straight)))
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]


def test_keep_holds_the_last_k_and_resume_falls_back_past_a_corrupt_one(
    straight, tmp_path, monkeypatch, caplog
):
    run = tmp_path / "run"
    _crash_at(monkeypatch, 11)
    assert _train(run, 2, "--checkpoint-every", "2", "--keep", "3") == 1
    # checkpoints after steps 2, 4, (6 = the end of epoch 1), 8, 10: the last 3 kept
    names = [path.name for path in kept_checkpoints(run)]
    assert names == [f"{position_label(1, 4)}.pt", f"{position_label(1, 2)}.pt",
                     f"{position_label(1, 0)}.pt"]  # fmt: skip
    assert (run / CHECKPOINT_NAME).samefile(run / KEPT_NAME / names[0])
    for path in kept_checkpoints(run):
        load_checkpoint(path)  # each verified
    # the newest damaged (a flipped byte): the resume takes the one before
    newest = run / KEPT_NAME / names[0]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (run / CHECKPOINT_NAME).unlink()
    newest.write_bytes(bytes(data))
    saved = read_saved_run(run)
    assert saved.source == run / KEPT_NAME / names[1]
    assert saved.position.step == 2
    assert "trying an older checkpoint" in caplog.text
    assert _train(run, 2, "--resume", "--checkpoint-every", "2", "--keep", "3") == 0
    _assert_same_state(*(load_checkpoint(r / CHECKPOINT_NAME) for r in (run, straight)))
    assert len(kept_checkpoints(run)) == 3


def test_every_minutes_checkpoints_inside_the_epoch(tmp_path, monkeypatch):
    run = tmp_path / "run"
    clock = iter(range(0, 10_000, 50))  # 50 s per look at the clock
    monkeypatch.setattr("marginface.train.trainer.time.monotonic", lambda: float(next(clock)))
    _crash_at(monkeypatch, 5)
    assert _train(run, 1, "--checkpoint-every-minutes", "1.5") == 1
    position = read_saved_run(run).position
    assert position is not None and 1 <= position.step < 5


def test_no_valid_checkpoint_names_the_newest(tmp_path):
    run = tmp_path / "run"
    assert _train(run, 1, "--keep", "2") == 0
    for path in [*kept_checkpoints(run)]:
        path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="checkpoint.pt"):
        read_saved_run(run)


def test_interval_and_keep_refuse_bad_values(tmp_path, capsys):
    with pytest.raises(ValueError, match="checkpoint_every_steps must be an integer >= 1, got 0"):
        CheckpointInterval(steps=0)
    with pytest.raises(ValueError, match="checkpoint_every_minutes must be a finite number > 0"):
        CheckpointInterval(minutes=float("nan"))
    with pytest.raises(ValueError, match="keep must be an integer >= 1, got 0"):
        CheckpointPolicy(keep=0)
    with pytest.raises(ValueError, match="checkpoint_every_steps must be an integer >= 1"):
        CheckpointPolicy(every_steps=2.5)
    bad = [("--checkpoint-every", "0"), ("--keep", "x"), ("--checkpoint-every-minutes", "-1"),
           ("--preempted-exit-code", "256")]  # fmt: skip
    for flag, value in bad:
        with pytest.raises(SystemExit):
            main(["train", *TINY, "--out", str(tmp_path / "r"), flag, value])
        assert flag in capsys.readouterr().err


def test_interval_due():
    assert not CheckpointInterval().active
    every = CheckpointInterval(steps=3, minutes=2)
    assert not every.due(2, 119.0) and every.due(3, 0.0) and every.due(1, 120.0)
    assert every.due(9, 0.0) and not every.due(10, 0.0)  # multiples of 3 over the run


def test_step_position_round_trip_and_label():
    position = StepPosition(2, 13, 1.5, 260, 4.25, torch.arange(4, dtype=torch.uint8))
    again = StepPosition.from_plain(position.plain(), position.augment_state)
    assert again == position
    assert position.label() == "epoch-0002-step-0000013" < position_label(2, 100)


def test_host_rng_round_trip():
    random.seed(3)
    np.random.seed(4)
    np.random.standard_normal()  # leaves a cached Gaussian in NumPy's state
    state = host_rng_state()
    expected = (random.random(), np.random.standard_normal(), np.random.random())
    random.seed(99)
    np.random.seed(99)
    restore_host_rng_state(state)
    assert (random.random(), np.random.standard_normal(), np.random.random()) == expected


def _signal_at(monkeypatch: pytest.MonkeyPatch, global_step: int, number: int) -> None:
    """Send ``number`` to this process during the ``global_step``-th step (its handler only
    sets a flag: the step finishes)."""
    original = Trainer._train_step

    def signalling(self, epoch, step, *args):
        if epoch * self.steps_per_epoch + step + 1 == global_step:
            os.kill(os.getpid(), number)
        return original(self, epoch, step, *args)

    monkeypatch.setattr(Trainer, "_train_step", signalling)


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_checkpoints_the_step_and_exits_for_requeue(
    straight, tmp_path, monkeypatch, capsys, number
):
    run = tmp_path / "run"
    before = signal.getsignal(number)
    _signal_at(monkeypatch, 8, number)
    assert _train(run, 2, "--resume-if-exists") == PREEMPTED_EXIT_CODE
    assert signal.getsignal(number) is before  # the handler is gone after fit
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and signal.Signals(number).name in err[0]
    assert "after step 2 of 6 of epoch 2" in err[0] and f"--out {run} --resume" in err[0]
    assert read_saved_run(run).position.step == 2
    monkeypatch.undo()
    assert _train(run, 2, "--resume-if-exists") == 0  # the same command line
    _assert_same_state(*(load_checkpoint(r / CHECKPOINT_NAME) for r in (run, straight)))
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]


def test_a_signal_on_the_last_step_of_an_epoch_resumes_at_its_end(straight, tmp_path, monkeypatch):
    run = tmp_path / "run"
    _signal_at(monkeypatch, STEPS, signal.SIGTERM)
    assert _train(run, 2, "--preempted-exit-code", "99") == 99
    saved = read_saved_run(run)
    assert (saved.epoch, saved.position.step) == (0, STEPS) and saved.history == []
    monkeypatch.undo()
    assert _train(run, 2, "--resume") == 0
    _assert_same_state(*(load_checkpoint(r / CHECKPOINT_NAME) for r in (run, straight)))
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]


def test_sigterm_from_outside_to_the_command(straight, tmp_path):
    """``python -m marginface train`` as a scheduler runs it: SIGTERM at some instant of its
    training; the exit status says "requeue me" and the same command line then finishes with
    the uninterrupted run's weights."""
    run = tmp_path / "run"
    command = [sys.executable, "-m", "marginface", "--quiet", "train", *TINY, "--epochs", "2",
               "--out", str(run), "--resume-if-exists", "--set", "limit=1200"]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "config.toml").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # config.toml: written by fit, after the handlers are in place
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == PREEMPTED_EXIT_CODE, err
    assert "SIGTERM" in err and "--resume" in err and "Traceback" not in err
    assert read_saved_run(run).position is not None
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    straight_long = tmp_path / "straight"
    assert _train(straight_long, 2, "--set", "limit=1200") == 0
    _assert_same_state(*(load_checkpoint(r / CHECKPOINT_NAME) for r in (run, straight_long)))


# ------------------------------------------------------------ --async-checkpoint
def test_async_checkpoints_resume_bit_identical(straight, tmp_path, monkeypatch):
    run = tmp_path / "run"
    writes: list[str] = []
    original = Trainer._save

    def recording(self, epoch, position=None, wait=False):
        writes.append(f"{epoch}/{position.step if position else 0}/{wait}")
        return original(self, epoch, position, wait)

    monkeypatch.setattr(Trainer, "_save", recording)
    _crash_at(monkeypatch, 11)
    assert _train(run, 2, "--checkpoint-every", "4", "--async-checkpoint") == 1
    assert writes == ["0/4/False", "1/0/False", "1/2/False"]
    saved = read_saved_run(run)  # the write started at step 8 was completed or abandoned
    assert (saved.epoch, saved.position.step if saved.position else 0) in ((1, 2), (1, 0))
    assert _train(run, 2, "--resume", "--checkpoint-every", "4", "--async-checkpoint") == 0
    _assert_same_state(*(load_checkpoint(r / CHECKPOINT_NAME) for r in (run, straight)))
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]


_KILLED_DURING_WRITE = """
import os, signal, sys, threading, time
from pathlib import Path
import torch
from marginface.cli import main
from marginface.train import Trainer

marker = Path(sys.argv[1])
real_save = torch.save

def slow_save(obj, f, *args, **kwargs):
    real_save(obj, f, *args, **kwargs)  # the bytes are in the temporary file, not yet sealed
    background = threading.current_thread().name == "marginface-checkpoint"
    if background and (obj.get("position") or {}).get("step") == 2:
        marker.write_text("writing")
        time.sleep(120)

torch.save = slow_save
original = Trainer._train_step

def killing(self, epoch, step, *args):
    if epoch * self.steps_per_epoch + step + 1 == 11:
        while not marker.exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)  # during the background write of step 8
    return original(self, epoch, step, *args)

Trainer._train_step = killing
sys.exit(main(sys.argv[2:]))
"""


def test_a_kill_during_an_async_write_leaves_the_previous_checkpoint(straight, tmp_path):
    run = tmp_path / "run"
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(_KILLED_DURING_WRITE))
    command = ["--quiet", "train", *TINY, "--epochs", "2", "--out", str(run),
               "--checkpoint-every", "4", "--async-checkpoint"]  # fmt: skip
    killed = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "marker"), *command],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr
    assert list(run.glob(".checkpoint.pt.*.tmp"))  # the write cut short
    saved = read_saved_run(run)  # the previous one: the end of epoch 1, verified
    assert saved.epoch == 1 and saved.position is None
    assert main([*command, "--resume"]) == 0
    _assert_same_state(*(load_checkpoint(r / CHECKPOINT_NAME) for r in (run, straight)))
    assert not list(run.glob(".checkpoint.pt.*.tmp"))  # removed by the next write
    assert torch.equal(
        load_checkpoint(run / CHECKPOINT_NAME)["rng"],
        load_checkpoint(straight / CHECKPOINT_NAME)["rng"],
    )
