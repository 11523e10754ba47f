"""The RecordIO format of MXNet and insightface (``train.rec`` + ``train.idx``): framing, image
records, the index.

Framing (dmlc-core ``recordio``), all words little-endian ``uint32``::

    magic 0xCED7230A | lrec | payload | zero padding to a multiple of 4 bytes

``lrec``'s upper 3 bits are the continuation flag ``cflag`` and its lower 29 bits the length of
this part's payload. A payload is cut wherever the magic word appears in it at a 4-byte-aligned
position (so that a reader that lost its place can resynchronise on the magic): the parts are
written as ``cflag`` 1 (first), 2 (middle), 3 (last), and the magic word that was cut out is
re-inserted between parts when the record is read back. A record of one part has ``cflag`` 0.
A record's payload is at most ``2**29 - 1`` bytes.

Image records (MXNet's ``recordio.pack``/``unpack``) start with the header ``IfQQ``
(:class:`ImageHeader`: ``uint32 flag, float32 label, uint64 id, uint64 id2``, 24 bytes); when
``flag > 0``, ``flag`` ``float32`` labels follow the header and the header's own ``label`` is
unused. The encoded image (JPEG/PNG) follows.

The index (``.idx``) is text, one line ``key<TAB>byte offset`` per record.

Every malformed input raises :class:`RecordFormatError` (a ``ValueError``) naming the file and
the record. :mod:`marginface.data.recordio` reads and writes whole files in this format.
"""

from __future__ import annotations

import os
import struct
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "IMAGE_HEADER_SIZE",
    "MAX_RECORD_BYTES",
    "RECORD_MAGIC",
    "ImageHeader",
    "RecordFormatError",
    "encode_record",
    "iter_records",
    "pack_image_record",
    "read_index",
    "unpack_image_record",
]

RECORD_MAGIC = 0xCED7230A
"""The word that starts every record part."""
MAX_RECORD_BYTES = (1 << 29) - 1
"""The largest payload dmlc's framing can hold (29 length bits)."""
_MAGIC_BYTES = struct.pack("<I", RECORD_MAGIC)
_FRAME = struct.Struct("<II")  # magic, lrec
_HEADER = struct.Struct("<IfQQ")  # flag, label, id, id2
IMAGE_HEADER_SIZE = _HEADER.size
"""Bytes of the ``IfQQ`` image header (24)."""
_INDEX_CHUNK = 1 << 24


class RecordFormatError(ValueError):
    """A ``.rec`` or ``.idx`` file is malformed (truncated, not at a record, bad field); the
    message names the file and the record."""


# ------------------------------------------------------------------ image records
@dataclass(frozen=True)
class ImageHeader:
    """The ``IfQQ`` header of an image record.

    Attributes:
        flag: number of ``float32`` labels after the header (0: the scalar ``label`` is used).
        label: the scalar label (``flag == 0``) or ``float32[flag]`` (``flag > 0``).
        id: the record's id (insightface: its key).
        id2: a second id (0 in insightface's files).
    """

    flag: int
    label: float | np.ndarray
    id: int
    id2: int

    @property
    def class_label(self) -> float:
        """The class as insightface reads it: ``label`` or ``label[0]``."""
        if isinstance(self.label, np.ndarray):
            return float(self.label[0]) if self.label.size else float("nan")
        return float(self.label)


def pack_image_record(
    label: float | Sequence[float] | np.ndarray, image: bytes, *, id: int = 0, id2: int = 0
) -> bytes:
    """An image record's payload, as MXNet's ``recordio.pack``.

    Args:
        label: a number (``flag`` 0, stored in the header) or a sequence of numbers (``flag`` =
            its length; stored as ``float32`` after the header, the header's label 0).
        image: the encoded image (may be empty: insightface's header and identity records).
        id: the header's ``id``. Default: 0.
        id2: the header's ``id2``. Default: 0.
    """
    if isinstance(label, (int, float, np.integer, np.floating)) and not isinstance(label, bool):
        return _HEADER.pack(0, float(label), id, id2) + bytes(image)
    values = np.asarray(label, dtype="<f4").reshape(-1)
    return _HEADER.pack(values.size, 0.0, id, id2) + values.tobytes() + bytes(image)


