"""A model given the way every inference command takes it: a run folder, a weights file
(``.pt``/``.pth``/``.ckpt``/``.safetensors``, marginface's TorchScript export), an ONNX file, or
the name of a pretrained model (``"dlib-resnet-v1"``, :mod:`marginface.models.catalogue`),
opened into an embedding module and its :class:`~marginface.models.description.ModelDescription`.

A path that exists wins over a pretrained name spelt the same.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..models.catalogue import pretrained_name
from ..models.description import ModelDescription, describe_run, description_of_state

__all__ = [
    "describe_model",
    "describe_saved_run",
    "open_model",
    "save_description",
]


def describe_saved_run(saved: Any) -> ModelDescription:
    """The description of a run's checkpoint (a
    :class:`~marginface.train.state.run_state.SavedRun`): ``RUN/description.json`` when present,
    else the checkpoint's own, else one made from its configuration (checkpoints written before
    descriptions)."""
    from ..train.state.layout import DESCRIPTION_NAME

    sidecar = Path(saved.run_dir) / DESCRIPTION_NAME
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


def _no_model(path: Path) -> ValueError:
    """The one-line error for a source that is no file, folder or pretrained name; a word
    without a folder or suffix is taken for a misspelt name (did you mean)."""
    from .._registry import describe_unknown
    from ..models.catalogue import PRETRAINED

    text = str(path)
    if os.sep not in text and "/" not in text and not path.suffix:
        return ValueError(
            f"no model at {text}: not a run folder, a weights file or a pretrained model "
            f"({describe_unknown([text], PRETRAINED.names(include_aliases=True))}); "
            "`marginface models` lists the pretrained ones"
        )
    return ValueError(
        f"no model at {path}: give a run folder, a weights file, an ONNX file or a pretrained "
        "model's name (`marginface models`)"
    )


def describe_model(source: str | os.PathLike[str]) -> ModelDescription | None:
    """The description of a run folder, weights file, ONNX file or pretrained model's name,
    or None when the file carries none (insightface's and AdaFace's files).

    Raises:
        ValueError: no such file, folder or name; a malformed or newer description (file
            named).
    """
    name = pretrained_name(source)
    if name is not None:
        from ..models.catalogue import find_pretrained

        return find_pretrained(name).description
    path = Path(source)
    if path.is_dir():
        return _describe_run_folder(path)[1]
    if not path.is_file():
        raise _no_model(path)
    from ..models.description import read_description

    return read_description(path)


def open_model(
    source: str | os.PathLike[str], *, device: torch.device | str = "cpu", **options: Any
) -> tuple[nn.Module, ModelDescription]:
    """The embedding module (eval mode, on ``device``) and description of ``source``.

    Args:
        source: a run folder (its checkpoint), a weights file, an ONNX file, or a pretrained
            model's name (:func:`~marginface.models.catalogue.open_pretrained`: its file is
            found on this machine, never downloaded here).
        device: where the module is put. Default: the CPU.
        **options: for a file without description (insightface's ``backbone.pth``): the options
            of :func:`~marginface.models.pretrained.load_described_backbone` (``model``,
            ``embedding_dim``, ``image_size``, ``bgr``...); ignored for a run folder.

    Raises:
        ValueError: no such file, folder or name; a file without description and no ``model``
            (one line naming the options needed); a damaged checkpoint; a file that does not
            fit.
    """
    name = pretrained_name(source)
    if name is not None:
        from ..models.catalogue import open_pretrained

        module, description, _ = open_pretrained(name, device=device)
        return module, description
    path = Path(source)
    if path.is_dir():
        from ..train.state.loaded_run import load_run

        saved, description = _describe_run_folder(path)
        run = load_run(path, device=device, saved=saved)
        return run.model, description
    if not path.is_file():
        raise _no_model(path)
    from ..models.pretrained import load_described_backbone

    given = {k: v for k, v in options.items() if v is not None}
    return load_described_backbone(path, device=device, **given)


def save_description(source: str | os.PathLike[str], description: ModelDescription) -> Path:
    """Write ``description`` where :func:`describe_model` reads it first: ``RUN/description.json``
    for a run folder, ``FILE.json`` beside a file. Returns the path written (atomically)."""
    from .._atomic import atomic_write_text
    from ..models.description import write_description_sidecar
    from ..train.state.layout import DESCRIPTION_NAME

    path = Path(source)
    if path.is_dir():
        text = description.to_json() + "\n"
        return atomic_write_text(path / DESCRIPTION_NAME, text)
    return write_description_sidecar(path, description)
