"""marginface._atomic: a full disk is named whatever layer of torch's serializer noticed it."""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest
import torch

from marginface import _atomic
from marginface._atomic import DiskFullError, atomic_write_with

_Usage = namedtuple("_Usage", "total used free")

ZIP_WRITER_ERRORS = [
    "[enforce fail at inline_container.cc:672] . unexpected pos 826112 vs 826000",
    "[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file "
    "data/0: file write failed",
]


def _failing_save(message: str):
    def write(path):
        torch.save({"w": torch.zeros(4)}, path)  # a partial file, as a short write leaves
        raise RuntimeError(message)

    return write


@pytest.mark.parametrize("message", ZIP_WRITER_ERRORS)
def test_torch_zip_writer_errors_on_a_full_disk_name_the_file(tmp_path, monkeypatch, message):
    target = tmp_path / "checkpoint.pt"
    target.write_bytes(b"previous")
    monkeypatch.setattr(_atomic.shutil, "disk_usage", lambda path: _Usage(1 << 30, 1 << 30, 0))
    with pytest.raises(DiskFullError) as error:
        atomic_write_with(target, _failing_save(message))
    assert error.value.strerror == f"disk full: could not write {target}"
    assert error.value.filename == str(target)
    assert target.read_bytes() == b"previous"  # the previous version is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # no temporary left


@pytest.mark.parametrize("message", ZIP_WRITER_ERRORS)
def test_the_same_errors_with_space_left_are_not_called_a_full_disk(tmp_path, message):
    free = shutil.disk_usage(tmp_path).free
    assert free > 1 << 20  # the test needs a folder with space
    with pytest.raises(RuntimeError, match="inline_container") as error:
        atomic_write_with(tmp_path / "checkpoint.pt", _failing_save(message))
    assert not isinstance(error.value, DiskFullError)