def unpack_image_record(payload: bytes, *, where: str = "record") -> tuple[ImageHeader, bytes]:
    """Split an image record's payload into its header and the encoded image.

    Args:
        payload: the record's bytes.
        where: how to name the record in messages (``"train.rec: record 17"``).

    Raises:
        RecordFormatError: the payload is shorter than its header says.
    """
    if len(payload) < _HEADER.size:
        raise RecordFormatError(
            f"{where}: {len(payload)} bytes, shorter than the {_HEADER.size}-byte image header"
        )
    flag, label, record_id, id2 = _HEADER.unpack_from(payload)
    start = _HEADER.size
    if flag > 0:
        end = start + 4 * flag
        if end > len(payload):
            raise RecordFormatError(
                f"{where}: header promises {flag} labels ({4 * flag} bytes) but only "
                f"{len(payload) - start} bytes follow it"
            )
        labels = np.frombuffer(payload, dtype="<f4", count=flag, offset=start).astype(np.float32)
        return ImageHeader(flag, labels, record_id, id2), payload[end:]
    return ImageHeader(0, float(label), record_id, id2), payload[start:]


# ------------------------------------------------------------------ framing
def encode_record(payload: bytes) -> bytes:
    """``payload`` framed as dmlc's ``RecordIOWriter::WriteRecord`` frames it (magic, ``lrec``,
    bytes, padding; split at every 4-byte-aligned magic word into parts with cflag 1, 2, 3).

    Raises:
        ValueError: the payload is longer than :data:`MAX_RECORD_BYTES`.
    """
    payload = bytes(payload)
    size = len(payload)
    if size > MAX_RECORD_BYTES:
        raise ValueError(f"a record holds at most {MAX_RECORD_BYTES} bytes, got {size}")
    out = bytearray()
    start = 0  # first byte of the part being built
    search = payload.find(_MAGIC_BYTES)
    while 0 <= search <= size - 4:
        if search % 4 == 0:
            out += _FRAME.pack(RECORD_MAGIC, ((1 if start == 0 else 2) << 29) | (search - start))
            out += payload[start:search]
            start = search + 4
            search = payload.find(_MAGIC_BYTES, start)
        else:
            search = payload.find(_MAGIC_BYTES, search + 1)
    out += _FRAME.pack(RECORD_MAGIC, ((3 if start else 0) << 29) | (size - start))
    out += payload[start:]
    out += b"\0" * (-size % 4)
    return bytes(out)


def _read_framed(
    read_at: Callable[[int, int], bytes],
    offset: int,
    end: int,
    where: str,
    *,
    file_size: int,
    limit: int | None = None,
) -> tuple[bytes, int]:
    """The payload of the record starting at ``offset`` and the offset after it.

    ``read_at(offset, count)`` returns up to ``count`` bytes; ``end`` is the first byte the
    record may not reach (``file_size``, or the next indexed record), checked before anything
    is read, so a corrupt length never allocates. ``limit``: return once at least that many
    payload bytes are in hand (headers only).
    """
    parts: list[bytes] = []
    have = 0
    position = offset
    first = True
    while True:
        frame = read_at(position, _FRAME.size)
        if len(frame) < _FRAME.size:
            state = "ends" if first else "ends inside a multi-part record"
            raise RecordFormatError(
                f"{where}: truncated: the file {state} at byte {position + len(frame)}, "
                f"before an {_FRAME.size}-byte record header"
            )
        magic, lrec = _FRAME.unpack(frame)
        if magic != RECORD_MAGIC:
            raise RecordFormatError(
                f"{where}: no record at byte {position} (magic 0x{magic:08x}, expected "
                f"0x{RECORD_MAGIC:08x})"
            )
        cflag, length = lrec >> 29, lrec & MAX_RECORD_BYTES
        if first and cflag not in (0, 1):
            raise RecordFormatError(
                f"{where}: byte {position} is the continuation (cflag {cflag}) of an earlier "
                "record, not the start of one"
            )
        if not first and cflag not in (2, 3):
            raise RecordFormatError(
                f"{where}: multi-part record broken at byte {position} (cflag {cflag}, "
                "expected 2 or 3)"
            )
        if position + _FRAME.size + length > end:
            boundary = (
                f"the end of the file ({file_size} bytes)"
                if end >= file_size
                else f"the next indexed record (byte {end}); the index does not match the file"
            )
            raise RecordFormatError(
                f"{where}: truncated: its {length}-byte part at byte {position} runs past "
                f"{boundary}"
            )
        count = length if limit is None else min(length, limit - have)
        data = read_at(position + _FRAME.size, count)
        if len(data) < count:
            raise RecordFormatError(
                f"{where}: truncated: {len(data)} of a {length}-byte part at byte {position}"
            )
        parts.append(data)
        have += count
        position += _FRAME.size + length + (-length % 4)
        if cflag in (0, 3) or (limit is not None and have >= limit):
            return b"".join(parts), position
        parts.append(_MAGIC_BYTES)
        have += 4
        first = False


