"""RecordIO: the reader against files framed by an independent writer in this test (struct.pack,
following dmlc-core's recordio.cc), multi-part records, the writer's bytes, and bad input."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from marginface.data import recordio_format
from marginface.data.recordio import (
    MAX_RECORD_BYTES,
    RecordFormatError,
    RecordReader,
    RecordWriter,
    encode_record,
    iter_records,
    pack_image_record,
    read_index,
    unpack_image_record,
)

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)


# ------------------------------------------------------------------ the independent writer
def frame(part: bytes, cflag: int = 0) -> bytes:
    """One dmlc record part: magic, lrec (cflag << 29 | length), bytes, zero padding."""
    return struct.pack("<II", MAGIC, (cflag << 29) | len(part)) + part + b"\0" * (-len(part) % 4)


def write_rec(folder: Path, records: list[tuple[int, bytes]], name: str = "t") -> Path:
    """``records`` are (key, already framed bytes); writes name.rec and name.idx."""
    rec, lines, offset = bytearray(), [], 0
    for key, framed in records:
        lines.append(f"{key}\t{offset}\n")
        rec += framed
        offset += len(framed)
    (folder / f"{name}.rec").write_bytes(bytes(rec))
    (folder / f"{name}.idx").write_text("".join(lines))
    return folder / f"{name}.rec"


# three parts, as dmlc writes a payload holding the magic word at two aligned positions
PART_A, PART_B, PART_C = b"abcdefgh", b"", b"tail!"
MULTI = PART_A + MAGIC_BYTES + PART_B + MAGIC_BYTES + PART_C
MULTI_FRAMED = frame(PART_A, 1) + frame(PART_B, 2) + frame(PART_C, 3)


@pytest.fixture
def handmade(tmp_path: Path) -> tuple[Path, dict[int, bytes]]:
    payloads = {
        0: struct.pack("<IfQQ", 2, 0.0, 0, 0) + struct.pack("<2f", 3.0, 5.0),
        1: struct.pack("<IfQQ", 0, 7.0, 1, 0) + b"JPEGDATA1",
        2: b"",
        7: MULTI,
        3: b"xyz",
    }
    framed = [(key, MULTI_FRAMED if key == 7 else frame(value)) for key, value in payloads.items()]
    return write_rec(tmp_path, framed), payloads


def test_reads_independently_framed_records(handmade):
    path, payloads = handmade
    reader = RecordReader(path)
    assert reader.keys.tolist() == [0, 1, 2, 3, 7]
    assert len(reader) == 5 and 7 in reader and 4 not in reader
    for key, payload in payloads.items():
        assert reader.read(key) == payload
    assert [payload for _, payload in iter_records(path)] == list(payloads.values())
    with pytest.raises(KeyError, match=r"t\.idx: no record 4"):
        reader.read(4)


def test_multi_part_record_and_prefix(handmade):
    path, _ = handmade
    reader = RecordReader(path)
    assert reader.read(7) == MULTI
    assert reader.read(7, prefix=3) == b"abc"
    assert reader.read(7, prefix=10) == MULTI[:10]


def test_writer_frames_exactly_as_dmlc(tmp_path):
    assert encode_record(MULTI) == MULTI_FRAMED
    assert encode_record(b"xyz") == frame(b"xyz")
    assert encode_record(MAGIC_BYTES) == frame(b"", 1) + frame(b"", 3)
    unaligned = b"ab" + MAGIC_BYTES + b"cd"  # dmlc only splits at 4-byte-aligned positions
    assert encode_record(unaligned) == frame(unaligned)
    with pytest.raises(ValueError, match="at most"):
        encode_record(bytes(MAX_RECORD_BYTES + 1))


def test_writer_round_trip_and_index(tmp_path):
    payloads = [b"one", MULTI, b"", MAGIC_BYTES * 3, bytes(range(256)) * 5]
    with RecordWriter(tmp_path / "w.rec") as writer:
        offsets = [writer.write(key * 10, payload) for key, payload in enumerate(payloads)]
    keys, stored = read_index(tmp_path / "w.idx")
    assert keys.tolist() == [0, 10, 20, 30, 40] and stored.tolist() == offsets
    assert (tmp_path / "w.idx").read_text().splitlines()[1] == f"10\t{offsets[1]}"
    reader = RecordReader(tmp_path / "w.rec")
    assert [reader.read(k * 10) for k in range(5)] == payloads
    assert [p for _, p in iter_records(tmp_path / "w.rec")] == payloads


def test_writer_is_atomic(tmp_path):
    with RecordWriter(tmp_path / "old.rec") as writer:
        writer.write(0, b"old")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(RuntimeError, match="boom"), RecordWriter(tmp_path / "old.rec") as writer:
        writer.write(0, b"new")
        raise RuntimeError("boom")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    with pytest.raises(RuntimeError, match="not open"):
        writer.write(1, b"closed")
    with RecordWriter(tmp_path / "k.rec") as writer:
        with pytest.raises(TypeError, match="key"):
            writer.write("1", b"")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="key must be >= 0"):
            writer.write(-1, b"")


def test_image_records_pack_like_mxnet():
    scalar = pack_image_record(3, b"IMG", id=9)
    assert scalar == struct.pack("<IfQQ", 0, 3.0, 9, 0) + b"IMG"
    header, image = unpack_image_record(scalar)
    assert (header.flag, header.label, header.id, header.class_label, image) == (
        0,
        3.0,
        9,
        3.0,
        b"IMG",
    )
    array = pack_image_record([4.0, 1.0], b"X", id=2, id2=5)
    assert array == struct.pack("<IfQQ2f", 2, 0.0, 2, 5, 4.0, 1.0) + b"X"
    header, image = unpack_image_record(array)
    assert header.flag == 2 and header.label.tolist() == [4.0, 1.0] and header.class_label == 4.0
    assert image == b"X"
    with pytest.raises(RecordFormatError, match="r.rec: record 3: header promises 5 labels"):
        unpack_image_record(struct.pack("<IfQQ", 5, 0, 0, 0) + b"1234", where="r.rec: record 3")
    with pytest.raises(RecordFormatError, match="shorter than the 24-byte image header"):
        unpack_image_record(b"short")


def test_read_header_reads_only_the_header(tmp_path):
    big = pack_image_record([2.0, 1.0], b"\xff" * 100_000, id=1)
    with RecordWriter(tmp_path / "h.rec") as writer:
        writer.write(1, big)
    reader = RecordReader(tmp_path / "h.rec")
    calls: list[int] = []
    original = reader._read_at
    reader._read_at = lambda offset, count: calls.append(count) or original(offset, count)
    header = reader.read_header(1)
    assert header.label.tolist() == [2.0, 1.0] and max(calls) < 200


def test_reader_pickles_and_reopens_per_process(handmade):
    path, payloads = handmade
    reader = RecordReader(path)
    reader.read(1)
    clone = pickle.loads(pickle.dumps(reader))
    assert clone._handle is None and clone.read(7) == payloads[7]
    reader._pid = -5  # as if inherited by a forked worker: a fresh descriptor is opened
    old = reader._handle
    assert reader.read(3) == b"xyz" and reader._handle is not old
    old.close()
    reader.close()
    with RecordReader(path) as again:
        assert again.read(2) == b""


# ------------------------------------------------------------------ bad input
def test_truncated_rec(handmade):
    path, _ = handmade
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 2])  # cut inside the last record (key 3)
    with pytest.raises(RecordFormatError) as error:
        RecordReader(path).read(3)
    message = str(error.value)
    assert str(path) in message and "record 3" in message and "truncated" in message
    assert "\n" not in message
    with pytest.raises(RecordFormatError, match=r"record #4.*truncated"):
        list(iter_records(path))


def test_truncated_inside_multi_part_record(tmp_path):
    framed = frame(PART_A, 1) + frame(PART_B, 2)  # the last part is missing
    path = write_rec(tmp_path, [(5, framed)])
    with pytest.raises(RecordFormatError, match=r"record 5: truncated.*multi-part"):
        RecordReader(path).read(5)


def test_huge_length_is_refused_before_reading(tmp_path):
    lying = struct.pack("<II", MAGIC, MAX_RECORD_BYTES) + b"tiny"
    path = write_rec(tmp_path, [(0, lying), (1, frame(b"next"))])
    reader = RecordReader(path)
    counts: list[int] = []
    original = reader._read_at
    reader._read_at = lambda offset, count: counts.append(count) or original(offset, count)
    with pytest.raises(RecordFormatError, match=r"record 0: truncated.*next indexed record"):
        reader.read(0)
    assert max(counts) == 8  # only the header was read, nothing allocated for the payload
    (tmp_path / "t.idx").write_text("0\t0\n")
    with pytest.raises(RecordFormatError, match=r"record 0: truncated.*end of the file"):
        RecordReader(path).read(0)


def test_index_offset_past_the_end(handmade):
    path, _ = handmade
    size = path.stat().st_size
    index = path.with_suffix(".idx")
    index.write_text(index.read_text() + f"9\t{size + 100}\n")
    with pytest.raises(RecordFormatError) as error:
        RecordReader(path)
    message = str(error.value)
    assert str(index) in message and "line 6" in message and "record 9" in message
    assert f"{path} looks truncated, or does not belong to {index.name}" in message
    assert f"past its end ({size} bytes)" in message


def test_index_offset_not_at_a_record(handmade):
    path, _ = handmade
    index = path.with_suffix(".idx")
    lines = index.read_text().splitlines()
    key, offset = lines[1].split("\t")
    lines[1] = f"{key}\t{int(offset) + 4}"
    index.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordFormatError, match=rf"t\.rec: record {key}: no record at byte"):
        RecordReader(path).read(int(key))


def test_index_offset_at_a_continuation(tmp_path):
    path = write_rec(tmp_path, [(0, MULTI_FRAMED)])
    (tmp_path / "t.idx").write_text(f"0\t{len(frame(PART_A, 1))}\n")
    with pytest.raises(RecordFormatError, match=r"record 0: byte 16 is the continuation"):
        RecordReader(path).read(0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0\t0\n1 0\n", r"line 2: expected 'key<TAB>offset', got '1 0'"),
        ("0\t0\n\nx\t4\n", r"line 3: expected 'key<TAB>offset'"),
        ("0\t0\n0\t0\n", r"record 0 listed twice"),
        ("-1\t0\n", r"line 1: record -1: negative key"),
        ("0\t-8\n", r"line 1: record 0: offset -8 is past"),
    ],
)
def test_malformed_index(tmp_path, text, expected):
    (tmp_path / "m.idx").write_text(text)
    with pytest.raises(RecordFormatError, match=expected) as error:
        read_index(tmp_path / "m.idx", record_file_size=100)
    assert str(tmp_path / "m.idx") in str(error.value)


def test_index_with_blank_lines_and_crlf(tmp_path):
    (tmp_path / "b.idx").write_text("3\t0\r\n\n5\t16\r\n")
    keys, offsets = read_index(tmp_path / "b.idx")
    assert keys.tolist() == [3, 5] and offsets.tolist() == [0, 16]
    (tmp_path / "e.idx").write_text("")
    assert read_index(tmp_path / "e.idx")[0].size == 0


def test_large_index_is_parsed_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(recordio_format, "_INDEX_CHUNK", 64)  # many chunk boundaries
    keys = np.arange(500) * 3 + 1
    (tmp_path / "c.idx").write_text("".join(f"{k}\t{8 * i}\n" for i, k in enumerate(keys)))
    read_keys, offsets = read_index(tmp_path / "c.idx")
    assert read_keys.tolist() == keys.tolist() and offsets.tolist() == list(range(0, 4000, 8))
    (tmp_path / "c.idx").write_text((tmp_path / "c.idx").read_text() + "7\tbad\n")
    with pytest.raises(RecordFormatError, match="line 501"):
        read_index(tmp_path / "c.idx")


def test_non_contiguous_keys_lookup(tmp_path):
    with RecordWriter(tmp_path / "s.rec") as writer:
        for key in (50, 3, 999, 4):
            writer.write(key, str(key).encode())
    reader = RecordReader(tmp_path / "s.rec")
    assert [reader.read(k) for k in (3, 4, 50, 999)] == [b"3", b"4", b"50", b"999"]
    assert 5 not in reader and "x" not in reader
