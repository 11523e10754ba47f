"""fetch_weights against a real HTTP server on 127.0.0.1: verified, atomic, cached, one-line
errors, and the explicit unknown-checksum path; the published weights fetched end to end."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.data.conftest import LocalMirror

from marginface._progress import progress_output
from marginface.data.download import ChecksumError, DownloadError
from marginface.models import facenet
from marginface.models.download import (
    UnverifiedWeightsError,
    default_models_dir,
    fetch_weights,
)
from marginface.models.inception_resnet_v1 import InceptionResnetV1

NAME = "weights.pt"


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[LocalMirror]:
    """An HTTP server on 127.0.0.1 (a free port) serving ``tmp_path / "served"``, with
    ``/truncated/<name>`` (the full Content-Length, half the body, then the connection closes)."""
    root = tmp_path / "served"
    root.mkdir()
    with LocalMirror(root) as server:
        yield server


@pytest.fixture
def served(mirror: LocalMirror) -> tuple[bytes, str]:
    """``weights.pt``'s bytes on the server and their SHA-256."""
    body = os.urandom(300_000)
    (mirror.root / NAME).write_bytes(body)
    return body, hashlib.sha256(body).hexdigest()


@pytest.fixture
def refused_port() -> int:
    """A local port with nothing listening (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _contents(folder: Path) -> list[str]:
    """Every name in ``folder`` (hidden temporaries included), [] when it does not exist."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_success_then_cached_without_the_network(mirror, served, tmp_path):
    body, sha = served
    cache = tmp_path / "cache"
    received: list[tuple[int, int | None]] = []
    path = fetch_weights(
        f"{mirror.url}/{NAME}", sha, cache_dir=cache, progress=lambda *a: received.append(a)
    )
    assert path == cache / NAME and path.read_bytes() == body
    assert _contents(cache) == [NAME]
    assert received[-1] == (len(body), len(body))
    assert mirror.requests == [f"/{NAME}"]
    # cached with the right checksum: the server is not contacted again (upper-case digest too)
    assert fetch_weights(f"{mirror.url}/{NAME}", sha.upper(), cache_dir=cache) == path
    assert mirror.requests == [f"/{NAME}"]


def test_default_folder_is_the_cache_folders_models(mirror, served, tmp_path, monkeypatch):
    _, sha = served
    monkeypatch.setenv("MARGINFACE_CACHE", str(tmp_path / "home"))
    assert default_models_dir() == tmp_path / "home" / "models"
    assert fetch_weights(f"{mirror.url}/{NAME}", sha) == tmp_path / "home" / "models" / NAME
    with pytest.raises(DownloadError, match=r"at .*home/models/absent.pt \(or pass cache_dir="):
        fetch_weights(f"{mirror.url}/absent.pt", sha)
    monkeypatch.delenv("MARGINFACE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_models_dir() == tmp_path / "xdg" / "marginface" / "models"


def test_checksum_mismatch_keeps_nothing(mirror, served, tmp_path):
    cache = tmp_path / "cache"
    url = f"{mirror.url}/{NAME}"
    with pytest.raises(ChecksumError) as info:
        fetch_weights(url, "0" * 64, cache_dir=cache)
    message = _one_line(info)
    assert url in message and f"expected {'0' * 64}" in message
    assert f"put it (SHA-256 {'0' * 64}) at {cache / NAME}" in message
    assert _contents(cache) == []


def test_http_error_keeps_nothing(mirror, tmp_path):
    cache = tmp_path / "cache"
    url = f"{mirror.url}/absent.pt"
    with pytest.raises(DownloadError) as info:
        fetch_weights(url, "a" * 64, cache_dir=cache)
    message = _one_line(info)
    assert url in message and "404" in message and message.endswith(f"at {cache / 'absent.pt'}")
    assert _contents(cache) == []


def test_body_cut_short_keeps_nothing(mirror, served, tmp_path):
    _, sha = served
    cache = tmp_path / "cache"
    cache.mkdir()
    url = f"{mirror.url}/truncated/{NAME}"
    with pytest.raises(DownloadError) as info:
        fetch_weights(url, sha, cache_dir=cache)
    message = _one_line(info)
    assert url in message
    assert "IncompleteRead" in message or "connection closed after" in message
    assert _contents(cache) == []  # no partial file, no temporary


def test_refused_connection_keeps_nothing(refused_port, tmp_path):
    cache = tmp_path / "cache"
    url = f"http://127.0.0.1:{refused_port}/{NAME}"
    with pytest.raises(DownloadError) as info:
        fetch_weights(url, "b" * 64, cache_dir=cache, timeout=5)
    message = _one_line(info)
    assert url in message and "refused" in message.lower()
    assert _contents(cache) == []


def test_a_corrupt_cached_file_is_downloaded_again(mirror, served, tmp_path, caplog):
    body, sha = served
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / NAME).write_bytes(body[:1000])  # an interrupted copy put there by hand
    with caplog.at_level(logging.WARNING, logger="marginface.models.download"):
        path = fetch_weights(f"{mirror.url}/{NAME}", sha, cache_dir=cache)
    assert path.read_bytes() == body and mirror.requests == [f"/{NAME}"]
    assert "downloading it again" in caplog.text
    assert _contents(cache) == [NAME]


