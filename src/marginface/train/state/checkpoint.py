"""Checkpoints that are safe to open and that notice damage.

Format (version 4): one ``torch.save`` file holding a plain dict — ``epoch``, ``config``
(the :class:`~marginface.train.config.TrainConfig` as a dict), ``meta``, ``history`` (the
per-epoch log rows up to ``epoch``), the ``model``/``loss``/``optimizer``/``scheduler``/``scaler``
state dicts, ``rng`` (and ``cuda_rng``), ``host_rng`` (Python's and NumPy's generators),
``position`` (where inside epoch ``epoch`` a step checkpoint was taken, else None;
:mod:`.step_position`) with ``augment_rng`` (the epoch's augmentation generator), plus ``format``
(``"marginface-checkpoint"``), ``format_version`` (4) and ``sha256``, a
digest of everything else computed by :func:`state_digest`. The file ends with a *seal*: the
zip archive's comment ``marginface-sha256:<64 hex digits>``, the sha256 of every byte of the
file before it.

* **Writing** is atomic (:func:`marginface._atomic.atomic_write`): a crash at any instant leaves
  the previous checkpoint; a full disk says so and names the file.
* **Reading** uses ``torch.load(weights_only=True)``: only tensors, numbers, strings and
  containers are rebuilt, so a file whose pickle names any other callable (a ``__reduce__``
  payload) is refused before anything in it runs, with a message naming the file and the type.
* **Damage** (a flipped byte, a truncated copy) is caught by the seal, which covers every byte
  (torch's zip reader ignores the archive's CRCs, timestamps, padding and local sizes, so a
  quarter of the bytes could change without it noticing), and by the contents' digest.

Version-3 checkpoints are version 4 without ``host_rng`` and ``position`` (always at an
epoch's end); version-2 checkpoints have the contents' digest but no seal; version-1
checkpoints (written before the format carried a version) hold the same plain types without a
digest to check, and their history comes from ``history.csv``. All load as they are.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import torch

from ..._atomic import atomic_write, remove_stale_temporaries

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "CheckpointError",
    "load_checkpoint",
    "save_checkpoint",
    "state_digest",
]

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "marginface-checkpoint"
CHECKPOINT_VERSION = 4
_SEALED_SINCE = 3
_SEAL_PREFIX = b"marginface-sha256:"
_SEAL_BYTES = len(_SEAL_PREFIX) + 64
_ZIP_END = b"PK\x05\x06"  # the zip archive's end record: 22 bytes, then its comment
_ZIP_END_BYTES = 22
_CHUNK_BYTES = 1 << 20
_HEX_DIGEST = re.compile(rb"[0-9a-f]{64}")
REQUIRED_KEYS = ("epoch", "config", "meta", "model", "loss")
_ENVELOPE_KEYS = ("format", "format_version", "sha256")
_UNSAFE_GLOBAL = re.compile(r"GLOBAL\s+([\w.]+)|global\s+'?([\w.]+)'?", re.IGNORECASE)


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, damaged, unsafe, foreign or from another
    configuration. The message is one line naming the file."""


def _feed(hasher: Any, value: Any) -> None:
    """Add ``value`` to ``hasher`` in a canonical, type-tagged form (see :func:`state_digest`)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        hasher.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        if tensor.numel():
            flat = tensor.to("cpu").contiguous().reshape(-1).view(torch.uint8)
            hasher.update(memoryview(flat.numpy()))
    elif isinstance(value, Mapping):
        hasher.update(b"D%d:" % len(value))
        for key, item in value.items():
            _feed(hasher, key)
            _feed(hasher, item)
    elif isinstance(value, (list, tuple)):
        hasher.update((b"L%d:" if isinstance(value, list) else b"U%d:") % len(value))
        for item in value:
            _feed(hasher, item)
    elif isinstance(value, (bytes, bytearray)):
        hasher.update(b"B%d:" % len(value))
        hasher.update(value)
    else:  # None, bool, int, float (nan included), str, torch.dtype/device...
        text = f"{type(value).__name__}:{value!r}".encode()
        hasher.update(b"S%d:" % len(text))
        hasher.update(text)


def state_digest(state: Mapping[str, Any]) -> str:
    """SHA-256 hex digest of a checkpoint's contents, the envelope keys excluded.

    Every tensor contributes its dtype, shape and raw bytes; dicts their keys in order; numbers
    and strings their type and ``repr``. Equal contents give equal digests on any machine with
    the same byte order; any changed value, byte or key changes it.
    """
    hasher = hashlib.sha256()
    _feed(hasher, {k: v for k, v in state.items() if k not in _ENVELOPE_KEYS})
    return hasher.hexdigest()


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` (a plain dict with at least :data:`REQUIRED_KEYS`) to ``path``
    atomically, with the format envelope and its digest. Returns the path.

    Raises:
        marginface._atomic.DiskFullError: the disk is full (the previous checkpoint is kept).
        OSError: the folder cannot be written (``PermissionError``...).
    """
    path = Path(path)
    payload = {k: v for k, v in state.items() if k not in _ENVELOPE_KEYS}
    payload["format"] = CHECKPOINT_FORMAT
    payload["format_version"] = CHECKPOINT_VERSION
    payload["sha256"] = state_digest(payload)
    remove_stale_temporaries(path.parent, path.name)
    with atomic_write(path) as stream:
        torch.save(payload, stream)
        _seal(stream)
    return path


def _sha256_of_prefix(handle: IO[bytes], size: int) -> Any:
    """A sha256 hasher fed with the first ``size`` bytes of ``handle``."""
    hasher = hashlib.sha256()
    handle.seek(0)
    remaining = size
    while remaining > 0:
        chunk = handle.read(min(remaining, _CHUNK_BYTES))
        if not chunk:
            break
        hasher.update(chunk)
        remaining -= len(chunk)
    return hasher


