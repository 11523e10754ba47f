"""Backbones from files people already have: state_dicts (``.pth``/``.pt``/``.ckpt``,
``.safetensors``) and ONNX graphs, as one embedding module.

:func:`load_backbone` is the one entry point of ``marginface evaluate --backbone/--onnx`` and
``train --init-from`` (and of any command that embeds with a foreign model): it returns an
``nn.Module`` mapping ``Tensor[N, C, H, W]`` images, normalized as the model expects, to
``Tensor[N, D]`` embeddings.

Files are opened safely: ``torch.load(weights_only=True)`` (only tensors, numbers, strings and
containers are rebuilt; docs/safety.md) or safetensors (no pickle at all). Every problem is a
``ValueError`` of one line naming the file: a type the safe loader refuses, keys that do not fit
the architecture (how many are missing and unexpected, with examples), a channel count or an
input layout (channels-last ONNX graphs) the data does not have.

Input convention of insightface's and AdaFace's weights (docs/backbones.md): 112×112 aligned
faces, ``(x / 255 - 0.5) / 0.5`` per channel; RGB for insightface (its ONNX packs included),
BGR for AdaFace (mapped to RGB on load unless ``rgb=False``). A model that expects BGR is
wrapped by :class:`ReversedChannels` (``bgr=True``).
"""

from __future__ import annotations

import importlib
import os
import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .adaface import adaface_to_iresnet, is_adaface_state_dict
from .description import (
    ModelDescription,
    description_of_state,
    is_torchscript,
    read_description,
    sidecar_path,
)
from .iresnet import IResNet, infer_iresnet, rename_legacy_keys
from .registry import create_model, list_models

__all__ = [
    "OnnxBackbone",
    "ReversedChannels",
    "load_backbone",
    "load_backbone_weights",
    "load_described_backbone",
    "read_backbone_file",
    "read_state_dict",
]

_CONTAINER_KEYS = ("state_dict", "model", "backbone")
_UNSAFE_GLOBAL = re.compile(r"GLOBAL\s+([\w.]+)")


def _examples(keys: list[str], count: int = 3) -> str:
    shown = ", ".join(keys[:count])
    return shown + (", ..." if len(keys) > count else "")


def _load_file(path: Path) -> Any:
    """What a backbone file holds, read safely (see :func:`read_state_dict`)."""
    if not path.is_file():
        raise ValueError(f"no backbone file at {path}")
    if path.suffix == ".safetensors":
        try:
            safetensors_torch = importlib.import_module("safetensors.torch")
        except ImportError as error:
            raise ImportError(
                f"reading {path} needs the optional package safetensors: "
                "pip install 'marginface[safetensors]'"
            ) from error
        try:
            return safetensors_torch.load_file(str(path), device="cpu")
        except Exception as error:
            raise ValueError(f"{path} is not a readable safetensors file ({error})") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        match = _UNSAFE_GLOBAL.search(str(error))
        if match is None:
            raise ValueError(f"{path} is not a readable PyTorch file") from None
        raise ValueError(
            f"refused to load {path}: it needs {match.group(1)}, a type outside tensors, "
            "numbers, strings and containers that could run code; nothing from it was "
            "executed"
        ) from None
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        with open(path, "rb") as stream:
            head = stream.read(4)
        if not head.startswith((b"PK\x03\x04", b"\x80")):  # torch.save's zip, or a pickle
            reason = "neither a zip archive nor a pickle: damaged, or another format"
        raise ValueError(
            f"{path} is not a readable PyTorch file ({reason or type(error).__name__})"
        ) from None


def _tensors_of(state: Any, path: Path) -> dict[str, Tensor]:
    """The backbone's tensors inside a loaded file (a checkpoint's ``model``...)."""
    for key in _CONTAINER_KEYS:  # a checkpoint holding the weights under one key
        if isinstance(state, Mapping) and isinstance(state.get(key), Mapping):
            state = state[key]
            break
    if not isinstance(state, Mapping) or not any(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"{path} holds no state_dict (a mapping of names to tensors)")
    tensors = {str(k): v for k, v in state.items() if isinstance(v, Tensor)}
    if tensors and all(k.startswith("module.") for k in tensors):
        tensors = {k[len("module.") :]: v for k, v in tensors.items()}
    return tensors


