"""A training run's progress (marginface._progress's ProgressReporter and EpochProgress): a
tqdm bar on a terminal, periodic log lines (no carriage returns) elsewhere."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest

from marginface._progress import (
    ProgressReporter,
    check_progress_seconds,
    format_duration,
    resolve_progress_mode,
)
from marginface.train import Trainer
from marginface.train.config import TrainConfig

LINE = re.compile(
    r"^epoch (\d+)/(\d+)  step (\d+)/(\d+)  loss \d+\.\d{4}  \d+ img/s  "
    r"eta \d+:\d\d:\d\d \(run \d+:\d\d:\d\d\)$"
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_mode_follows_whether_stderr_is_a_terminal() -> None:
    assert resolve_progress_mode(True, Terminal()) == "bar"
    assert resolve_progress_mode("auto", Terminal()) == "bar"
    assert resolve_progress_mode(True, io.StringIO()) == "lines"
    assert resolve_progress_mode(False, Terminal()) == "none"
    assert resolve_progress_mode("lines", Terminal()) == "lines"
    with pytest.raises(ValueError, match="progress must be"):
        resolve_progress_mode("fancy")


def test_format_duration() -> None:
    assert format_duration(0) == "0:00:00"
    assert format_duration(3725.4) == "1:02:05"
    assert format_duration(float("inf")) == "?"


def run_epochs(reporter: ProgressReporter, epochs: range) -> None:
    for epoch in epochs:
        progress = reporter.epoch(epoch)
        for step in range(reporter.steps_per_epoch):
            progress.update(step, loss=1.0, mean_loss=0.5, images=8 * (step + 1))
        progress.close()


def lines(caplog) -> list[re.Match]:
    found = [LINE.match(r.getMessage()) for r in caplog.records if r.name.endswith("progress")]
    assert all(found), [r.getMessage() for r in caplog.records]
    return found


def test_lines_come_every_interval_and_at_every_epoch_end(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.train.progress")
    run_epochs(ProgressReporter("lines", epochs=3, steps_per_epoch=5, interval=3600), range(3))
    found = lines(caplog)
    assert [(m[1], m[3]) for m in found] == [("1", "5"), ("2", "5"), ("3", "5")]
    caplog.clear()
    run_epochs(ProgressReporter("lines", epochs=2, steps_per_epoch=4, interval=0), range(2))
    assert [(int(m[1]), int(m[3])) for m in lines(caplog)] == [
        (e, s) for e in (1, 2) for s in (1, 2, 3, 4)
    ]


def test_a_resumed_run_counts_its_eta_from_where_it_starts(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.train.progress")
    reporter = ProgressReporter("lines", epochs=4, steps_per_epoch=2, start_epoch=2, interval=0)
    run_epochs(reporter, range(2, 4))
    assert [m[1] for m in lines(caplog)] == ["3", "3", "4", "4"]
    assert lines(caplog)[-1].group(0).endswith("eta 0:00:00 (run 0:00:00)")


def test_bar_on_a_terminal_and_nothing_in_none_mode(monkeypatch, caplog) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    caplog.set_level(logging.INFO, logger="marginface.train.progress")
    run_epochs(ProgressReporter("bar", epochs=1, steps_per_epoch=3), range(1))
    assert "\r" in terminal.getvalue() and "epoch 1/1" in terminal.getvalue()
    assert not caplog.records
    terminal.truncate(0)
    run_epochs(ProgressReporter("none", epochs=1, steps_per_epoch=3, interval=0), range(1))
    assert terminal.getvalue() == "" and not caplog.records


def test_bad_progress_arguments_are_clear_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="progress_seconds"):
        Trainer(TrainConfig(), tmp_path, progress_seconds=-1)
    with pytest.raises(ValueError, match="progress_seconds"):
        Trainer(TrainConfig(), tmp_path, progress_seconds=float("nan"))
    with pytest.raises(ValueError, match="progress must be"):
        Trainer(TrainConfig(), tmp_path, progress="sometimes")
    for interval in (-2, float("inf"), True):
        with pytest.raises(ValueError, match=rf"interval .*got {re.escape(repr(interval))}"):
            ProgressReporter("lines", epochs=1, steps_per_epoch=1, interval=interval)


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), True, "30", None])
def test_progress_seconds_must_be_a_finite_number_of_seconds(bad) -> None:
    with pytest.raises(ValueError, match=rf"progress_seconds .*got {re.escape(repr(bad))}"):
        check_progress_seconds(bad)


def test_progress_seconds_come_back_as_floats() -> None:
    assert check_progress_seconds(0) == 0.0 and isinstance(check_progress_seconds(0), float)
    assert check_progress_seconds(2.5) == 2.5
    assert Trainer(TrainConfig(), "unused", progress_seconds=7).progress_seconds == 7.0
