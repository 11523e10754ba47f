"""Reading IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or not.

Layout (big-endian): two zero bytes, a type code (``0x08`` uint8, ``0x09`` int8, ``0x0B`` int16,
``0x0C`` int32, ``0x0D`` float32, ``0x0E`` float64), the number of dimensions ``d``, then ``d``
uint32 sizes, then the data in C order. Compression is recognised by the gzip magic bytes, not
by the file name.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

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


class IdxFormatError(ValueError):
    """The bytes are not a well-formed IDX file (bad magic, truncated, wrong size)."""


def _read_bytes(path: Path) -> bytes:
    with open(path, "rb") as handle:
        head = handle.read(2)
    if head == _GZIP_MAGIC:
        try:
            with gzip.open(path, "rb") as handle:
                return handle.read()
        except (OSError, EOFError) as error:
            raise IdxFormatError(f"{path}: corrupt gzip stream ({error})") from error
    return path.read_bytes()


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file into a NumPy array of its native type and shape.

    Args:
        path: ``.gz`` or raw IDX file.

    Returns:
        The array, e.g. ``uint8[60000, 28, 28]`` for MNIST training images or ``uint8[60000]``
        for its labels (native byte order).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IdxFormatError: bad magic number, unknown type code, or a data size that does not match
            the header.
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise IdxFormatError(
            f"{path}: not an IDX file (magic bytes {data[:4].hex() or 'empty'}, "
            "expected 0000<type><ndim>)"
        )
    type_code, ndim = data[2], data[3]
    if type_code not in _TYPES:
        raise IdxFormatError(f"{path}: unknown IDX type code 0x{type_code:02x}")
    if ndim == 0:
        raise IdxFormatError(f"{path}: IDX header declares 0 dimensions")
    header_end = 4 + 4 * ndim
    if len(data) < header_end:
        raise IdxFormatError(f"{path}: truncated IDX header ({len(data)} bytes)")
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_TYPES[type_code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual = len(data) - header_end
    if actual != expected:
        raise IdxFormatError(
            f"{path}: IDX header says shape {shape} of {dtype} ({expected} bytes) "
            f"but {actual} data bytes follow"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header_end).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)
