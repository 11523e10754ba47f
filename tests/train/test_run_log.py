"""The run log on its own: rows kept in order, written after the checkpoint, removed when the
checkpoint fails, only the main process writing; and the divergence message."""

from __future__ import annotations

import math

import pytest

from marginface.train.failures import TrainingDivergedError, diverged, first_non_finite
from marginface.train.history import read_history
from marginface.train.run_log import RunLog
from marginface.train.state.layout import HISTORY_NAME, VERIFICATION_NAME


def test_an_epoch_is_written_after_its_checkpoint_and_passed_to_the_callbacks(tmp_path):
    seen: list[dict] = []
    log = RunLog(tmp_path, callbacks=[seen.append])
    log.open(history=[], completed_steps=0, writes=True, tensorboard=False)
    assert (tmp_path / HISTORY_NAME).read_text() == ""
    at_checkpoint: list[int] = []

    def checkpoint() -> None:  # the checkpoint sees the new row; the CSV does not yet
        at_checkpoint.append(len(log.history))
        assert len(read_history(tmp_path / HISTORY_NAME)) == len(log.history) - 1

    log.add_epoch({"epoch": 1, "loss": 2.5}, checkpoint)
    log.add_epoch({"epoch": 2, "loss": 1.5, "auc": math.nan}, checkpoint)
    assert at_checkpoint == [1, 2]
    rows = read_history(tmp_path / HISTORY_NAME)
    assert [(r["epoch"], r["loss"]) for r in rows] == [(1.0, 2.5), (2.0, 1.5)]
    assert math.isnan(rows[0]["auc"]) and math.isnan(rows[1]["auc"])
    assert [row["epoch"] for row in seen] == [1, 2]


def test_a_failed_checkpoint_leaves_the_log_as_it_was(tmp_path):
    seen: list[dict] = []
    log = RunLog(tmp_path, callbacks=[seen.append])
    log.open(history=[{"epoch": 1, "loss": 2.0}], completed_steps=4, writes=True, tensorboard=False)
    assert [r["epoch"] for r in read_history(tmp_path / HISTORY_NAME)] == [1.0]

    def full_disk() -> None:
        raise OSError(28, "disk full")

    with pytest.raises(OSError, match="disk full"):
        log.add_epoch({"epoch": 2, "loss": 1.0}, full_disk)
    assert log.history == [{"epoch": 1, "loss": 2.0}] and seen == []
    assert [r["epoch"] for r in read_history(tmp_path / HISTORY_NAME)] == [1.0]


def test_only_the_main_process_writes_or_calls_back(tmp_path):
    seen: list[dict] = []
    log = RunLog(tmp_path, callbacks=[seen.append])
    log.step_callbacks.append(seen.append)
    log.open(history=[], completed_steps=0, writes=False, tensorboard=True)
    log.add_epoch({"epoch": 1, "loss": 1.0}, lambda: None)
    log.add_step_verification({"step": 3, "lfw_accuracy": 0.5})
    log.close()
    assert list(tmp_path.iterdir()) == [] and seen == []
    assert log.history == [{"epoch": 1, "loss": 1.0}]
    assert log.step_verification == [{"step": 3, "lfw_accuracy": 0.5}]


def test_a_resumed_log_keeps_the_verification_rows_of_completed_steps(tmp_path):
    first = RunLog(tmp_path)
    first.open(history=[], completed_steps=0, writes=True, tensorboard=False)
    for step in (2, 4, 6):
        first.add_step_verification({"step": step, "lfw_accuracy": step / 10})
    assert [r["step"] for r in read_history(tmp_path / VERIFICATION_NAME)] == [2, 4, 6]
    resumed = RunLog(tmp_path)
    resumed.open(history=[], completed_steps=4, writes=True, tensorboard=False)
    assert [r["step"] for r in resumed.step_verification] == [2, 4]
    fresh = RunLog(tmp_path)
    fresh.open(history=[], completed_steps=0, writes=True, tensorboard=False)
    assert fresh.step_verification == []


def test_divergence_names_the_parameter_or_the_cause_and_the_way_forward():
    import torch
    from torch import nn

    model, head = nn.Linear(2, 2), nn.Linear(2, 3)
    assert first_non_finite(model, head) is None
    with torch.no_grad():
        head.weight[1, 0] = math.inf
    assert first_non_finite(model, head) == "loss.weight"
    error = diverged("the loss became nan", epoch=1, step=4, parameter=None, way_forward="W")
    assert isinstance(error, TrainingDivergedError)
    assert str(error).startswith("the loss became nan at epoch 2, step 5; W. Try a lower lr")
    error = diverged("", epoch=0, step=None, parameter="loss.weight", way_forward="W")
    assert str(error).startswith("parameter loss.weight became non-finite at epoch 1; W.")
