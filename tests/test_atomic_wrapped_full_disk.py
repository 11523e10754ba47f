"""A full disk reported by a writer that wraps or hides the ``OSError`` (issue 39): ONNX's
exporter wrapped in "cannot be exported", safetensors' Rust error, an ``OSError`` as the cause
of another exception; all become :class:`DiskFullError` naming the target."""

from __future__ import annotations

import errno

import pytest

from marginface._atomic import DiskFullError, atomic_write_with


class SafetensorError(Exception):
    """Stands for ``safetensors_rust.SafetensorError`` (no errno, only words)."""


def _wrapped(file):
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError as error:
        raise RuntimeError("model SeedCNN cannot be exported to ONNX") from error


def _safetensors(file):
    raise SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    )


@pytest.mark.parametrize(
    "write", [_wrapped, _safetensors], ids=["wrapped-oserror", "safetensors-words"]
)
def test_a_hidden_full_disk_is_disk_full_naming_the_target(tmp_path, write):
    target = tmp_path / "model.onnx"
    target.write_bytes(b"previous")
    with pytest.raises(DiskFullError) as caught:
        atomic_write_with(target, write)
    assert caught.value.strerror == f"disk full: could not write {target}"
    assert target.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_other_failures_stay_what_they_are(tmp_path):
    def refuse(file):
        raise RuntimeError("model SeedCNN cannot be exported to ONNX: unsupported operator")

    with pytest.raises(RuntimeError, match="unsupported operator"):
        atomic_write_with(tmp_path / "model.onnx", refuse)
