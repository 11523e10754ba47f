"""A failed sharded save is one exception naming what failed, not DCP's CheckpointException
(a BaseException in torch 2.13 carrying every rank's traceback) (issue 28)."""

from __future__ import annotations

import errno
import traceback
from collections import namedtuple
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from marginface import _atomic
from marginface._atomic import DiskFullError
from marginface.train.state import checkpoint_writer
from marginface.train.state.checkpoint import CheckpointError
from marginface.train.state.checkpoint_writer import CheckpointWriter
from marginface.train.state.sharded_checkpoint import save_failure

STAGING = Path("/runs/r/.checkpoint.3.tmp")


def _failures(*errors: BaseException) -> CheckpointException:
    wrapped = {rank: (error, traceback.StackSummary()) for rank, error in enumerate(errors)}
    return CheckpointException("save failed", wrapped)


def test_a_full_disk_on_any_rank_is_disk_full_naming_the_file():
    full = OSError(errno.ENOSPC, "No space left on device", str(STAGING / "__1_0.distcp"))
    error = save_failure(_failures(RuntimeError("rank 0 waited"), full), STAGING)
    assert isinstance(error, DiskFullError)
    assert error.strerror == f"disk full: could not write {STAGING / '__1_0.distcp'}"
    assert error.filename == str(STAGING / "__1_0.distcp")


def test_a_full_disk_behind_another_exception_is_found():
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as inner:
            raise RuntimeError("writer thread failed") from inner
    except RuntimeError as outer:
        error = save_failure(_failures(outer), STAGING)
    assert isinstance(error, DiskFullError)
    assert error.strerror == f"disk full: could not write {STAGING}"


def test_other_failures_are_one_line():
    denied = OSError(errno.EACCES, "Permission denied", str(STAGING))
    error = save_failure(_failures(denied), STAGING)
    assert isinstance(error, PermissionError) and error.errno == errno.EACCES
    assert "rank 0: Permission denied" in str(error) and str(STAGING) in str(error)
    other = save_failure(_failures(ValueError("bad tensor\nsecond line")), STAGING)
    assert isinstance(other, CheckpointError)
    assert str(other) == (
        f"could not write the sharded checkpoint {STAGING}: rank 0: ValueError: bad tensor"
    )
    assert isinstance(save_failure(_failures(), STAGING), CheckpointError)


def test_checkpoint_exception_is_not_an_exception_in_this_torch():
    """Why the save catches it by name: ``except Exception`` handlers miss it."""
    assert not issubclass(CheckpointException, Exception) or pytest.skip("torch changed it")


UNEXPECTED_POS = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
_Usage = namedtuple("_Usage", "total used free")


def _disk_free(monkeypatch, free: int) -> None:
    monkeypatch.setattr(_atomic.shutil, "disk_usage", lambda path: _Usage(1 << 30, 1 << 30, free))


@pytest.mark.parametrize("message", [UNEXPECTED_POS, "PytorchStreamWriter failed writing file"])
def test_torch_s_zip_writer_error_on_a_full_disk_is_disk_full(monkeypatch, message):
    """torch's writer hides the errno ("unexpected pos 704 vs 598" after a short write): with
    the disk out of space it is a full disk, as the one-process write says."""
    _disk_free(monkeypatch, 0)
    error = save_failure(_failures(RuntimeError(message)), STAGING)
    assert isinstance(error, DiskFullError) and error.errno == errno.ENOSPC
    assert error.strerror == f"disk full: could not write {STAGING}"


def test_torch_s_zip_writer_error_with_space_left_is_not_called_disk_full(monkeypatch):
    _disk_free(monkeypatch, 1 << 30)
    error = save_failure(_failures(RuntimeError(UNEXPECTED_POS)), STAGING)
    assert isinstance(error, CheckpointError) and "unexpected pos 704 vs 598" in str(error)


@pytest.mark.parametrize(("distributed", "name"), [(True, "checkpoint"), (False, "checkpoint.pt")])
def test_the_writer_names_the_checkpoint_the_run_writes(tmp_path, monkeypatch, distributed, name):
    """A sharded run writes ``checkpoint/``, a one-process run ``checkpoint.pt``: the disk-full
    message names that one."""

    def full(*args, **kwargs):
        raise DiskFullError(errno.ENOSPC, f"disk full: could not write {STAGING}", str(STAGING))

    monkeypatch.setattr(checkpoint_writer, "save_run_state", full)
    writer = CheckpointWriter(tmp_path)
    with pytest.raises(DiskFullError) as caught:
        writer.write(object(), epoch=1, position=None, distributed=distributed)
    assert caught.value.filename == str(tmp_path / name)
    assert str(caught.value).startswith(f"[Errno 28] disk full: could not write {tmp_path / name} ")


def test_a_sharded_save_whose_writer_fails_so_on_a_full_disk_says_disk_full(tmp_path, monkeypatch):
    """The whole sharded save in a one-rank gloo group, DCP's file writer made to fail with
    torch's "unexpected pos" error and the disk reported full: one DiskFullError, no
    checkpoint/ left half-written, nothing of the staging folder's files published."""
    from torch.distributed.checkpoint import filesystem

    import marginface
    from marginface.train.state.sharded_checkpoint import save_sharded_checkpoint

    def failing(self, plan, planner):
        raise RuntimeError(UNEXPECTED_POS)

    monkeypatch.setattr(filesystem.FileSystemWriter, "write_data", failing)
    _disk_free(monkeypatch, 0)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        model = torch.nn.Linear(3, 4)
        loss = marginface.create_loss("arcface", 5, 4)
        optimizer = torch.optim.SGD([*model.parameters(), *loss.parameters()], lr=0.1)
        run = tmp_path / "run"
        run.mkdir()
        with pytest.raises(DiskFullError) as caught:
            save_sharded_checkpoint(
                run, epoch=1, model=model, loss=loss, optimizer=optimizer, extra={}
            )
    finally:
        dist.destroy_process_group()
    assert "disk full: could not write" in str(caught.value)
    assert not (run / "checkpoint").exists()