def _seal(stream: IO[bytes]) -> None:
    """End the archive just written to ``stream`` with its seal: the sha256 of all its bytes,
    as the zip comment (torch ends its archives with an end record without one)."""
    stream.flush()
    size = stream.tell()
    with open(stream.name, "rb") as written:
        written.seek(max(size - _ZIP_END_BYTES, 0))
        end = written.read(_ZIP_END_BYTES)
        commentable = end[:4] == _ZIP_END and end[-2:] == b"\0\0"
        hasher = _sha256_of_prefix(written, size - 2 if commentable else size)
    if commentable:
        length = _SEAL_BYTES.to_bytes(2, "little")
        hasher.update(length)
        stream.seek(size - 2)
        stream.write(length)
    # else: a plain trailer after the archive, which zip readers (torch's included) skip
    stream.write(_SEAL_PREFIX + hasher.hexdigest().encode("ascii"))


def _check_seal(path: Path) -> bool | None:
    """Whether the seal at the end of ``path`` matches its bytes (None: the file has none)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < _SEAL_BYTES:
            return None
        handle.seek(size - _SEAL_BYTES)
        seal = handle.read(_SEAL_BYTES)
        if not seal.startswith(_SEAL_PREFIX):
            return None
        expected = seal[len(_SEAL_PREFIX) :]
        if _HEX_DIGEST.fullmatch(expected) is None:
            return False
        actual = _sha256_of_prefix(handle, size - _SEAL_BYTES).hexdigest()
    return actual == expected.decode("ascii")


def _unsafe_global(error: BaseException, path: Path) -> str:
    """The offending ``module.name`` of a refused pickle, as far as it can be known."""
    match = _UNSAFE_GLOBAL.search(str(error))
    if match:
        return match.group(1) or match.group(2)
    finder = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if finder is not None:
        try:
            names = finder(str(path))
        except Exception:
            names = []
        if names:
            return ", ".join(names)
    return "a type outside tensors, numbers, strings and containers"


def _looks_like_torch_file(path: Path) -> bool:
    """Whether ``path`` starts as ``torch.save`` files do: a zip archive, or a pickle
    (protocol 2+ opens with ``0x80``)."""
    try:
        with open(path, "rb") as stream:
            head = stream.read(4)
    except OSError:
        return True  # let torch's own error speak
    return head.startswith((b"PK\x03\x04", b"\x80"))


def _describe_foreign(state: Any) -> str:
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}"
    if state and all(isinstance(v, torch.Tensor) for v in state.values()):
        return f"it is a bare state_dict of {len(state)} tensors (a model's weights only)"
    keys = ", ".join(sorted(map(str, state))[:8]) or "none"
    return f"it is a dict with keys {keys}"


def load_checkpoint(path: str | Path, *, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint written by :func:`save_checkpoint` (or by versions 1 and 2), safely.

    Args:
        path: the ``checkpoint.pt`` file.
        map_location: where tensors are put. Default: the CPU.

    Returns:
        The state dict (envelope keys included).

    Raises:
        CheckpointError: missing; damaged (its bytes do not match its seal, or a format-3
            file without one; its contents do not match their digest); not a zip/pickle torch
            can read (truncated, corrupt); needing a type that ``weights_only`` loading refuses
            (nothing from it runs); not a marginface checkpoint; or from a newer format.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        sealed = _check_seal(path)
    except OSError as error:
        raise CheckpointError(
            f"checkpoint {path} is unreadable ({error.strerror or error})"
        ) from error
    if sealed is False:
        raise CheckpointError(
            f"checkpoint {path} is damaged: its bytes do not match the sha256 it ends with (a "
            "changed byte on disk or an altered copy); restore it from a copy or start the run "
            "again with --overwrite"
        )
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        if not _looks_like_torch_file(path):
            raise CheckpointError(
                f"checkpoint {path} is not a PyTorch file (neither a zip archive nor a pickle): "
                "damaged, or another program's file; restore it from a copy"
            ) from None
        raise CheckpointError(
            f"refused to load {path}: it needs {_unsafe_global(error, path)}, which a marginface "
            "checkpoint never holds and which could run code; nothing from the file was executed"
        ) from None
    except Exception as error:  # torch raises several kinds for a truncated/corrupt file
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable ({reason})") from error
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        raise CheckpointError(
            f"{path} is not a marginface checkpoint: {_describe_foreign(state)}; expected a "
            f"dict with {', '.join(REQUIRED_KEYS)} written by `marginface train`"
        )
    version = state.get("format_version", 1)
    if not isinstance(version, int) or version > CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format {version!r}, newer than this marginface reads "
            f"({CHECKPOINT_VERSION}); upgrade marginface"
        )
    if version >= _SEALED_SINCE and sealed is None:
        raise CheckpointError(
            f"checkpoint {path} is damaged: format {version} ends with the sha256 of its bytes, "
            "and this file does not (cut short, altered, or re-saved by another program); "
            "restore it from a copy or start the run again with --overwrite"
        )
    if version >= 2:
        expected = state.get("sha256")
        if state.get("format") != CHECKPOINT_FORMAT or expected != state_digest(state):
            raise CheckpointError(
                f"checkpoint {path} is damaged: its contents do not match their sha256 "
                "(a changed byte on disk or an altered copy); restore it from a copy or start "
                "the run again with --overwrite"
            )
    else:
        logger.info("%s: format 1 checkpoint (no checksum to verify)", os.fspath(path))
    return state
