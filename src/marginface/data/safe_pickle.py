"""Unpickling data files from strangers without running their code.

:func:`restricted_loads` reads a pickle that may only hold plain data: ``None``, bools, ints,
floats, ``str``, ``bytes``, lists, tuples, dicts, sets and — when asked — NumPy arrays of a
few element types (``bool``, ``uint8``...). Any other global the stream names (``os.system``,
``builtins.eval``, a class with a ``__reduce__`` payload) is refused by :class:`UnsafePickleError`
before it is looked up, so nothing from the file runs.

Before the stream is unpickled, every opcode is walked with :func:`pickletools.genops`, which
checks each declared length (``BINBYTES8`` of 10^12 bytes in a 20-byte file) against the bytes
actually present: CPython's unpickler allocates the declared size first.

Protocol 5 loads too: NumPy writes a contiguous array as ``numpy._core.numeric._frombuffer``
of an in-band buffer (``BYTEARRAY8``), which is admitted with its element type and shape
checked against the buffer's length (out-of-band buffers are refused).

Python-2 pickles load too (``encoding="bytes"`` keeps Python-2 ``str`` as ``bytes``, the way
insightface reads its ``.bin`` verification sets).
"""

from __future__ import annotations

import codecs
import io
import math
import os
import pickle
import pickletools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["UnsafePickleError", "restricted_load", "restricted_loads"]

SAFE_ARRAY_DTYPES = frozenset({"b1", "u1", "i1", "i4", "i8", "u4", "f4", "f8"})
"""NumPy element type codes (``dtype.str`` without the byte order) an array may have."""


class UnsafePickleError(pickle.UnpicklingError, ValueError):
    """The pickle names a type outside plain data, or is malformed; nothing from it ran."""


def _safe_dtype(source: str) -> Callable[..., np.dtype]:
    def make(code: Any, align: Any = False, copy: Any = True) -> np.dtype:
        name = code.decode("latin-1") if isinstance(code, bytes) else code
        if not isinstance(name, str) or name.lstrip("<>|=") not in SAFE_ARRAY_DTYPES:
            raise UnsafePickleError(
                f"{source}: refused: an array of element type {code!r}; only "
                f"{', '.join(sorted(SAFE_ARRAY_DTYPES))} are read; nothing from the file was "
                "executed"
            )
        return np.dtype(name, bool(align), bool(copy))

    return make


def _latin1_encode(source: str) -> Callable[..., bytes]:
    def encode(text: Any, encoding: Any = "latin1") -> bytes:
        if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
            raise UnsafePickleError(f"{source}: refused: _codecs.encode({encoding!r})")
        return codecs.encode(text, "latin-1")

    return encode


def _reconstruct_array(source: str) -> Callable[..., np.ndarray]:
    def reconstruct(cls: Any, shape: Any, dtype_code: Any) -> np.ndarray:
        if cls is not np.ndarray:
            raise UnsafePickleError(f"{source}: refused: array subclass {cls!r}")
        return np.ndarray.__new__(np.ndarray, (0,), dtype=np.uint8)

    return reconstruct


def _frombuffer(source: str) -> Callable[..., np.ndarray]:
    """NumPy's protocol-5 array constructor (``numpy._core.numeric._frombuffer``; written by
    ``pickle.dumps(array, protocol=5)`` for a contiguous array), checked: in-band bytes only,
    an admitted element type, a shape that the bytes fill exactly."""

    def make(buffer: Any, dtype: Any, shape: Any, order: Any = "C") -> np.ndarray:
        if not isinstance(buffer, (bytes, bytearray)):
            raise UnsafePickleError(
                f"{source}: refused: an array buffer of type {type(buffer).__name__}"
            )
        if not isinstance(dtype, np.dtype) or dtype.str.lstrip("<>|=") not in SAFE_ARRAY_DTYPES:
            raise UnsafePickleError(
                f"{source}: refused: an array of element type {dtype!r}; nothing from the file "
                "was executed"
            )
        if (
            not isinstance(shape, tuple)
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
            or order not in ("C", "F")
        ):
            raise UnsafePickleError(f"{source}: refused: array shape {shape!r} order {order!r}")
        if math.prod(shape) * dtype.itemsize != len(buffer):
            raise UnsafePickleError(
                f"{source}: an array of shape {shape} ({dtype}) cannot hold {len(buffer)} bytes"
            )
        return np.frombuffer(buffer, dtype=dtype).reshape(shape, order=order)

    return make


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, stream: io.BytesIO, source: str, arrays: bool) -> None:
        super().__init__(stream, encoding="bytes")
        self._allowed: dict[tuple[str, str], Any] = {
            ("builtins", "set"): set,
            ("builtins", "frozenset"): frozenset,
            ("builtins", "bytearray"): bytearray,
            ("__builtin__", "set"): set,
            ("__builtin__", "frozenset"): frozenset,
            ("__builtin__", "bytearray"): bytearray,
            ("_codecs", "encode"): _latin1_encode(source),
        }
        if arrays:
            for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
                self._allowed[(module, "_reconstruct")] = _reconstruct_array(source)
            for module in ("numpy.core.numeric", "numpy._core.numeric"):  # protocol 5
                self._allowed[(module, "_frombuffer")] = _frombuffer(source)
            self._allowed[("numpy", "ndarray")] = np.ndarray
            self._allowed[("numpy", "dtype")] = _safe_dtype(source)
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"{self._source}: refused: the pickle names {module}.{name}, which this "
                "format never holds (it could run code); nothing from the file was executed"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"{self._source}: refused: persistent id {pid!r}")


def _check_lengths(data: bytes, source: str) -> None:
    try:
        for _ in pickletools.genops(io.BytesIO(data)):
            pass
    except (ValueError, EOFError) as error:  # a declared length beyond the file, bad opcode
        raise UnsafePickleError(f"{source}: not a well-formed pickle ({error})") from None


def restricted_loads(data: bytes, *, source: str = "<bytes>", arrays: bool = True) -> Any:
    """Unpickle ``data`` admitting only plain data (see the module docstring).

    Args:
        data: the pickle's bytes (any protocol, Python 2 included).
        source: how to name the data in messages (a file name).
        arrays: also admit NumPy arrays of :data:`SAFE_ARRAY_DTYPES`. Default: True.

    Raises:
        UnsafePickleError: a refused global, a length beyond the data, or a malformed stream.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    _check_lengths(data, source)
    try:
        return _RestrictedUnpickler(io.BytesIO(data), source, arrays).load()
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as error:
        raise UnsafePickleError(f"{source}: not a readable pickle ({error})") from None


def restricted_load(path: str | os.PathLike[str], *, arrays: bool = True) -> Any:
    """:func:`restricted_loads` of the file at ``path`` (messages name it)."""
    path = Path(path)
    return restricted_loads(path.read_bytes(), source=str(path), arrays=arrays)
