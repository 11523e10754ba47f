"""``train --resume-if-exists``: one command line for a run's first launch and every restart
(issue 28)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marginface.cli import main
from marginface.train import load_checkpoint, read_history
from marginface.train.state.layout import CHECKPOINT_NAME

TINY = [
    "--dataset", "digits", "--limit", "120", "--batch-size", "60", "--threads", "1",
    "--device", "cpu", "--embedding-dim", "3",
]  # fmt: skip


def _command(run: Path, epochs: int, *extra: str) -> list[str]:
    return ["--quiet", "train", *TINY, "--epochs", str(epochs), "--out", str(run),
            "--resume-if-exists", *extra]  # fmt: skip


def test_the_same_command_starts_then_continues(tmp_path):
    run = tmp_path / "run"
    assert main(_command(run, 1)) == 0  # first launch: nothing there, a new run
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1]
    assert main(_command(run, 2)) == 0  # a restart: continues from epoch 1's checkpoint
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]
    # the same weights as a run that was never interrupted
    straight = tmp_path / "straight"
    assert main(["--quiet", "train", *TINY, "--epochs", "2", "--out", str(straight)]) == 0
    resumed, uninterrupted = (load_checkpoint(r / CHECKPOINT_NAME) for r in (run, straight))
    for key, value in uninterrupted["model"].items():
        torch.testing.assert_close(resumed["model"][key], value, rtol=0, atol=0)


def test_a_run_killed_before_its_first_checkpoint_starts_again(tmp_path):
    run = tmp_path / "run"
    assert main(["--quiet", "train", *TINY, "--epochs", "1", "--out", str(run)]) == 0
    (run / CHECKPOINT_NAME).unlink()  # as if killed in epoch 1: config.toml, no checkpoint
    assert main(_command(run, 1)) == 0
    assert load_checkpoint(run / CHECKPOINT_NAME)["epoch"] == 1


def test_refusals_are_one_line(tmp_path, capsys):
    other = tmp_path / "photos"
    other.mkdir()
    (other / "holiday.jpg").write_bytes(b"not a run")
    assert main(_command(other, 1)) == 2  # never deletes a folder that is not a run
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert (other / "holiday.jpg").read_bytes() == b"not a run"
    no_out = ["--quiet", "train", *TINY, "--resume-if-exists"]
    assert main(no_out) == 2
    assert "--resume-if-exists needs --out" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_status:  # argparse: one mode at a time
        main([*_command(tmp_path / "r", 1), "--resume"])
    assert exit_status.value.code == 2
    assert "not allowed with argument --resume-if-exists" in capsys.readouterr().err


def test_a_restart_of_a_fine_tuning_run_resumes_its_own_weights(tmp_path):
    """With a checkpoint in --out, --init-from is not read again (the run's weights are newer):
    here the file no longer exists, and the restart still continues."""
    run = tmp_path / "run"
    assert main(["--quiet", "train", *TINY, "--epochs", "1", "--out", str(run)]) == 0
    gone = str(tmp_path / "deleted-backbone.pth")
    assert main(_command(run, 2, "--init-from", gone)) == 0
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]
