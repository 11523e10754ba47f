"""A model given the way every inference command takes it: a run folder, a weights file
(``.pt``/``.pth``/``.ckpt``/``.safetensors``, marginface's TorchScript export) or an ONNX file,
opened into an embedding module and its :class:`~marginface.models.description.ModelDescription`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..models.description import ModelDescription, describe_run, description_of_state

__all__ = [
    "RUN_DESCRIPTION_NAME",
    "describe_model",
    "describe_saved_run",
    "open_model",
    "save_description",
]

RUN_DESCRIPTION_NAME = "description.json"
"""A run folder's description once calibrated or edited (wins over the checkpoint's)."""


def describe_saved_run(saved: Any) -> ModelDescription:
    """The description of a run's checkpoint (a
    :class:`~marginface.train.state.run_state.SavedRun`): ``RUN/description.json`` when present,
    else the checkpoint's own, else one made from its configuration (checkpoints written before
    descriptions)."""
    sidecar = Path(saved.run_dir) / RUN_DESCRIPTION_NAME
    if sidecar.is_file():
        text = sidecar.read_text(encoding="utf-8")
        return ModelDescription.from_json(text, source=str(sidecar))
    found = description_of_state(
        {"description": saved.contents["description"]} if "description" in saved.contents else {},
        str(saved.source),
    )
    if found is None:
        found = describe_run(saved.train_config().to_dict(), saved.meta, saved.history)
    return found


def _describe_run_folder(run_dir: Path) -> tuple[Any, ModelDescription]:
    """The run's checkpoint (read once) and its description."""
    from ..train.state.run_state import read_saved_run

    saved = read_saved_run(run_dir)
    return saved, describe_saved_run(saved)


def describe_model(source: str | os.PathLike[str]) -> ModelDescription | None:
    """The description of a run folder, weights file or ONNX file, or None when the file
    carries none (insightface's and AdaFace's files).

    Raises:
        ValueError: no such file or folder; a malformed or newer description (file named).
    """
    path = Path(source)
    if path.is_dir():
        return _describe_run_folder(path)[1]
    if not path.is_file():
        raise ValueError(f"no model at {path}: give a run folder, a weights file or an ONNX file")
    from ..models.description import read_description

    return read_description(path)


def open_model(
    source: str | os.PathLike[str], *, device: torch.device | str = "cpu", **options: Any
) -> tuple[nn.Module, ModelDescription]:
    """The embedding module (eval mode, on ``device``) and description of ``source``.

    Args:
        source: a run folder (its checkpoint), a weights file or an ONNX file.
        device: where the module is put. Default: the CPU.
        **options: for a file without description (insightface's ``backbone.pth``): the options
            of :func:`~marginface.models.pretrained.load_described_backbone` (``model``,
            ``embedding_dim``, ``image_size``, ``bgr``...); ignored for a run folder.

    Raises:
        ValueError: no such file or folder; a file without description and no ``model`` (one
            line naming the options needed); a damaged checkpoint; a file that does not fit.
    """
    path = Path(source)
    if path.is_dir():
        from ..train.run import load_run

        saved, description = _describe_run_folder(path)
        run = load_run(path, device=device, saved=saved)
        return run.model, description
    if not path.is_file():
        raise ValueError(f"no model at {path}: give a run folder, a weights file or an ONNX file")
    from ..models.pretrained import load_described_backbone

    given = {k: v for k, v in options.items() if v is not None}
    return load_described_backbone(path, device=device, **given)


def save_description(source: str | os.PathLike[str], description: ModelDescription) -> Path:
    """Write ``description`` where :func:`describe_model` reads it first: ``RUN/description.json``
    for a run folder, ``FILE.json`` beside a file. Returns the path written (atomically)."""
    from .._atomic import atomic_write_text
    from ..models.description import write_description_sidecar

    path = Path(source)
    if path.is_dir():
        text = description.to_json() + "\n"
        return atomic_write_text(path / RUN_DESCRIPTION_NAME, text)
    return write_description_sidecar(path, description)
