"""RecordIO files (MXNet's and insightface's ``train.rec`` + ``train.idx``), read and written
without MXNet; the format itself is :mod:`marginface.data.recordio_format`.

:class:`RecordReader` reads records at random through the index: every offset and length is
checked against the bytes actually present (a corrupt length never allocates), the file is read
with ``os.pread`` on one descriptor per process, opened lazily (so a reader handed to
``DataLoader`` workers, forked or spawned, gives each its own), and memory is the index only
(two ``int64`` per record), whatever the size of the ``.rec``. :class:`RecordWriter` writes a
``.rec`` and its ``.idx`` atomically (see :mod:`marginface._atomic`).

Every malformed input raises :class:`RecordFormatError` (a ``ValueError``) naming the file and
the record.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np

from .._atomic import atomic_write
from .recordio_format import (
    _HEADER,
    IMAGE_HEADER_SIZE,
    MAX_RECORD_BYTES,
    RECORD_MAGIC,
    ImageHeader,
    RecordFormatError,
    _read_framed,
    encode_record,
    iter_records,
    pack_image_record,
    read_index,
    unpack_image_record,
)

__all__ = [
    "IMAGE_HEADER_SIZE",
    "MAX_RECORD_BYTES",
    "RECORD_MAGIC",
    "ImageHeader",
    "RecordFormatError",
    "RecordReader",
    "RecordWriter",
    "encode_record",
    "iter_records",
    "pack_image_record",
    "read_index",
    "rebuild_index",
    "unpack_image_record",
]


# ------------------------------------------------------------------ reader
class RecordReader:
    """Random access to the records of a ``.rec`` file through its ``.idx``.

    Args:
        path: the ``.rec`` file.
        index_path: its index. Default: ``path`` with the suffix ``.idx``.

    Attributes:
        path, index_path: the files.
        keys: ``int64[N]``, the indexed keys, ascending.
        size: the ``.rec``'s size in bytes when opened.

    The index is read (and every offset checked against the file size) at construction and kept
    as two ``int64`` arrays (the offsets by key and the distinct offsets in file order; the keys
    too unless they are contiguous): 16 bytes per record, about 95 MB for MS1M's 5.8 M, shared
    copy-on-write with forked ``DataLoader`` workers. The ``.rec`` is opened on first use in
    each process; a reader pickles without its descriptor.

    Raises:
        FileNotFoundError: either file is missing (a missing index: the message gives the
            command that rebuilds it, :func:`rebuild_index`).
        RecordFormatError: see :func:`read_index`.
    """

    def __init__(
        self, path: str | os.PathLike[str], index_path: str | os.PathLike[str] | None = None
    ) -> None:
        self.path = Path(path)
        self.index_path = (
            Path(index_path) if index_path is not None else self.path.with_suffix(".idx")
        )
        self.size = self.path.stat().st_size
        if not self.index_path.is_file():
            raise FileNotFoundError(
                f"{self.index_path}: missing (the index of {self.path}); rebuild it from the "
                f".rec with: marginface convert --reindex {self.path}"
            )
        keys, offsets = read_index(
            self.index_path, record_file_size=self.size, record_file=self.path
        )
        order = np.argsort(keys, kind="stable")
        keys, self._offsets = keys[order], offsets[order]  # by key
        # a record ends before the next record that the index knows of (or the end of file)
        self._starts = np.unique(offsets)
        del offsets, order
        self._count = int(keys.size)
        self._first_key = int(keys[0]) if self._count else 0
        contiguous = not self._count or int(keys[-1]) - self._first_key == self._count - 1
        # contiguous keys (the usual case) are not stored: 16 bytes per record in all
        self._keys: np.ndarray | None = None if contiguous else keys
        self._handle: IO[bytes] | None = None
        self._pid = -1
        self._lock = threading.Lock()

    # -------------------------------------------------------------- process-local descriptor
    def _descriptor(self) -> IO[bytes]:
        if self._handle is None or self._pid != os.getpid():
            self._handle = open(self.path, "rb", buffering=0)  # noqa: SIM115 - kept open
            self._pid = os.getpid()
        return self._handle

    def _read_at(self, offset: int, count: int) -> bytes:
        handle = self._descriptor()
        if hasattr(os, "pread"):
            chunks = []
            while count > 0:
                chunk = os.pread(handle.fileno(), count, offset)
                if not chunk:
                    break
                chunks.append(chunk)
                offset += len(chunk)
                count -= len(chunk)
            return b"".join(chunks)
        with self._lock:  # pragma: no cover - platforms without pread
            handle.seek(offset)
            return handle.read(count)

    def close(self) -> None:
        """Close this process's descriptor (reopened on the next read)."""
        if self._handle is not None and self._pid == os.getpid():
            self._handle.close()
        self._handle = None

    def __enter__(self) -> RecordReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handle"], state["_pid"], state["_lock"] = None, -1, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -------------------------------------------------------------- lookups
    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: object) -> bool:
        try:
            self.offset(int(key))  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError):
            return False
        return True

    @property
    def keys(self) -> np.ndarray:
        """``int64[N]``: the indexed keys, ascending."""
        if self._keys is not None:
            return self._keys
        return np.arange(self._first_key, self._first_key + self._count, dtype=np.int64)

    def offset(self, key: int) -> int:
        """The byte offset of record ``key``; ``KeyError`` when the index does not list it."""
        if self._keys is None:
            row = key - self._first_key
            if 0 <= row < self._count:
                return int(self._offsets[row])
        else:
            row = int(np.searchsorted(self._keys, key))
            if row < self._count and self._keys[row] == key:
                return int(self._offsets[row])
        raise KeyError(f"{self.index_path}: no record {key}")

    def read(self, key: int, *, prefix: int | None = None) -> bytes:
        """The payload of record ``key`` (multi-part records joined).

        Args:
            key: the record's key in the index.
            prefix: read only the record's first ``prefix`` bytes (all of it when shorter;
                for headers). None: the whole record.

        Raises:
            KeyError: the index does not list ``key``.
            RecordFormatError: no record at its offset (bad magic), or the record runs past the
                end of the file or into the next indexed record.
        """
        offset = self.offset(key)
        position = int(np.searchsorted(self._starts, offset, side="right"))
        end = int(self._starts[position]) if position < self._starts.size else self.size
        payload, _ = _read_framed(
            self._read_at,
            offset,
            end,
            f"{self.path}: record {key}",
            file_size=self.size,
            limit=prefix,
        )
        return payload if prefix is None else payload[:prefix]

    def read_at(self, offset: int) -> tuple[bytes, int]:
        """The payload of the record at byte ``offset`` and the offset of the next record."""
        where = f"{self.path}: record at byte {offset}"
        return _read_framed(self._read_at, offset, self.size, where, file_size=self.size)

    def read_header(self, key: int) -> ImageHeader:
        """The :class:`ImageHeader` of record ``key``, reading only its first bytes."""
        where = f"{self.path}: record {key}"
        payload = self.read(key, prefix=_HEADER.size + 64)
        if len(payload) >= _HEADER.size:
            flag = _HEADER.unpack_from(payload)[0]
            if len(payload) < _HEADER.size + 4 * flag:
                payload = self.read(key)
        return unpack_image_record(payload, where=where)[0]


