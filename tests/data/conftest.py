"""Shared fixtures for the dataset tests: the offline data folder and a local HTTP mirror."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests._shared_data import SHARED_DATA, require_shared_file


@pytest.fixture(scope="session")
def shared_file():
    """``shared_file("mnist", name)``: a file under ``../shared/data``; skips when absent,
    fails when absent under ``CI=true`` (:func:`tests._shared_data.require_shared_file`)."""
    return require_shared_file


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The offline data folder ``../shared/data`` (resolved)."""
    return SHARED_DATA


class LocalMirror:
    """A threaded HTTP server on 127.0.0.1 serving a folder, with a truncating route
    (``/truncated/<name>``: half the body, then the connection closes) and a trickling one
    (``/trickle/<name>``: a 1 GiB Content-Length, then one byte every 0.2 s)."""

    TRICKLE_SECONDS = 0.2

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        self.stopping = threading.Event()
        mirror = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs) -> None:
                super().__init__(*args, directory=str(root), **kwargs)

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                mirror.requests.append(self.path)
                if self.path.startswith("/truncated/"):
                    body = (root / self.path.removeprefix("/truncated/")).read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if self.path.startswith("/trickle/"):
                    self.send_response(200)
                    self.send_header("Content-Length", str(1 << 30))
                    self.end_headers()
                    for _ in range(300):  # a minute at most, or until the client hangs up
                        try:
                            self.wfile.write(b"\0")
                            self.wfile.flush()
                        except OSError:
                            break
                        if mirror.stopping.wait(mirror.TRICKLE_SECONDS):
                            break
                    self.close_connection = True
                    return
                super().do_GET()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> LocalMirror:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def local_mirror(tmp_path: Path) -> Iterator[LocalMirror]:
    """An HTTP mirror on 127.0.0.1 serving ``tmp_path / "served"`` (empty; tests fill it)."""
    root = tmp_path / "served"
    root.mkdir()
    with LocalMirror(root) as mirror:
        yield mirror


@pytest.fixture
def closed_port() -> int:
    """A local port with nothing listening (bound then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
