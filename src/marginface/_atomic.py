"""Atomic file writes, shared by every file the project writes (checkpoints, configs, reports,
plots, exports, downloads, caches).

A write goes to a temporary file *beside* the target, named ``.<name>.<pid>.<random>.tmp``, is
flushed and fsync'd, given the permissions a plain ``open(..., "w")`` would have under the
user's umask (``0o666 & ~umask``; ``mkstemp`` alone leaves ``0o600``), and only then moved over
the target with :func:`os.replace`. A crash at any instant leaves either the old file or the new
one, never a mixture; the temporary file of a killed writer carries its process id, so
:func:`remove_stale_temporaries` can delete it on the next run without touching the temporary
file of a writer that is still alive. (It also recognises ``.<name>.tmp-<pid>``, the name that
versions before this module gave their checkpoint, report and evaluation temporaries.)

A full disk is reported as :class:`DiskFullError` naming the file that could not be written,
whatever layer noticed it (``OSError`` with ``ENOSPC``/``EDQUOT``, torch's serializer's
``RuntimeError`` that only says "file write failed", safetensors' error that says "No space left
on device", or any of them wrapped in another exception).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "DISK_FULL_ERRNOS",
    "DiskFullError",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_with",
    "default_file_mode",
    "looks_like_full_disk",
    "remove_stale_temporaries",
]

_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]+\.(?:tmp|part)$")
_OLD_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)$")  # before this module
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG})
"""The ``errno`` values of a full file system (or a quota, or a file-size limit)."""
_WRITER_FAILURES = ("write", "unexpected pos", "inline_container")
"""Words of torch's serializer errors that may mean a full disk (then checked by free space)."""


class DiskFullError(OSError):
    """A file could not be written because its file system is full (or over quota).

    ``filename`` is the file that was being written; the previous version of it, if any, is
    left in place.
    """


def default_file_mode() -> int:
    """``0o666 & ~umask``: the mode ``open(path, "w")`` gives a new file."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no portable way to read the umask without setting it
    os.umask(mask)
    return 0o666 & ~mask


_FULL_DISK_WORDS = ("no space left on device", "os error 28", "disk quota exceeded")
"""Words of a full disk in errors that carry no ``errno`` (safetensors' Rust writer's
``SafetensorError``, a writer's ``RuntimeError`` wrapping the ``OSError`` as text)."""


def looks_like_full_disk(error: BaseException, folder: Path, written: int = 0) -> bool:
    """Whether ``error`` (or an exception it wraps) says that ``folder``'s file system is full.

    True for an ``OSError`` with an errno of :data:`DISK_FULL_ERRNOS`, an error whose text says
    "No space left on device" (or "os error 28", "Disk quota exceeded"), or torch's zip
    writer's ``RuntimeError`` that hides the errno ("file write failed", "unexpected pos 704 vs
    598") when ``folder`` has at most ``max(written, 64 KiB)`` bytes free. ``written``: the
    bytes the failed write had produced (0: unknown).
    """
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:  # a wrapper names it, or its cause does
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in DISK_FULL_ERRNOS:
            return True
        if any(words in str(cause).lower() for words in _FULL_DISK_WORDS):
            return True
        cause = cause.__cause__ or cause.__context__
    text = str(error).lower()
    if isinstance(error, RuntimeError) and any(sign in text for sign in _WRITER_FAILURES):
        # torch's zip writer hides the errno ("[enforce fail at inline_container.cc] .
        # PytorchStreamWriter failed writing file ...: file write failed", or, when a short
        # write went unnoticed, "... unexpected pos 826112 vs 826000"): ask the file system.
        with contextlib.suppress(OSError):
            return shutil.disk_usage(folder).free <= max(written, 1 << 16)
    return False


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid() or not 0 < pid < 2**31:
        return True  # ours, or no process id at all: not a temporary we can tell is stale
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temporaries(folder: str | os.PathLike[str], name: str | None = None) -> list[Path]:
    """Delete the temporary files that killed writers left in ``folder``.

    Only files named like this module's temporaries (``.<name>.<pid>.<random>.tmp`` or
    ``.part``, or the older ``.<name>.tmp-<pid>``) whose process is gone are removed; ``name``
    restricts it to one target's.

    Returns:
        The paths removed.
    """
    folder = Path(folder)
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        match = _TEMPORARY.match(entry.name) or _OLD_TEMPORARY.match(entry.name)
        if match is None or (name is not None and match["name"] != name):
            continue
        if _pid_alive(int(match["pid"])) or not entry.is_file():
            continue
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
            removed.append(entry)
    return removed


@contextlib.contextmanager
def _temporary_beside(target: Path, suffix: str, mode: int | None) -> Iterator[Path]:
    """A closed, empty temporary file beside ``target``, moved over it on a clean exit."""
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(
        prefix=f".{target.name}.{os.getpid()}.", suffix=suffix, dir=folder
    )
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
        os.chmod(temporary, default_file_mode() if mode is None else mode)
        os.replace(temporary, target)
    except BaseException as error:
        size = 0
        with contextlib.suppress(OSError):
            size = temporary.stat().st_size
            temporary.unlink()
        if looks_like_full_disk(error, folder, size):
            raise DiskFullError(
                errno.ENOSPC, f"disk full: could not write {target}", str(target)
            ) from error
        raise


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], *, suffix: str = ".tmp", mode: int | None = None
) -> Iterator[IO[bytes]]:
    """Open a temporary binary file beside ``path``; on a clean exit, fsync it, set its mode
    and move it over ``path``. On an exception nothing at ``path`` changes and the temporary
    file is removed.

    Args:
        path: the target file. Its folder is created if missing.
        suffix: ``.tmp`` (default) or ``.part`` (downloads).
        mode: permission bits of the result. Default: :func:`default_file_mode`.

    Raises:
        DiskFullError: the file system is full; names ``path``.
        OSError: the folder cannot be created or written (``PermissionError``,
            ``NotADirectoryError``...), with ``filename`` set.
    """
    with _temporary_beside(Path(path), suffix, mode) as temporary, open(temporary, "wb") as stream:
        yield stream


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_write`). Returns the path."""
    with atomic_write(path) as stream:
        stream.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically (see :func:`atomic_write`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_with(
    path: str | os.PathLike[str], write: Callable[[Path], Any], *, suffix: str = ".tmp"
) -> Path:
    """Let ``write(temporary_path)`` produce the file (for writers that want a path, such as
    ``torch.jit.save`` or ONNX), then move it over ``path`` as :func:`atomic_write` does."""
    with _temporary_beside(Path(path), suffix, None) as temporary:
        write(temporary)
    return Path(path)
