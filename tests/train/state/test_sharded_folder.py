"""Opening a run that holds one ``checkpoint.pt`` imports no ``torch.distributed.checkpoint``
and no SymPy (issue 47: ~0.6 s of the photo commands' start-up); a sharded folder is still
found, repaired and read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from marginface.cli import main
from marginface.train.state.layout import SHARDED_CHECKPOINT_NAME, SIDECAR_NAME
from marginface.train.state.sharded_folder import (
    has_sharded_checkpoint,
    recover,
    sharded_checkpoint_on_disk,
)

TINY = [
    "--limit", "60", "--batch-size", "60", "--threads", "1", "--device", "cpu",
    "--set", "model_options={widths=[4,4,8]}",
]  # fmt: skip
HEAVY = ("torch.distributed.checkpoint", "sympy", "marginface.train.state.sharded_checkpoint")
OLD = ".checkpoint.old"


@pytest.fixture(scope="module")
def single_file_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("single") / "run"
    assert main(["--quiet", "train", *TINY, "--epochs", "1", "--out", str(run)]) == 0
    return run


def _imported_after(code: str) -> list[str]:
    """The :data:`HEAVY` modules a fresh interpreter holds after ``code``."""
    listed = f"[m for m in {HEAVY!r} if m in sys.modules]"
    probe = f"import sys, json\n{code}\nprint(json.dumps({listed}))"
    src = Path(__file__).resolve().parents[3] / "src"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_reading_a_single_file_run_imports_no_distributed_checkpoint(single_file_run):
    code = (
        "from marginface.train.state.run_state import read_saved_run\n"
        "from marginface.train.state.loaded_run import load_run\n"
        f"saved = read_saved_run({str(single_file_run)!r})\n"
        "assert not saved.sharded, saved\n"
        f"load_run({str(single_file_run)!r}, saved=saved)"
    )
    assert _imported_after(code) == []


def test_the_sharded_reader_is_still_what_it_was():
    # the control: the probe does see the heavy modules when the sharded reader is imported
    imported = _imported_after("import marginface.train.state.sharded_checkpoint")
    assert "torch.distributed.checkpoint" in imported


def test_a_half_swapped_folder_is_found_and_put_back(tmp_path):
    old = tmp_path / OLD
    old.mkdir()
    (old / SIDECAR_NAME).write_text('{"epoch": 2}')
    assert sharded_checkpoint_on_disk(tmp_path)  # looked for, set aside: not repaired
    assert not (tmp_path / SHARDED_CHECKPOINT_NAME).exists()
    assert has_sharded_checkpoint(tmp_path)  # repairs, then looks
    assert (tmp_path / SHARDED_CHECKPOINT_NAME / SIDECAR_NAME).read_text() == '{"epoch": 2}'
    assert not old.exists()


def test_recover_drops_the_old_folder_when_the_new_one_is_complete(tmp_path):
    for name, epoch in ((SHARDED_CHECKPOINT_NAME, 3), (OLD, 2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / SIDECAR_NAME).write_text(json.dumps({"epoch": epoch}))
    recover(tmp_path)
    assert not (tmp_path / OLD).exists()
    assert json.loads((tmp_path / SHARDED_CHECKPOINT_NAME / SIDECAR_NAME).read_text()) == {
        "epoch": 3
    }


def test_an_empty_folder_has_no_sharded_checkpoint(tmp_path):
    assert not has_sharded_checkpoint(tmp_path)
    assert not sharded_checkpoint_on_disk(tmp_path)
