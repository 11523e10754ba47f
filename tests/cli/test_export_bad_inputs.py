"""``marginface export`` with what a user gets wrong (issue 39): a RUN_DIR that is missing, a
file or no run folder, a truncated, foreign or non-PyTorch checkpoint, an ``--out`` that is a
file or under one, ``--batch 0``: exit 2, one line naming the path or the option, nothing
written."""

from __future__ import annotations

import shutil

import pytest
import torch

from marginface.cli import main
from tests.cli._full_disk import fingerprint, one_line


@pytest.fixture
def run(digits_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(digits_run, copy)
    return copy


def _refused(capsys, tmp_path, args: list[str], *needles: str) -> str:
    before = fingerprint(tmp_path)
    err = one_line(capsys, main(["export", *args]), *needles)
    assert fingerprint(tmp_path) == before  # nothing written, nothing removed
    return err


def test_a_missing_run_folder(tmp_path, capsys):
    _refused(capsys, tmp_path, [str(tmp_path / "nothere")], "nothere does not exist")


def test_a_file_for_the_run_folder(run, tmp_path, capsys):
    checkpoint = run / "checkpoint.pt"
    _refused(capsys, tmp_path, [str(checkpoint)], f"RUN_DIR {checkpoint} is a file")


def test_a_folder_without_a_checkpoint(tmp_path, capsys):
    (tmp_path / "photos").mkdir()
    _refused(capsys, tmp_path, [str(tmp_path / "photos")], "no checkpoint in", "photos")


def test_a_truncated_checkpoint(run, tmp_path, capsys):
    checkpoint = run / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:3000])
    _refused(capsys, tmp_path, [str(run)], str(checkpoint))


def test_a_checkpoint_that_is_no_pytorch_file(run, tmp_path, capsys):
    checkpoint = run / "checkpoint.pt"
    checkpoint.write_text("not a checkpoint\n")
    err = _refused(capsys, tmp_path, [str(run)], f"{checkpoint} is not a PyTorch file")
    assert "could run code" not in err  # not the advice for an unsafe pickle


def test_a_bare_state_dict_for_a_checkpoint(run, tmp_path, capsys):
    checkpoint = run / "checkpoint.pt"
    torch.save({"weight": torch.zeros(2, 2)}, checkpoint)
    _refused(capsys, tmp_path, [str(run)], f"{checkpoint} is not a marginface checkpoint")


def test_an_output_that_is_a_file(run, tmp_path, capsys):
    target = tmp_path / "exported.ts"
    target.write_text("keep me\n")
    args = [str(run), "--out", str(target)]
    _refused(capsys, tmp_path, args, f"--out {target} is a file, not a folder")
    assert target.read_text() == "keep me\n"


def test_an_output_under_a_file(run, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    args = [str(run), "--out", str(tmp_path / "file" / "deeper")]
    _refused(capsys, tmp_path, args, "a part of this path is a file", str(tmp_path / "file"))


def test_a_batch_of_zero(run, tmp_path, capsys):
    _refused(capsys, tmp_path, [str(run), "--batch", "0"], "--batch must be at least 1, got 0")
