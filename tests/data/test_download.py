"""The download path against a local HTTP server: verified, atomic, clear when offline."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from marginface.data.download import (
    ChecksumError,
    DataFilesMissingError,
    DownloadError,
    RemoteFile,
    download_file,
    ensure_files,
    file_digest,
)

LABELS = "t10k-labels-idx1-ubyte.gz"
TRUNCATED = r"truncated/t10k.*(IncompleteRead|connection closed after)"
LABELS_SHA256 = "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.fixture
def served_labels(local_mirror, shared_file) -> Path:
    source = shared_file("mnist", LABELS)
    return Path(shutil.copy(source, local_mirror.root / LABELS))


def test_download_success_verifies_sha256(local_mirror, served_labels, tmp_path):
    remote = RemoteFile(LABELS, urls=(f"{local_mirror.url}/{LABELS}",), sha256=LABELS_SHA256)
    target = tmp_path / "out"
    path = download_file(remote, target)
    assert path == target / LABELS
    assert file_digest(path) == LABELS_SHA256
    assert path.read_bytes() == served_labels.read_bytes()
    assert _leftovers(target) == [LABELS]


def test_download_md5_when_no_sha256(local_mirror, served_labels, tmp_path):
    md5 = hashlib.md5(served_labels.read_bytes()).hexdigest()
    remote = RemoteFile(LABELS, urls=(f"{local_mirror.url}/{LABELS}",), md5=md5)
    assert file_digest(download_file(remote, tmp_path), "md5") == md5


def test_checksum_mismatch_raises_and_leaves_nothing(local_mirror, served_labels, tmp_path):
    corrupted = bytearray(served_labels.read_bytes())
    corrupted[100] ^= 0xFF
    (local_mirror.root / "corrupt.gz").write_bytes(bytes(corrupted))
    remote = RemoteFile(LABELS, urls=(f"{local_mirror.url}/corrupt.gz",), sha256=LABELS_SHA256)
    target = tmp_path / "out"
    with pytest.raises(ChecksumError, match=r"sha256 of t10k-labels.*expected f7ae60f9"):
        download_file(remote, target)
    assert _leftovers(target) == []


def test_second_mirror_used_when_first_is_corrupt(local_mirror, served_labels, tmp_path):
    (local_mirror.root / "bad").mkdir()
    (local_mirror.root / "bad" / LABELS).write_bytes(b"not the file")
    remote = RemoteFile(
        LABELS,
        urls=(f"{local_mirror.url}/bad/{LABELS}", f"{local_mirror.url}/{LABELS}"),
        sha256=LABELS_SHA256,
    )
    assert file_digest(download_file(remote, tmp_path / "out")) == LABELS_SHA256
    assert _leftovers(tmp_path / "out") == [LABELS]


def test_truncated_stream_leaves_no_partial_file(local_mirror, served_labels, tmp_path):
    remote = RemoteFile(
        LABELS, urls=(f"{local_mirror.url}/truncated/{LABELS}",), sha256=LABELS_SHA256
    )
    target = tmp_path / "out"
    with pytest.raises(DownloadError, match=TRUNCATED):
        download_file(remote, target)
    assert local_mirror.requests == [f"/truncated/{LABELS}"]
    assert _leftovers(target) == []


def test_existing_file_is_not_replaced_by_a_failed_download(local_mirror, served_labels, tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / LABELS).write_bytes(b"previous")
    remote = RemoteFile(
        LABELS, urls=(f"{local_mirror.url}/truncated/{LABELS}",), sha256=LABELS_SHA256
    )
    with pytest.raises(DownloadError, match=TRUNCATED):
        download_file(remote, target)
    assert (target / LABELS).read_bytes() == b"previous"
    assert _leftovers(target) == [LABELS]


def test_404_gives_offline_message(local_mirror, tmp_path):
    remote = RemoteFile(LABELS, urls=(f"{local_mirror.url}/{LABELS}",), sha256=LABELS_SHA256)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with pytest.raises(DataFilesMissingError) as info:
        ensure_files("mnist", [remote], data_dir)
    message = str(info.value)
    assert LABELS in message
    assert str(data_dir / "mnist") in message
    assert "--data-dir" in message and "MARGINFACE_DATA" in message
    assert "404" in message
    assert not (data_dir / "mnist").exists()  # the folder it created is removed again


def test_server_down_gives_offline_message(closed_port, tmp_path):
    remote = RemoteFile(
        LABELS, urls=(f"http://127.0.0.1:{closed_port}/{LABELS}",), sha256=LABELS_SHA256
    )
    with pytest.raises(DataFilesMissingError, match=r"(?s)missing.*--data-dir.*Download failed"):
        ensure_files("mnist", [remote], tmp_path, timeout=5)
    assert _leftovers(tmp_path / "mnist") == []


def test_no_download_lists_missing_files(tmp_path):
    remote = RemoteFile(LABELS, urls=("http://127.0.0.1:9/x",), sha256=LABELS_SHA256)
    with pytest.raises(DataFilesMissingError, match="download=False"):
        ensure_files("mnist", [remote], tmp_path, download=False)


def test_file_without_mirror_is_reported(tmp_path):
    remote = RemoteFile("att_faces.tar")
    with pytest.raises(DataFilesMissingError, match="no public mirror"):
        ensure_files("orl", [remote], tmp_path)


def test_local_files_found_in_subfolder_or_directly(tmp_path):
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / "a.gz").write_bytes(b"x")
    (tmp_path / "b").write_bytes(b"y")
    files = [RemoteFile("a.gz"), RemoteFile("b.gz", aliases=("b",))]
    found = ensure_files("mnist", files, tmp_path, download=False)
    assert found == {"a.gz": tmp_path / "mnist" / "a.gz", "b.gz": tmp_path / "b"}


def test_nonexistent_data_dir_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"data_dir .*does not exist"):
        ensure_files("mnist", [RemoteFile("a")], tmp_path / "nope")


def test_env_data_dir_is_used(tmp_path, monkeypatch):
    (tmp_path / "a").write_bytes(b"x")
    monkeypatch.setenv("MARGINFACE_DATA", str(tmp_path))
    assert ensure_files("mnist", [RemoteFile("a")], None, download=False) == {"a": tmp_path / "a"}


def test_remote_file_needs_a_digest_with_urls():
    with pytest.raises(ValueError, match=r"no sha256 or md5 \(pass unverified=True"):
        RemoteFile("a", urls=("http://127.0.0.1/a",))
    assert RemoteFile("a", urls=("http://127.0.0.1/a",), unverified=True).digest is None


def test_unverified_file_is_kept_complete_and_unchecked(local_mirror, served_labels, tmp_path):
    """``unverified=True``: no digest to compare, but the transfer must still be complete."""
    url = f"{local_mirror.url}/{LABELS}"
    remote = RemoteFile(LABELS, urls=(url,), unverified=True)
    assert remote.digest is None and remote.algorithm == "sha256"
    seen: list[tuple[int, int | None]] = []
    path = download_file(
        remote, tmp_path / "out", progress=lambda got, total: seen.append((got, total))
    )
    assert path.read_bytes() == served_labels.read_bytes()
    size = served_labels.stat().st_size
    assert seen and seen[-1] == (size, size)  # the Content-Length is the total
    assert [got for got, _ in seen] == sorted(got for got, _ in seen)
    truncated = RemoteFile(
        LABELS, urls=(f"{local_mirror.url}/truncated/{LABELS}",), unverified=True
    )
    with pytest.raises(DownloadError, match=TRUNCATED):
        download_file(truncated, tmp_path / "other")
    assert _leftovers(tmp_path / "other") == []


def test_default_folder_is_the_cache(local_mirror, served_labels, tmp_path, monkeypatch):
    monkeypatch.delenv("MARGINFACE_DATA", raising=False)
    monkeypatch.delenv("MARGINFACE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    remote = RemoteFile(LABELS, urls=("http://unused.invalid/x",), sha256=LABELS_SHA256)
    found = ensure_files("mnist", [remote], None, mirrors=[local_mirror.url])
    assert found[LABELS] == tmp_path / "xdg" / "marginface" / "mnist" / LABELS
    assert file_digest(found[LABELS]) == LABELS_SHA256


def _pinned_files() -> list[tuple[str, RemoteFile]]:
    from marginface.data.lfw import LFW_PAIRS
    from marginface.data.mnist import FASHION_MNIST_FILES, MNIST_FILES
    from marginface.data.omniglot import OMNIGLOT_FILES

    return [
        *(("mnist", remote) for remote in MNIST_FILES),
        *(("fashion-mnist", remote) for remote in FASHION_MNIST_FILES if "labels" in remote.name),
        *(("omniglot", remote) for remote in OMNIGLOT_FILES.values()),
        ("lfw", LFW_PAIRS),
    ]


@pytest.mark.parametrize(("folder", "remote"), _pinned_files(), ids=lambda v: getattr(v, "name", v))
def test_pinned_digests_match_the_shared_files(folder, remote, shared_file):
    """The sha256 pins (MNIST, the Fashion-MNIST label files, Omniglot, LFW pairs) are the
    digests of the real files. (The Fashion-MNIST image files are md5-pinned, the publisher's
    value: no copy is at hand to compute their sha256.)"""
    assert remote.algorithm == "sha256"
    assert file_digest(shared_file(folder, remote.name), "sha256") == remote.digest
