"""Reading IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or not.

Layout (big-endian): two zero bytes, a type code (``0x08`` uint8, ``0x09`` int8, ``0x0B`` int16,
``0x0C`` int32, ``0x0D`` float32, ``0x0E`` float64), the number of dimensions ``d``, then ``d``
uint32 sizes, then the data in C order. Compression is recognised by the gzip magic bytes, not
by the file name.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import IO

import numpy as np

__all__ = ["IdxFormatError", "read_idx"]

_TYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK_BYTES = 1 << 24


class IdxFormatError(ValueError):
    """The bytes are not a well-formed IDX file (bad magic, truncated, wrong size)."""


def _open(path: Path) -> IO[bytes]:
    with open(path, "rb") as handle:
        head = handle.read(2)
    return gzip.open(path, "rb") if head == _GZIP_MAGIC else open(path, "rb")


def _read_exactly(handle: IO[bytes], count: int, path: Path, what: str) -> bytes:
    """``count`` bytes, read in chunks so memory follows the bytes that exist, not a size a
    header claims; :class:`IdxFormatError` (naming ``path``) when the stream ends early or a
    gzip member is corrupt."""
    parts: list[bytes] = []
    remaining = count
    try:
        while remaining > 0:
            chunk = handle.read(min(remaining, _CHUNK_BYTES))
            if not chunk:
                break
            parts.append(chunk)
            remaining -= len(chunk)
    except (OSError, EOFError, zlib.error) as error:
        raise IdxFormatError(f"{path}: corrupt gzip stream ({error})") from error
    if remaining > 0:
        raise IdxFormatError(
            f"{path}: {what} ({count} bytes) but only {count - remaining} data bytes follow"
        )
    return b"".join(parts)


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file into a NumPy array of its native type and shape.

    The header's sizes are checked against the bytes actually present before memory is
    allocated for them (a 20-byte file claiming 10^12 records fails at once).

    Args:
        path: ``.gz`` or raw IDX file.

    Returns:
        The array, e.g. ``uint8[60000, 28, 28]`` for MNIST training images or ``uint8[60000]``
        for its labels (native byte order).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IdxFormatError: bad magic number, unknown type code, a corrupt gzip stream, or a data
            size that does not match the header (each message names the file).
    """
    path = Path(path)
    with _open(path) as handle:
        magic = _read_exactly_or_short(handle, 4, path)
        if len(magic) < 4 or magic[0] != 0 or magic[1] != 0:
            raise IdxFormatError(
                f"{path}: not an IDX file (magic bytes {magic.hex() or 'empty'}, "
                "expected 0000<type><ndim>)"
            )
        type_code, ndim = magic[2], magic[3]
        if type_code not in _TYPES:
            raise IdxFormatError(f"{path}: unknown IDX type code 0x{type_code:02x}")
        if ndim == 0:
            raise IdxFormatError(f"{path}: IDX header declares 0 dimensions")
        sizes = _read_exactly(handle, 4 * ndim, path, f"truncated IDX header: {ndim} sizes")
        shape = tuple(int(s) for s in np.frombuffer(sizes, dtype=">u4", count=ndim))
        dtype = np.dtype(_TYPES[type_code])
        expected = int(np.prod(shape, dtype=object)) * dtype.itemsize
        data = _read_exactly(
            handle, expected, path, f"IDX header says shape {shape} of {dtype}: data"
        )
        try:
            extra = handle.read(1)
        except (OSError, EOFError, zlib.error) as error:
            raise IdxFormatError(f"{path}: corrupt gzip stream ({error})") from error
    if extra:
        raise IdxFormatError(
            f"{path}: IDX header says shape {shape} of {dtype} ({expected} bytes) "
            "but more data bytes follow"
        )
    array = np.frombuffer(data, dtype=dtype).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)


def _read_exactly_or_short(handle: IO[bytes], count: int, path: Path) -> bytes:
    try:
        return handle.read(count)
    except (OSError, EOFError, zlib.error) as error:
        raise IdxFormatError(f"{path}: corrupt gzip stream ({error})") from error