# ------------------------------------------------------------------ writer
class RecordWriter:
    """Write a ``.rec`` file and its ``.idx`` atomically.

    Use as a context manager: records go to temporary files beside the targets, which replace
    ``path`` and ``index_path`` only when the ``with`` block ends without an exception
    (``.rec`` first, then ``.idx``); on an exception both temporaries are removed and any
    previous files are left as they were.

    Args:
        path: the ``.rec`` file.
        index_path: its index. Default: ``path`` with the suffix ``.idx``.

    Example::

        with RecordWriter(out / "train.rec") as writer:
            writer.write(0, pack_image_record([1.0, 5.0], b""))
    """

    def __init__(
        self, path: str | os.PathLike[str], index_path: str | os.PathLike[str] | None = None
    ) -> None:
        self.path = Path(path)
        self.index_path = (
            Path(index_path) if index_path is not None else self.path.with_suffix(".idx")
        )
        self._stack: contextlib.ExitStack | None = None
        self._rec: IO[bytes] | None = None
        self._idx: IO[bytes] | None = None
        self._position = 0
        self.count = 0

    def __enter__(self) -> RecordWriter:
        stack = contextlib.ExitStack()
        try:
            # entered idx first so that it is committed after the .rec (exit order is LIFO)
            self._idx = stack.enter_context(atomic_write(self.index_path))
            self._rec = stack.enter_context(atomic_write(self.path))
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        stack, self._stack, self._rec, self._idx = self._stack, None, None, None
        if stack is None:
            return False
        return bool(stack.__exit__(kind, error, traceback))

    def write(self, key: int, payload: bytes) -> int:
        """Append one record under ``key``; returns its byte offset.

        Raises:
            RuntimeError: the writer is not open (use it as a context manager).
            TypeError / ValueError: ``key`` is not a non-negative int, or the payload is too
                long (:data:`MAX_RECORD_BYTES`).
        """
        if self._rec is None or self._idx is None:
            raise RuntimeError(f"RecordWriter for {self.path} is not open; use 'with'")
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
            raise TypeError(f"key must be an int, got {key!r}")
        if key < 0:
            raise ValueError(f"key must be >= 0, got {key}")
        framed = encode_record(payload)
        offset = self._position
        self._rec.write(framed)
        self._idx.write(f"{int(key)}\t{offset}\n".encode("ascii"))
        self._position += len(framed)
        self.count += 1
        return offset


def rebuild_index(
    path: str | os.PathLike[str], index_path: str | os.PathLike[str] | None = None
) -> int:
    """Write the ``.idx`` of a ``.rec`` from the records themselves (``marginface convert
    --reindex``): one line ``key<TAB>offset`` per record, in file order, the key being the
    record's image-header ``id`` (what insightface's ``face2rec2.py`` and MXNet's ``im2rec``
    index it by). Written atomically; the ``.rec`` is read once, sequentially.

    Args:
        path: the ``.rec`` file.
        index_path: the index to write. Default: ``path`` with the suffix ``.idx``.

    Returns:
        The number of records indexed.

    Raises:
        FileNotFoundError: no ``.rec`` at ``path``.
        RecordFormatError: a record is malformed or shorter than an image header, or two
            records carry the same ``id`` (no index can tell them apart); named.
    """
    path = Path(path)
    target = Path(index_path) if index_path is not None else path.with_suffix(".idx")
    seen: dict[int, int] = {}
    lines = []
    for number, (offset, payload) in enumerate(iter_records(path)):
        if len(payload) < _HEADER.size:
            raise RecordFormatError(
                f"{path}: record #{number} at byte {offset}: {len(payload)} bytes, not an image "
                f"record (its {_HEADER.size}-byte header holds the key)"
            )
        key = int(_HEADER.unpack_from(payload)[2])
        if key in seen:
            raise RecordFormatError(
                f"{path}: records #{seen[key]} and #{number} both have id {key}; the index "
                "cannot be rebuilt from the ids"
            )
        seen[key] = number
        lines.append(f"{key}\t{offset}\n")
    with atomic_write(target) as stream:
        stream.write("".join(lines).encode("ascii"))
    return len(lines)