def iter_records(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """Every record of a ``.rec`` file in file order, without an index: ``(offset, payload)``.

    Raises:
        RecordFormatError: the file is malformed at some record (named by its number and
            byte offset).
    """
    path = Path(path)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size

        def read_at(offset: int, count: int) -> bytes:
            handle.seek(offset)
            return handle.read(count)

        offset, number = 0, 0
        while offset < size:
            payload, after = _read_framed(
                read_at, offset, size, f"{path}: record #{number}", file_size=size
            )
            yield offset, payload
            offset, number = after, number + 1


# ------------------------------------------------------------------ index
def _parse_index_chunk(data: bytes, path: Path, first_line: int) -> np.ndarray:
    """``int64[L, 2]`` (key, offset) of the whole lines in ``data``; the bad line named."""
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NumPy < 2.3 warns when it stops at a bad field
            numbers = np.fromstring(data, dtype=np.int64, sep=" ")  # any whitespace separates
    except ValueError:  # NumPy >= 2.3 raises instead
        numbers = np.zeros(0, dtype=np.int64)
    if numbers.size == 2 * lines and data.count(b"\t") == lines:
        return numbers.reshape(-1, 2)
    rows = []  # slow path: blank lines, or an error to locate
    for number, line in enumerate(data.splitlines(), start=first_line):
        if not line.strip():
            continue
        fields = line.split(b"\t")
        try:
            if len(fields) != 2:
                raise ValueError
            rows.append((int(fields[0]), int(fields[1])))
        except ValueError:
            text = line.decode("utf-8", "replace")[:60]
            raise RecordFormatError(
                f"{path}: line {number}: expected 'key<TAB>offset', got {text!r}"
            ) from None
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)


def read_index(
    path: str | os.PathLike[str],
    *,
    record_file_size: int | None = None,
    record_file: str | os.PathLike[str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Read a RecordIO ``.idx`` file (lines ``key<TAB>offset``).

    Args:
        path: the ``.idx`` file.
        record_file_size: size of the ``.rec`` in bytes; every offset must leave room for a
            record header before it. None: only non-negative offsets are checked.
        record_file: the ``.rec`` itself, named in the message when an offset is past its end
            (a truncated copy, or a ``.rec`` that does not belong to this index).

    Returns:
        ``(keys, offsets)``: ``int64[N]`` each, in file order.

    Raises:
        RecordFormatError: a malformed line, a negative or duplicate key, or an offset past the
            end of the ``.rec`` (the message names the line and key).
    """
    path = Path(path)
    blocks: list[np.ndarray] = []
    line_number = 1
    with open(path, "rb") as handle:
        rest = b""
        while True:
            chunk = handle.read(_INDEX_CHUNK)
            data = rest + chunk
            if not chunk:
                if data.strip():
                    blocks.append(_parse_index_chunk(data, path, line_number))
                break
            cut = data.rfind(b"\n") + 1
            whole, rest = data[:cut], data[cut:]
            if whole:
                blocks.append(_parse_index_chunk(whole, path, line_number))
                line_number += whole.count(b"\n")
    table = np.concatenate(blocks) if blocks else np.zeros((0, 2), dtype=np.int64)
    keys, offsets = np.ascontiguousarray(table[:, 0]), np.ascontiguousarray(table[:, 1])
    bad_rows = (offsets < 0) | (keys < 0)
    if record_file_size is not None:
        bad_rows |= offsets > record_file_size - _FRAME.size
    bad = np.flatnonzero(bad_rows)
    if bad.size:
        row = int(bad[0])
        where = f"{path}: line {_line_of(path, row)}: record {int(keys[row])}"
        if keys[row] < 0:
            raise RecordFormatError(f"{where}: negative key")
        rec = "the record file" if record_file is None else str(record_file)
        raise RecordFormatError(
            f"{rec} looks truncated, or does not belong to {path.name}: {where}: offset "
            f"{int(offsets[row])} is past its end ({record_file_size} bytes)"
        )
    if keys.size:
        ordered = np.sort(keys)
        duplicate = np.flatnonzero(ordered[1:] == ordered[:-1])
        if duplicate.size:
            raise RecordFormatError(f"{path}: record {int(ordered[duplicate[0]])} listed twice")
    return keys, offsets


def _line_of(path: Path, row: int) -> int:
    """The 1-based line number of the ``row``-th non-blank line (for messages only)."""
    seen = -1
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                seen += 1
                if seen == row:
                    return number
    return row + 1
