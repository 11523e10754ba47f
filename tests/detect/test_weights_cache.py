"""MTCNN's weights without facenet-pytorch installed: fetched from a real HTTP server on
127.0.0.1 into the model cache, checked by SHA-256, found there by ``load_detector("mtcnn")``,
and ``marginface detect --download-weights``."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from marginface.cli import main
from marginface.data.download import ChecksumError, DownloadError
from marginface.detect import MTCNN, WeightsError, load_detector, weights_cache
from marginface.detect.weights_cache import (
    MTCNN_CACHE_NAME,
    MTCNN_WEIGHTS_SHA256,
    cached_mtcnn_weights,
    locate_mtcnn_weights,
    mtcnn_cache_dir,
)
from marginface.models.download import default_models_dir, fetch_mtcnn_weights
from tests.data.conftest import LocalMirror

NAMES = ("pnet", "rnet", "onet")


@pytest.fixture
def mirror(tmp_path: Path, mtcnn_weights: Path) -> Iterator[LocalMirror]:
    """A server on 127.0.0.1 serving the installed facenet-pytorch's three files."""
    root = tmp_path / "served"
    root.mkdir()
    for name in NAMES:
        shutil.copy(mtcnn_weights / f"{name}.pt", root / f"{name}.pt")
    with LocalMirror(root) as server:
        yield server


@pytest.fixture
def not_installed(monkeypatch):
    """facenet-pytorch looks absent: only the cache can give the weights."""

    def absent():
        raise WeightsError("MTCNN weights not found (facenet-pytorch is not installed)")

    monkeypatch.setattr(weights_cache, "find_mtcnn_weights", absent)


def test_the_checksums_are_the_installed_files(mtcnn_weights):
    """The SHA-256 marginface expects are those of facenet-pytorch 2.6.0's own files."""
    for name in NAMES:
        digest = hashlib.sha256((mtcnn_weights / f"{name}.pt").read_bytes()).hexdigest()
        assert MTCNN_WEIGHTS_SHA256[name] == digest, name


def test_fetched_once_then_found_in_the_cache(mirror, tmp_path, not_installed):
    cache = tmp_path / "cache"
    url = f"{mirror.url}/{{name}}.pt"
    folder = fetch_mtcnn_weights(cache_dir=cache, url=url, progress=False)
    assert folder == cache / MTCNN_CACHE_NAME
    assert sorted(p.name for p in folder.iterdir()) == ["onet.pt", "pnet.pt", "rnet.pt"]
    assert sorted(mirror.requests) == ["/onet.pt", "/pnet.pt", "/rnet.pt"]
    assert fetch_mtcnn_weights(cache_dir=cache, url=url, progress=False) == folder
    assert len(mirror.requests) == 3  # verified in the cache: no second download
    assert cached_mtcnn_weights(cache) == folder == locate_mtcnn_weights(cache)


def test_load_detector_uses_the_cache_when_not_installed(
    mirror, tmp_path, monkeypatch, not_installed, lfw_rgb
):
    monkeypatch.setenv("MARGINFACE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(WeightsError, match="marginface detect --download-weights"):
        load_detector("mtcnn")
    fetch_mtcnn_weights(url=f"{mirror.url}/{{name}}.pt", progress=False)
    detector = load_detector("mtcnn")
    reference = MTCNN(mirror.root)  # the same files, read from the served folder
    got, expected = detector.detect(lfw_rgb[0])[0], reference.detect(lfw_rgb[0])[0]
    np.testing.assert_array_equal(got.boxes, expected.boxes)
    np.testing.assert_array_equal(got.landmarks, expected.landmarks)


def test_other_bytes_are_refused_and_not_kept(mirror, tmp_path, not_installed):
    (mirror.root / "rnet.pt").write_bytes(b"not the published rnet")
    cache = tmp_path / "cache"
    with pytest.raises(ChecksumError, match="rnet.pt"):
        fetch_mtcnn_weights(cache_dir=cache, url=f"{mirror.url}/{{name}}.pt", progress=False)
    assert not (cache / MTCNN_CACHE_NAME / "rnet.pt").exists()
    assert cached_mtcnn_weights(cache) is None
    # a damaged cached file is not used either
    folder = cache / MTCNN_CACHE_NAME
    for name in NAMES:
        shutil.copy(mirror.root / f"{name}.pt", folder / f"{name}.pt")
    assert cached_mtcnn_weights(cache) is None
    with pytest.raises(WeightsError, match="neither installed nor in"):
        locate_mtcnn_weights(cache)


def test_a_failed_download_is_one_line(tmp_path, not_installed, closed_port):
    with pytest.raises(DownloadError) as info:
        fetch_mtcnn_weights(
            cache_dir=tmp_path, url=f"http://127.0.0.1:{closed_port}/{{name}}.pt", progress=False
        )
    assert "\n" not in str(info.value) and "pnet.pt" in str(info.value)
    with pytest.raises(ValueError, match="url must hold"):
        fetch_mtcnn_weights(cache_dir=tmp_path, url="http://127.0.0.1/pnet.pt")


def test_detect_download_weights(mirror, tmp_path, monkeypatch, not_installed, capsys):
    monkeypatch.setenv("MARGINFACE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(weights_cache, "MTCNN_WEIGHTS_URL", f"{mirror.url}/{{name}}.pt")
    assert main(["detect", "--download-weights", "-q"]) == 0
    folder = tmp_path / "cache" / "models" / MTCNN_CACHE_NAME
    assert cached_mtcnn_weights(tmp_path / "cache" / "models") == folder
    assert main(["detect", "--out", str(tmp_path / "f.jsonl")]) == 2
    assert "expected detect PHOTOS... --out FACES.jsonl" in capsys.readouterr().err


@pytest.fixture
def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    "env",
    [
        {"MARGINFACE_CACHE": "/c/mf"},
        {"XDG_CACHE_HOME": "/c/xdg"},
        {},
    ],
)
def test_the_cache_folder_is_the_model_caches(monkeypatch, env):
    """detect/ restates the model cache's place (it imports no pipeline module): the same as
    models.download.default_models_dir under every setting."""
    for name in ("MARGINFACE_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert mtcnn_cache_dir() == default_models_dir() / MTCNN_CACHE_NAME
