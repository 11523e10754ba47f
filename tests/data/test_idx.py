"""IDX parsing: real MNIST files, gzip and raw, and corrupt headers."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from marginface.data.idx import IdxFormatError, read_idx


def _idx_bytes(array: np.ndarray, type_code: int) -> bytes:
    header = bytes([0, 0, type_code, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    return header + array.tobytes()


def test_real_mnist_test_labels(shared_file):
    labels = read_idx(shared_file("mnist", "t10k-labels-idx1-ubyte.gz"))
    assert labels.shape == (10000,) and labels.dtype == np.uint8
    counts = np.bincount(labels)
    assert counts.tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_real_mnist_test_images(shared_file):
    images = read_idx(shared_file("mnist", "t10k-images-idx3-ubyte.gz"))
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert images.max() == 255 and images.min() == 0


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize(
    ("dtype", "code"), [("u1", 0x08), ("i1", 0x09), (">i2", 0x0B), (">i4", 0x0C), (">f4", 0x0D)]
)
def test_round_trip_types(tmp_path, compress, dtype, code):
    array = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    raw = _idx_bytes(array, code)
    path = tmp_path / "x.idx"
    path.write_bytes(gzip.compress(raw) if compress else raw)
    result = read_idx(path)
    np.testing.assert_array_equal(result, array)
    assert result.dtype.isnative


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"", "not an IDX"),
        (b"\x01\x00\x08\x01", "not an IDX"),
        (b"\x00\x00\x07\x01\x00\x00\x00\x01\x00", "unknown IDX type"),
        (b"\x00\x00\x08\x00", "0 dimensions"),
        (b"\x00\x00\x08\x03\x00\x00\x00\x02", "truncated IDX header"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", r"shape \(5,\).*2 data bytes"),
    ],
)
def test_corrupt_headers(tmp_path, payload, match):
    path = tmp_path / "bad"
    path.write_bytes(payload)
    with pytest.raises(IdxFormatError, match=match):
        read_idx(path)


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "bad.gz"
    path.write_bytes(gzip.compress(_idx_bytes(np.zeros(100, "u1"), 0x08))[:30])
    with pytest.raises(IdxFormatError, match="corrupt gzip"):
        read_idx(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "absent.gz")