def test_a_corrupt_cached_file_is_removed_when_the_download_fails(refused_port, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / NAME).write_bytes(b"not the weights")
    wrong = hashlib.sha256(b"not the weights").hexdigest()
    with pytest.raises(DownloadError) as info:
        fetch_weights(f"http://127.0.0.1:{refused_port}/{NAME}", "c" * 64, cache_dir=cache)
    assert f"the cached copy (SHA-256 {wrong}) was removed" in _one_line(info)
    assert _contents(cache) == []


def test_unknown_checksum_is_reported_then_verified_from_the_cache(mirror, served, tmp_path):
    body, sha = served
    cache = tmp_path / "cache"
    url = f"{mirror.url}/{NAME}"
    with pytest.raises(UnverifiedWeightsError) as info:
        fetch_weights(url, None, cache_dir=cache)
    message = _one_line(info)
    assert info.value.sha256 == sha and f'pass sha256="{sha}"' in message and url in message
    assert isinstance(info.value, ValueError)
    # the complete download stays in the cache, unused; found there again without the network
    assert info.value.path == cache / NAME and (cache / NAME).read_bytes() == body
    with pytest.raises(UnverifiedWeightsError, match=sha):
        fetch_weights(url, None, cache_dir=cache)
    assert fetch_weights(url, sha, cache_dir=cache) == cache / NAME
    assert mirror.requests == [f"/{NAME}"]


def test_unknown_checksum_with_explicit_consent_is_logged(mirror, served, tmp_path, caplog):
    _, sha = served
    cache = tmp_path / "cache"
    with caplog.at_level(logging.WARNING, logger="marginface.models.download"):
        path = fetch_weights(f"{mirror.url}/{NAME}", None, cache_dir=cache, allow_unverified=True)
        assert fetch_weights(f"{mirror.url}/{NAME}", None, cache_dir=cache, allow_unverified=True)
    assert path == cache / NAME
    assert caplog.text.count(f"unverified: no SHA-256 was given; its SHA-256 is {sha}") == 2
    assert mirror.requests == [f"/{NAME}"]


def test_unknown_checksum_download_failure_keeps_nothing(mirror, served, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(DownloadError, match=r"IncompleteRead|connection closed after"):
        fetch_weights(f"{mirror.url}/truncated/{NAME}", None, cache_dir=cache, filename=NAME)
    assert _contents(cache) == []


def test_progress_lines_follow_progress_output(mirror, served, tmp_path, caplog):
    _, sha = served
    with caplog.at_level(logging.INFO, logger="marginface.progress"):
        with progress_output("lines", 0):
            fetch_weights(f"{mirror.url}/{NAME}", sha, cache_dir=tmp_path / "a")
        fetch_weights(f"{mirror.url}/{NAME}", sha, cache_dir=tmp_path / "b")  # outside: silent
    assert caplog.text.count(f"downloading {NAME}: 300000/300000 bytes (100%)") == 2  # line, done


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"sha256": "abc"}, ValueError, r"sha256 must be None or 64 hexadecimal digits, got 'abc'"),
        ({"sha256": "g" * 64}, ValueError, r"sha256 must be None or 64 hexadecimal"),
        ({"sha256": 5}, ValueError, r"sha256 must be None or 64 hexadecimal digits, got 5"),
        ({"url": "ftp://host/w.pt"}, ValueError, r"url must be an http:// or https:// URL"),
        ({"url": Path("w.pt")}, ValueError, r"url must be an http:// or https:// URL"),
        ({"url": "http://host/"}, ValueError, r"ends with no file name: pass filename="),
        ({"filename": "../w.pt"}, ValueError, r"filename must be a plain file name"),
        ({"filename": ".."}, ValueError, r"filename must be a plain file name, got '..'"),
        ({"allow_unverified": "yes"}, TypeError, r"allow_unverified must be a bool, got 'yes'"),
        ({"progress": "bar"}, TypeError, r"progress must be a bool or a callable, got 'bar'"),
    ],
)
def test_bad_arguments_are_named(arguments, error, match, tmp_path):
    call = {"url": "http://127.0.0.1:9/w.pt", "sha256": "d" * 64, **arguments}
    with pytest.raises(error, match=match):
        fetch_weights(call.pop("url"), call.pop("sha256"), cache_dir=tmp_path / "c", **call)
    assert _contents(tmp_path / "c") == []


def test_published_weights_fetched_end_to_end(mirror, tmp_path, monkeypatch):
    """``pretrained_inception_resnet_v1`` with the release URL pointed at the local server and
    a file laid out as the published ones (state_dict + ``logits``): the unknown checksum is
    reported first, then the file is verified and loaded from the cache."""
    model = InceptionResnetV1()
    state = dict(model.state_dict())
    state["logits.weight"] = torch.randn(10575, 512)
    state["logits.bias"] = torch.zeros(10575)
    published = facenet.PUBLISHED_WEIGHTS["casia-webface"]
    torch.save(state, mirror.root / published.filename)
    sha = hashlib.sha256((mirror.root / published.filename).read_bytes()).hexdigest()
    monkeypatch.setattr(facenet, "FACENET_RELEASE", mirror.url)
    cache = tmp_path / "cache"
    with pytest.raises(UnverifiedWeightsError, match=sha):
        facenet.pretrained_inception_resnet_v1("casia-webface", cache_dir=cache)
    loaded = facenet.pretrained_inception_resnet_v1("casia-webface", sha256=sha, cache_dir=cache)
    assert not loaded.training
    assert torch.equal(loaded.last_linear.weight, model.last_linear.weight)
    assert mirror.requests == [f"/{published.filename}"]
