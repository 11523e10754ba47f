"""Fault injection on the data path (issue 13): a server that trickles bytes is cut off at the
overall deadline, temporaries of killed downloads are removed by the next download (never those
of a live process), and a corrupt byte in a gzip'd IDX file is an IdxFormatError naming it."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from marginface.data.download import (
    DEADLINE_ENV,
    DownloadError,
    RemoteFile,
    default_deadline,
    download_file,
    file_digest,
)
from marginface.data.idx import IdxFormatError, read_idx

LABELS = "t10k-labels-idx1-ubyte.gz"
LABELS_SHA256 = "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"


@pytest.fixture
def dead_pid() -> int:
    """The process id of a process that has exited (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    """The process id of another process that is alive for the whole test."""
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


# ------------------------------------------------------------------ overall deadline
def _trickled(local_mirror) -> RemoteFile:
    url = f"{local_mirror.url}/trickle/{LABELS}"
    return RemoteFile(LABELS, urls=(url,), sha256=LABELS_SHA256)


@pytest.mark.parametrize("folder_exists", [False, True])
def test_a_trickling_server_is_cut_off_at_the_deadline_and_leaves_nothing(
    local_mirror, tmp_path, folder_exists
):
    remote = _trickled(local_mirror)
    target = tmp_path / "out"
    if folder_exists:
        target.mkdir()
    started = time.monotonic()
    with pytest.raises(DownloadError) as caught:
        # the per-read timeout (5 s) never fires: a byte arrives every 0.2 s
        download_file(remote, target, timeout=5, deadline=1.0)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 4.0
    message = str(caught.value)
    assert remote.urls[0] in message and "deadline of 1 s" in message
    assert DEADLINE_ENV in message  # how to allow more time
    if folder_exists:
        assert list(target.iterdir()) == []
    else:
        assert not target.exists()
    assert local_mirror.requests == [f"/trickle/{LABELS}"]


def test_the_deadline_comes_from_the_environment(local_mirror, tmp_path, monkeypatch):
    monkeypatch.setenv(DEADLINE_ENV, "1")
    assert default_deadline() == 1.0
    started = time.monotonic()
    with pytest.raises(DownloadError, match="deadline of 1 s"):
        download_file(_trickled(local_mirror), tmp_path / "out", timeout=5)
    assert time.monotonic() - started < 4.0
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["soon", "0", "-3", "nan", "inf"])
def test_a_bad_deadline_in_the_environment_is_named(tmp_path, monkeypatch, value):
    monkeypatch.setenv(DEADLINE_ENV, value)
    remote = RemoteFile(LABELS, urls=("http://127.0.0.1:9/x",), sha256=LABELS_SHA256)
    with pytest.raises(ValueError, match=rf"{DEADLINE_ENV} must be a positive number.*{value!r}"):
        download_file(remote, tmp_path / "out", timeout=5)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ temporaries of killed downloads
def test_temporaries_of_killed_downloads_are_removed_but_not_a_live_ones(
    local_mirror, shared_file, tmp_path, dead_pid, live_pid
):
    shutil.copy(shared_file("mnist", LABELS), local_mirror.root / LABELS)
    target = tmp_path / "out"
    target.mkdir()
    stale = [
        target / f".{LABELS}.{dead_pid}.x1y2z3ab.part",  # the same file, killed
        target / f".train-images-idx3-ubyte.gz.{dead_pid}.q9w8e7rt.part",  # another file
    ]
    alive = target / f".train-labels-idx1-ubyte.gz.{live_pid}.a1b2c3d4.part"
    for path in (*stale, alive):
        path.write_bytes(b"partial")
    remote = RemoteFile(LABELS, urls=(f"{local_mirror.url}/{LABELS}",), sha256=LABELS_SHA256)
    path = download_file(remote, target)
    assert file_digest(path) == LABELS_SHA256
    assert sorted(p.name for p in target.iterdir()) == sorted([LABELS, alive.name])


# ------------------------------------------------------------------ a corrupt byte in a gzip'd IDX
def _own_gzip_idx(folder: Path) -> Path:
    labels = (np.arange(3000) % 10).astype(np.uint8)
    raw = bytes([0, 0, 0x08, 1]) + len(labels).to_bytes(4, "big") + labels.tobytes()
    path = folder / "own-labels-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(raw, mtime=0))
    return path


def _deflate_start(data: bytes) -> int:
    """Offset of the compressed data: after the 10-byte header and the optional name (the
    header's time, flags and name are outside gzip's CRC, so flipping them is harmless)."""
    start = 10
    if data[3] & 0x08:  # FNAME: a zero-terminated file name
        start = data.index(b"\0", start) + 1
    return start


@pytest.mark.parametrize("source", ["mnist", "own"])
def test_a_corrupt_byte_in_a_gzip_idx_names_the_file(tmp_path, shared_file, source):
    if source == "mnist":
        original = Path(shutil.copy(shared_file("mnist", LABELS), tmp_path / LABELS))
    else:
        original = _own_gzip_idx(tmp_path)
    intact = original.read_bytes()
    assert read_idx(original).ndim == 1
    start = _deflate_start(intact)
    # spread over the compressed data, plus the CRC-32 and length at the end
    positions = sorted(
        {start + (len(intact) - 9 - start) * i // 29 for i in range(30)}
        | set(range(len(intact) - 8, len(intact)))
    )
    damaged = tmp_path / f"damaged-{original.name}"
    for position in positions:
        data = bytearray(intact)
        data[position] ^= 0xFF
        damaged.write_bytes(bytes(data))
        with pytest.raises(IdxFormatError) as caught:
            read_idx(damaged)
        assert str(damaged) in str(caught.value), position
