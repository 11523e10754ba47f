""".bin files as insightface's build_eval_pack.py writes them (each image the ``uint8[N, 1]``
buffer of ``cv2.imencode``, pickled with protocol 5) load; nothing beyond data is admitted."""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest
from PIL import Image

from marginface.data.insightface_bin import load_verification_bin
from marginface.data.safe_pickle import UnsafePickleError, restricted_loads


def _images(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.integers(0, 256, (14, 12, 3), dtype=np.uint8) for _ in range(count)]


def _png_buffer(image: np.ndarray) -> np.ndarray:
    """What ``cv2.imencode('.png', image)[1]`` returns: a writable ``uint8[N, 1]`` array."""
    out = io.BytesIO()
    Image.fromarray(image).save(out, "PNG")
    return np.frombuffer(out.getvalue(), dtype=np.uint8).reshape(-1, 1).copy()


def test_protocol_5_pickle_of_imencode_buffers_loads(tmp_path):
    images = _images(6)
    bins = [_png_buffer(image) for image in images]
    same = [True, False, True]
    data = pickle.dumps((bins, same), protocol=5)
    assert b"_frombuffer" in data  # NumPy's protocol-5 constructor is what the file names
    path = tmp_path / "pack.bin"
    path.write_bytes(data)
    loaded = load_verification_bin(path)
    assert loaded.images.shape == (6, 3, 14, 12)
    assert loaded.same.tolist() == same
    for k in range(6):
        np.testing.assert_array_equal(loaded.images[k], images[k].transpose(2, 0, 1))


def test_a_real_cv2_imencode_pack_loads(tmp_path):
    cv2 = pytest.importorskip("cv2")
    images = _images(4)
    bins = [cv2.imencode(".png", image[:, :, ::-1])[1] for image in images]  # BGR in
    assert bins[0].dtype == np.uint8  # (N, 1) from OpenCV 4, (N,) from OpenCV 5
    path = tmp_path / "cv2.bin"
    path.write_bytes(pickle.dumps((bins, [False, True]), protocol=pickle.HIGHEST_PROTOCOL))
    loaded = load_verification_bin(path)
    np.testing.assert_array_equal(loaded.images[2], images[2].transpose(2, 0, 1))


def test_frombuffer_arrays_of_any_admitted_type_round_trip():
    for array in (np.arange(12, dtype=np.int64).reshape(3, 4), np.array([[True], [False]])):
        loaded = restricted_loads(pickle.dumps(array, protocol=5))
        np.testing.assert_array_equal(loaded, array)
    fortran = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(restricted_loads(pickle.dumps(fortran, protocol=5)), fortran)


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_protocol_5_bin_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "MARKER"
    bins = [_png_buffer(image) for image in _images(2)]
    path = tmp_path / "evil.bin"
    path.write_bytes(pickle.dumps(([bins[0], _Payload(marker)], [True]), protocol=5))
    with pytest.raises(UnsafePickleError, match=r"refused.*system.*nothing from the file"):
        load_verification_bin(path)
    assert not marker.exists()


def test_a_frombuffer_with_a_refused_element_type_is_refused():
    data = pickle.dumps(np.zeros(4, dtype=np.complex128), protocol=5)
    with pytest.raises(UnsafePickleError, match="element type"):
        restricted_loads(data)


def test_a_frombuffer_whose_shape_the_bytes_do_not_fill_is_refused():
    data = bytearray(pickle.dumps(np.zeros((4, 1), dtype=np.uint8), protocol=5))
    # the shape tuple (4, 1) is BININT1 4, BININT1 1, TUPLE2: claim (5, 1) instead
    at = data.index(b"K\x04K\x01\x86")
    data[at + 1] = 5
    with pytest.raises(UnsafePickleError, match="cannot hold 4 bytes"):
        restricted_loads(bytes(data))


def test_an_out_of_band_buffer_is_refused():
    array = np.zeros(8, dtype=np.uint8)
    data = pickle.dumps(array, protocol=5, buffer_callback=lambda _: False)
    with pytest.raises(UnsafePickleError):
        restricted_loads(data)


def test_other_numpy_numeric_functions_are_refused():
    data = pickle.dumps(np.zeros(2, np.uint8), protocol=5).replace(
        b"\x8c\x0b_frombuffer", b"\x8c\x0bfromstring_"
    )
    with pytest.raises(UnsafePickleError, match=r"numpy\._core\.numeric\.fromstring_"):
        restricted_loads(data)