def read_state_dict(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """The tensors of a backbone file, read safely.

    * ``.safetensors``: read with safetensors (needs the ``marginface[safetensors]`` extra).
    * anything else: ``torch.load(weights_only=True)`` on the CPU. A bare state_dict
      (insightface's ``backbone.pth``), a marginface ``checkpoint.pt`` (its ``model``), a
      Lightning checkpoint (its ``state_dict``, AdaFace's ``.ckpt``) are all accepted; a
      ``module.`` prefix (DistributedDataParallel) is removed.

    Raises:
        ValueError: missing or unreadable file, a refused type, no tensors (file named).
    """
    return read_backbone_file(path)[0]


def read_backbone_file(
    path: str | os.PathLike[str],
) -> tuple[dict[str, Tensor], ModelDescription | None]:
    """:func:`read_state_dict`'s tensors and the file's description (the file read once), or
    None when it carries none (:func:`~marginface.models.description.read_description`).

    Raises:
        ValueError: as :func:`read_state_dict`; a malformed or newer description.
    """
    path = Path(path)
    state = _load_file(path)
    sidecar = sidecar_path(path)
    if sidecar.is_file() or path.suffix == ".safetensors":
        description = read_description(path)
    else:
        description = description_of_state(state, str(path))
    return _tensors_of(state, path), description


def load_backbone_weights(
    model: nn.Module, state: Mapping[str, Tensor], *, source: str, name: str = "the model"
) -> None:
    """``model.load_state_dict(state, strict=True)``, with one line naming ``source`` when the
    file does not fit: how many keys are missing and unexpected (with examples), integer or
    quantized tensors where the model's are floating point (never cast silently: int8 weights
    cast to float are other weights), which tensors have other shapes, or the first
    convolution's channel count. A model that defines ``adapt_state_dict(state)`` gets the file's
    tensors through it first (:class:`~.inception_resnet_v1.InceptionResnetV1` drops the
    classifier that facenet-pytorch's published files carry).

    Raises:
        ValueError: as above.
    """
    state = dict(state)
    if isinstance(model, IResNet):  # an IResNet's names before they were insightface's
        rename_legacy_keys(state)  # (other models may own stem./stages. names: dlib's)
    adapt = getattr(model, "adapt_state_dict", None)
    if callable(adapt):  # keys a foreign file carries beside the backbone (facenet's logits)
        state = dict(adapt(state))
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    reshaped = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected:
        raise ValueError(
            f"{source} does not fit {name}: {len(missing)} of its {len(expected)} keys are "
            f"missing from the file ({_examples(missing) or 'none'}) and {len(unexpected)} in "
            f"the file are unexpected ({_examples(unexpected) or 'none'}); is --model right?"
        )
    retyped = [
        k for k in expected if expected[k].is_floating_point() and not state[k].is_floating_point()
    ]
    if retyped:
        first = retyped[0]
        raise ValueError(
            f"{source} holds {state[first].dtype} tensors where {name} has floating-point "
            f"weights ({len(retyped)} tensors, e.g. {first}): quantized or integer weights "
            "are not cast silently; dequantize them to float first"
        )
    if reshaped:
        first = reshaped[0]
        theirs, ours = tuple(state[first].shape), tuple(expected[first].shape)
        # the model's first 4-D weight is its first convolution (conv1, a patch embedding)
        first_conv = first == next((k for k, v in expected.items() if v.ndim == 4), None)
        if first_conv and len(theirs) == 4 and theirs[1] != ours[1] and theirs[0] == ours[0]:
            raise ValueError(
                f"{source} takes {theirs[1]}-channel images (its first convolution), "
                f"{name} was built for {ours[1]}-channel images: check the channel order "
                "and count (insightface: 3, RGB)"
            )
        raise ValueError(
            f"{source} does not fit {name}: {len(reshaped)} tensors have other shapes "
            f"({first}: {theirs} in the file, {ours} in the model); check --model, "
            "--embedding-dim and --image-size"
        )
    model.load_state_dict(state, strict=True)


class ReversedChannels(nn.Module):
    """Feed ``model`` its input with the channel axis reversed (RGB ↔ BGR):
    ``Tensor[N, C, H, W] -> model(x[:, ::-1])``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: Tensor) -> Tensor:
        return self.model(torch.flip(images, dims=(1,)))


class OnnxBackbone(nn.Module):
    """An ONNX embedding graph run by ONNX Runtime, as a module ``Tensor[N, C, H, W] ->
    Tensor[N, D]`` (float32, on the input's device; no gradient).

    Args:
        path: the ``.onnx`` file (e.g. insightface's ``w600k_r50.onnx``: input ``(N, 3, 112,
            112)``, RGB, ``(x / 255 - 0.5) / 0.5``).
        in_channels, image_size: what the data has; checked against the graph's input.
            ``image_size`` None: not checked (the graph's side is :attr:`input_size`).
        providers: ONNX Runtime execution providers. Default: the CPU's.

    Attributes:
        input_size: ``(height, width)`` of the graph's input, each None where the graph leaves
            it dynamic.

    Raises:
        ImportError: onnxruntime is missing (``marginface[onnx]``).
        ValueError: not an ONNX file, more than one input, a channels-last input, or another
            channel count or image size than the data's (file named).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        in_channels: int = 3,
        image_size: int | None = 112,
        providers: list[str] | None = None,
    ) -> None:
        super().__init__()
        try:
            onnxruntime = importlib.import_module("onnxruntime")
        except ImportError as error:
            raise ImportError(
                "--onnx needs the optional package onnxruntime: pip install 'marginface[onnx]'"
            ) from error
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no ONNX file at {path}")
        try:
            self.session = onnxruntime.InferenceSession(
                str(path), providers=providers or ["CPUExecutionProvider"]
            )
        except Exception as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise ValueError(f"{path} is not a readable ONNX model ({reason[:200]})") from None
        inputs = self.session.get_inputs()
        if len(inputs) != 1:
            raise ValueError(f"{path} has {len(inputs)} inputs; an embedding model has one")
        shape = list(inputs[0].shape)
        self.input_name = inputs[0].name
        if len(shape) != 4:
            raise ValueError(f"{path} takes a {len(shape)}-D input {shape}; expected (N, C, H, W)")
        channels, height, width = shape[1:]
        if channels != in_channels and width == in_channels:
            raise ValueError(
                f"{path} takes channels-last images {shape} (N, H, W, C); marginface feeds "
                f"(N, C, H, W): export the model with channels first"
            )
        if isinstance(channels, int) and channels != in_channels:
            raise ValueError(
                f"{path} takes {channels}-channel images, the data has {in_channels}: check the "
                "channel order and count"
            )
        self.input_size: tuple[int | None, int | None] = (
            height if isinstance(height, int) else None,
            width if isinstance(width, int) else None,
        )
        for side in self.input_size:
            if image_size is not None and side is not None and side != image_size:
                raise ValueError(
                    f"{path} takes {height}x{width} images (its ONNX input {shape}), but the "
                    f"images are resized to {image_size}x{image_size} (image_size = "
                    f"{image_size}): pass --image-size {side}, or image_size=None to use the "
                    "model's side"
                )
        self.path = path
        # a graph exported with a fixed batch (often 1) is fed that many images at a time
        batch = shape[0]
        self.fixed_batch = batch if isinstance(batch, int) and batch > 0 else None

    def forward(self, images: Tensor) -> Tensor:
        """``Tensor[N, C, H, W] -> Tensor[N, D]`` float32 on ``images``' device; a graph of
        fixed batch ``B`` is run on slices of ``B`` images (the last one zero-padded)."""
        x = images.detach().to("cpu", torch.float32).contiguous()
        size = self.fixed_batch
        if size is None or x.shape[0] == size:
            (out, *_) = self.session.run(None, {self.input_name: x.numpy()})
            return torch.from_numpy(out).float().to(images.device)  # (N, D)
        parts = []
        for start in range(0, x.shape[0], size):
            part = x[start : start + size]
            count = part.shape[0]
            if count < size:  # (size, C, H, W): the rest of the slice is zeros
                part = torch.cat([part, part.new_zeros(size - count, *part.shape[1:])])
            (out, *_) = self.session.run(None, {self.input_name: part.numpy()})
            parts.append(torch.from_numpy(out[:count]).float())
        return torch.cat(parts).to(images.device)  # (N, D)


def read_backbone_state(
    path: str | os.PathLike[str], model: str | None = None
) -> tuple[dict[str, Tensor], str]:
    """``path``'s backbone weights (:func:`read_state_dict`) and the architecture they are for:
    ``model``, or the IResNet depth of an AdaFace checkpoint (mapped onto IResNet's names).

    Raises:
        ValueError: an unreadable file (named), or no ``model`` for a file that does not say.
    """
    source = str(path)
    state = read_state_dict(path)
    if is_adaface_state_dict(state):
        state, depth = adaface_to_iresnet(state, source=source)
        model = model or f"r{depth}"
    if model is None:
        raise ValueError(
            f"which architecture is {source}? pass model= (--model): {', '.join(list_models())}"
        )
    return state, model


def _missing_options_message(source: str) -> str:
    return (
        f"which architecture is {source}? it carries no marginface description: pass "
        f"model= (--model: {', '.join(list_models())}), and embedding_dim= (--embedding-dim) "
        "and image_size= (--image-size) unless they are insightface's 512 and 112"
    )


def load_described_backbone(
    path: str | os.PathLike[str] | None = None,
    *,
    onnx: str | os.PathLike[str] | None = None,
    model: str | None = None,
    embedding_dim: int | None = None,
    in_channels: int | None = None,
    image_size: int | None = None,
    bgr: bool | None = None,
    device: torch.device | str = "cpu",
    **options: Any,
) -> tuple[nn.Module, ModelDescription]:
    """:func:`load_backbone`'s module and the description it was built from.

    A file marginface wrote carries its description
    (:mod:`~marginface.models.description`): every option left None is read from it. A file
    without one (insightface's ``backbone.pth``, AdaFace's ``.ckpt``, a foreign ONNX graph)
    takes the options it needs today, insightface's defaults filling the rest (512, 3, 112,
    RGB, ``(x / 255 - 0.5) / 0.5``); the returned description then says what was assumed.
    An option given explicitly wins over the file's description.

    A TorchScript file (``marginface export``'s ``model.ts``, with its ``model.ts.json``) is
    loaded with ``torch.jit.load``: it runs the file's TorchScript code, so open only files
    you trust.

    Raises:
        ValueError: neither or both sources; a file without description nor ``model``
            (one line naming the options needed); a file that does not fit.
    """
    if (path is None) == (onnx is None):
        raise ValueError("give exactly one backbone source: a state_dict file or an ONNX file")
    if bgr is not None and not isinstance(bgr, bool):
        raise TypeError(f"bgr must be a bool, got {bgr!r}")
    if path is not None and Path(path).suffix == ".onnx" and Path(path).is_file():
        path, onnx = None, path
    if onnx is not None:
        if model is not None:
            raise ValueError(f"an ONNX file brings its own architecture; model={model!r} is unused")
        found = read_description(onnx)
        channels = in_channels or (found.in_channels if found else 3)
        side = image_size if image_size is not None else (found.side if found else None)
        onnx_backbone = OnnxBackbone(onnx, in_channels=channels, image_size=side)
        backbone: nn.Module = onnx_backbone
        description = found or ModelDescription(
            architecture="onnx",
            embedding_dim=embedding_dim or 512,
            in_channels=channels,
            image_size=side or onnx_backbone.input_size[0] or 112,
            colour="grey" if channels == 1 else "rgb",
        )
        if found is None and embedding_dim is None:
            description = description.replace(embedding_dim=_onnx_output_size(backbone) or 512)
    elif is_torchscript(Path(path)):  # type: ignore[arg-type]
        found = read_description(path)  # type: ignore[arg-type]
        if found is None:
            raise ValueError(
                f"{path} is a TorchScript file without its description "
                f"({sidecar_path(path).name}, written beside it by marginface export): "  # type: ignore[arg-type]
                "put that file back, or load the model with torch.jit.load"
            )
        with warnings.catch_warnings():  # deprecated upstream, still the format it is
            warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*torch.jit.*")
            backbone = torch.jit.load(str(path), map_location="cpu")
        description = found
    else:
        source = str(path)
        state, found = read_backbone_file(path)  # type: ignore[arg-type]
        if is_adaface_state_dict(state):
            state, depth = adaface_to_iresnet(state, source=source)
            model = model or f"r{depth}"
        if model is None and found is None:
            recognised = infer_iresnet(state)  # insightface's arcface_torch backbone.pth
            if recognised is None:
                raise ValueError(_missing_options_message(source))
            model, recognised_dim, recognised_side = recognised
            embedding_dim = embedding_dim or recognised_dim
            image_size = image_size if image_size is not None else recognised_side
        if found is not None and (model is None or model == found.architecture):
            options = {**found.architecture_options, **options}
            model = found.architecture
        elif found is not None:
            found = None  # another architecture asked for: the file's description does not apply
        assert model is not None
        channels = in_channels or (found.in_channels if found else 3)
        if image_size is None:
            size: Any = found.image_size if found else 112
            if isinstance(size, tuple) and size[0] == size[1]:
                size = size[0]
        else:
            size = image_size
        dim = embedding_dim or (found.embedding_dim if found else 512)
        backbone = create_model(
            model, embedding_dim=dim, in_channels=channels, image_size=size, **options
        )
        load_backbone_weights(backbone, state, source=source, name=model)
        description = (
            found
            or ModelDescription(
                architecture=model,
                embedding_dim=dim,
                in_channels=channels,
                image_size=size,
                architecture_options=dict(options),
                colour="grey" if channels == 1 else "rgb",
            )
        ).replace(embedding_dim=dim, in_channels=channels, image_size=size)
    if bgr is not None:
        colour = "bgr" if bgr else ("grey" if description.in_channels == 1 else "rgb")
        description = description.replace(colour=colour)
    if description.colour == "bgr":
        backbone = ReversedChannels(backbone)
    return backbone.to(device).eval(), description


def _onnx_output_size(backbone: OnnxBackbone) -> int | None:
    """The graph's output width when fixed, else None."""
    shape = backbone.session.get_outputs()[0].shape
    return shape[-1] if shape and isinstance(shape[-1], int) else None


def load_backbone(
    path: str | os.PathLike[str] | None = None,
    *,
    onnx: str | os.PathLike[str] | None = None,
    model: str | None = None,
    embedding_dim: int | None = None,
    in_channels: int | None = None,
    image_size: int | None = None,
    bgr: bool | None = None,
    device: torch.device | str = "cpu",
    **options: Any,
) -> nn.Module:
    """A pretrained embedding model, in eval mode, from a state_dict file, a TorchScript file
    with its description, or an ONNX graph.

    Args:
        path: a state_dict file (``.pth``, ``.pt``, ``.ckpt``, ``.safetensors``; see
            :func:`read_state_dict`), or marginface's TorchScript export. An AdaFace IR
            checkpoint is recognized by its names and mapped onto IResNet
            (:func:`~marginface.models.adaface.adaface_to_iresnet`; ``model`` may then be
            omitted), already taking RGB. A file marginface wrote needs no other option: it
            carries its description (:func:`load_described_backbone`).
        onnx: an ONNX file instead (:class:`OnnxBackbone`).
        model: the registered architecture of ``path`` (``r100``, ``mbf``, ``vit_t``...).
        embedding_dim, in_channels, image_size: the architecture's ``D``, ``C`` and side.
            Default (None): the file's description, else 512, 3, 112 (insightface's). For
            ``onnx``, ``image_size`` is checked against the graph's input; None: the
            description's side, else not checked.
        bgr: the model expects BGR: the images (RGB) are reversed on the channel axis first.
            Default (None): the description's colour order, else False.
        device: where the model is put. Default: the CPU.
        **options: further options of the architecture (e.g. ``dropout``).

    Returns:
        ``nn.Module`` ``Tensor[N, C, H, W] -> Tensor[N, D]`` in eval mode.

    Raises:
        ValueError: neither or both sources, an unknown ``model``, a file without description
            and no ``model`` (one line naming the options needed), or a file that does not fit
            (one line naming it).
    """
    backbone, _ = load_described_backbone(
        path,
        onnx=onnx,
        model=model,
        embedding_dim=embedding_dim,
        in_channels=in_channels,
        image_size=image_size,
        bgr=bgr,
        device=device,
        **options,
    )
    return backbone
