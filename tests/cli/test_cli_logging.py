"""The command line's output in a log file: no carriage returns, periodic progress lines;
--quiet and --verbose; logging set up once."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from marginface.cli import main, setup_logging

TINY = ["--limit", "200", "--epochs", "2", "--batch-size", "64", "--threads", "1"]
STEPS = 4  # ceil(200 / 64) per epoch
LINE = re.compile(r"^epoch (\d)/2  step (\d)/4  loss \S+  \d+ img/s  eta \S+ \(run \S+\)$", re.M)
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(autouse=True)
def restore_logging():
    package = logging.getLogger("marginface")
    handlers, level = list(package.handlers), package.level
    yield
    package.handlers[:] = handlers
    package.setLevel(level)


def test_training_into_a_pipe_writes_lines_not_bar_redraws(tmp_path):
    """stderr is a pipe, as in CI or ``nohup ... > log 2>&1``."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "marginface",
            "train",
            *TINY,
            "--loss",
            "arcface",
            "--progress-seconds",
            "0",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        env={"PYTHONPATH": str(SRC), "PATH": ""},
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    assert b"\r" not in result.stderr and b"\r" not in result.stdout
    found = LINE.findall(result.stderr.decode())
    assert found == [(str(e), str(s)) for e in (1, 2) for s in range(1, STEPS + 1)]
    assert "epoch  loss" in result.stdout.decode()  # the per-epoch table still on stdout


def test_quiet_silences_progress_and_chatter_verbose_adds_debug(tmp_path, capsys):
    assert main(["--quiet", "train", *TINY, "--out", str(tmp_path / "quiet")]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert (
        captured.out
        == f"run written to {tmp_path / 'quiet'} (config.toml, history.csv, checkpoint)\n"
    )
    assert main(["train", *TINY, "--out", str(tmp_path / "verbose"), "--verbose"]) == 0
    captured = capsys.readouterr()
    assert LINE.findall(captured.err) == [("1", "4"), ("2", "4")]  # default: once per epoch
    assert "\r" not in captured.err
    assert "DEBUG marginface.train.trainer: epoch 1:" in captured.err
    assert "run written to" in captured.out


def test_logging_is_set_up_once_and_replaced_on_a_second_call(capsys):
    package = logging.getLogger("marginface")
    root_handlers = list(logging.getLogger().handlers)
    setup_logging()
    setup_logging(quiet=True)
    assert package.level == logging.WARNING
    logging.getLogger("marginface.data").warning("disk %s", "slow")
    logging.getLogger("marginface.data").info("not shown")
    assert capsys.readouterr().err == "WARNING marginface.data: disk slow\n"  # one handler
    setup_logging(quiet=True, verbose=True)
    assert package.level == logging.DEBUG
    assert logging.getLogger().handlers == root_handlers  # other libraries' logs left alone


def test_progress_seconds_must_be_a_number_of_seconds(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--progress-seconds", "-1"])
    assert "--progress-seconds" in capsys.readouterr().err
