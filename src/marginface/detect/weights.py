"""Finding and reading MTCNN's pretrained weights (facenet-pytorch 2.6.0's, MIT licence).

The three files ``pnet.pt``, ``rnet.pt`` and ``onet.pt`` are the state dicts that
facenet-pytorch ships in ``facenet_pytorch/data/`` (converted by its author from the MTCNN
authors' Caffe models; K. Zhang et al., "Joint Face Detection and Alignment using Multi-task
Cascaded Convolutional Networks", IEEE SPL 2016). facenet-pytorch itself pins ``torch<2.3`` and
imports torchvision, so it is never imported: its files are obtained with

    pip install --no-deps facenet-pytorch==2.6.0      (or: pip download --no-deps ... -d DIR)

and read with ``torch.load(weights_only=True)`` from the installed package folder (found
through ``importlib.util.find_spec``, which does not run the package), from the wheel file
itself, or from a folder holding the three files.
"""

from __future__ import annotations

import importlib.util
import io
import os
import zipfile
from pathlib import Path

import torch
from torch import Tensor

__all__ = [
    "INSTALL_HINT",
    "MTCNN_WEIGHT_NAMES",
    "WeightsError",
    "find_mtcnn_weights",
    "read_mtcnn_weights",
]

MTCNN_WEIGHT_NAMES = ("pnet", "rnet", "onet")
"""The three networks, in cascade order; their files are ``<name>.pt``."""

INSTALL_HINT = (
    "MTCNN's weights are facenet-pytorch 2.6.0's (MIT licence): "
    "pip install --no-deps facenet-pytorch==2.6.0 (never imported; --no-deps keeps your torch), "
    "or pass the wheel file or a folder holding pnet.pt, rnet.pt, onet.pt"
)
"""Where the weights come from, said in every error about them."""


class WeightsError(ValueError):
    """The detector's weights are missing or are not what the detector expects."""


def find_mtcnn_weights() -> Path:
    """The installed ``facenet_pytorch/data`` folder, found without importing the package.

    Raises:
        WeightsError: facenet-pytorch is not installed (the message says how to install it).
    """
    try:
        spec = importlib.util.find_spec("facenet_pytorch")
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        data = Path(folder) / "data"
        if all((data / f"{name}.pt").is_file() for name in MTCNN_WEIGHT_NAMES):
            return data
    raise WeightsError(
        f"MTCNN weights not found (facenet-pytorch is not installed). {INSTALL_HINT}"
    )


def _load(raw: bytes | Path, where: str) -> dict[str, Tensor]:
    source = io.BytesIO(raw) if isinstance(raw, bytes) else raw
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as error:  # pickle, zip and torch errors alike: one line naming the file
        raise WeightsError(f"{where}: not a readable torch weights file ({error})") from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()
    ):
        raise WeightsError(f"{where}: not a state dict of tensors (got {type(state).__name__})")
    return state


def read_mtcnn_weights(
    source: str | os.PathLike[str] | None = None,
) -> dict[str, dict[str, Tensor]]:
    """The three state dicts ``{"pnet": ..., "rnet": ..., "onet": ...}`` (CPU tensors).

    Args:
        source: None (the installed facenet-pytorch, :func:`find_mtcnn_weights`), a folder
            holding ``pnet.pt``, ``rnet.pt``, ``onet.pt`` (or ``facenet_pytorch/data/`` below
            it), or facenet-pytorch's wheel file (``.whl``, read as a zip, not installed).

    Raises:
        WeightsError: missing files or a file that is not a state dict of tensors; the
            message names the file and says where the weights come from. Whether the tensors
            fit MTCNN's layers is checked when they are loaded into the networks.
    """
    if source is None:
        source = find_mtcnn_weights()
    path = Path(source)
    if path.is_file() and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as wheel:
            names = set(wheel.namelist())
            found = {}
            for name in MTCNN_WEIGHT_NAMES:
                member = f"facenet_pytorch/data/{name}.pt"
                if member not in names:
                    raise WeightsError(f"{path}: no {member} in this zip file. {INSTALL_HINT}")
                found[name] = _load(wheel.read(member), f"{path}!{member}")
            return found
    if path.is_dir():
        folder = path / "facenet_pytorch" / "data" if (path / "facenet_pytorch").is_dir() else path
        missing = [n for n in MTCNN_WEIGHT_NAMES if not (folder / f"{n}.pt").is_file()]
        if missing:
            raise WeightsError(f"{folder}: no {missing[0]}.pt here. {INSTALL_HINT}")
        return {n: _load(folder / f"{n}.pt", str(folder / f"{n}.pt")) for n in MTCNN_WEIGHT_NAMES}
    kind = "not a zip file (a wheel)" if path.is_file() else "no such file or folder"
    raise WeightsError(f"{path}: {kind}. {INSTALL_HINT}")
