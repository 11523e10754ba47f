"""The one embedder: images → features, batch by batch, with the model's own preprocessing and
insightface's flip test. Every place that embeds images calls it (:class:`FaceModel`,
training-time evaluation, ``evaluate``, ``ijb``, ``embed``, ``gallery``).

Two levels:

- :func:`embed_batch`: one batch through the model, ``(f(x), f(flip_w(x)))`` as float32, the
  raw features (their norms are read by IJB's norm score and the XNorm figure);
- :func:`embed_batches`: a whole ``uint8[N, C, H, W]`` array (or an iterable of batches) →
  ``float32[N, D]`` unit rows, ``normalize(f(x) + f(flip_w(x)))`` with the flip test (the sum
  then the L2 normalisation: insightface's rule), ``normalize(f(x))`` without.

It imports nothing of training: ``inference/`` and ``train/`` both call it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

__all__ = ["embed_batch", "embed_batches"]

Module = Callable[[Tensor], Tensor]
"""``Tensor[B, C, H, W] -> Tensor[B, D]``: an ``nn.Module`` or any callable."""


def _check_batch_size(batch_size: object) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an int, got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return batch_size


def embed_batch(
    module: Module,
    batch: Any,
    *,
    normalise: Callable[[Tensor], Tensor] | None = None,
    flip: bool = False,
    device: torch.device | str | None = "cpu",
    dtype: torch.dtype | None = None,
    amp_dtype: torch.dtype | None = None,
    channels_last: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """One batch's raw features: ``(float32[B, D], float32[B, D] or None)``, on ``device``.

    The input is ``batch`` moved to ``device`` (None: left where it is), then
    ``normalise(batch)`` (e.g. :meth:`~marginface.models.description.ModelDescription.normalise`,
    ``(x / 255 - mean[c]) / std[c]``; None: taken as it is), cast to ``dtype`` (None: kept),
    made channels-last if asked. Its features ``f(x)``, and with ``flip`` those of its
    left-right mirror ``f(x[..., ::-1])`` (second item; None without ``flip``), are computed
    under autocast to ``amp_dtype`` when given, and returned as float32, not normalised. The
    caller runs it under ``torch.no_grad()`` and puts the module in eval mode. Without
    ``amp_dtype`` autocast is off (an autocast region around the call does not reach the
    module: ``dtype`` says the type).

    Args:
        module: the model, ``Tensor[B, C, H, W] -> Tensor[B, D]``.
        batch: ``Tensor[B, C, H, W]`` (or an array ``torch.as_tensor`` takes).
        normalise: pixels → model input, applied on ``device``. Default: None.
        flip: also embed the mirrored input. Default: False.
        device: where the module runs. Default: the CPU.
        dtype: the module's floating-point type for its input. Default: None (as it comes).
        amp_dtype: autocast type (``torch.bfloat16``...); None (default): no autocast.
        channels_last: give the input in channels-last memory format. Default: False.
    """
    x = torch.as_tensor(batch)
    if device is not None:
        x = x.to(device)
    if normalise is not None:
        x = normalise(x)
    if dtype is not None:
        x = x.to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.autocast(x.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        features = module(x).float()  # (B, D)
        mirrored = module(torch.flip(x, dims=(3,))).float() if flip else None
    return features, mirrored


@torch.no_grad()
def embed_batches(
    module: Module,
    pixels: Tensor | Iterable[Any],
    *,
    normalise: Callable[[Tensor], Tensor] | None = None,
    flip: bool = False,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    amp_dtype: torch.dtype | None = None,
    channels_last: bool = False,
    embedding_dim: int | None = None,
) -> Tensor:
    """Unit embeddings ``float32[N, D]`` of images, on ``device``, ``batch_size`` at a time.

    Row ``i`` is ``normalize(f(x_i) + f(flip_w(x_i)))`` with ``flip`` (insightface's flip
    test: the features summed, then L2-normalised), ``normalize(f(x_i))`` without, where
    ``x_i`` is image ``i`` through ``normalise`` (:func:`embed_batch`). ``normalize(v) = v /
    max(‖v‖₂, 1e-12)``.

    Args:
        module: the model, ``Tensor[B, C, H, W] -> Tensor[B, D]``, in eval mode.
        pixels: ``Tensor[N, C, H, W]`` (cut into batches of ``batch_size``) or an iterable of
            such batches (used as they come).
        normalise: pixels → model input (:meth:`ModelDescription.normalise
            <marginface.models.description.ModelDescription.normalise>`). Default: None.
        flip: the flip test. Default: False.
        batch_size: images per forward pass, for a tensor. Default: 64.
        device: where the module runs. Default: the CPU.
        dtype: the module's floating-point type. Default: None (the input's).
        amp_dtype: autocast type; None (default): none.
        channels_last: channels-last input. Default: False.
        embedding_dim: ``D``, for the ``float32[0, D]`` answer to no images. Default: None
            (no images is then ``float32[0, 0]``).

    Raises:
        TypeError, ValueError: ``batch_size`` not an int >= 1.
    """
    batch_size = _check_batch_size(batch_size)
    if isinstance(pixels, Tensor):
        batches: Iterable[Any] = (
            pixels[start : start + batch_size] for start in range(0, pixels.shape[0], batch_size)
        )
    else:
        batches = pixels
    out = []
    for batch in batches:
        features, mirrored = embed_batch(
            module,
            batch,
            normalise=normalise,
            flip=flip,
            device=device,
            dtype=dtype,
            amp_dtype=amp_dtype,
            channels_last=channels_last,
        )
        if mirrored is not None:
            features = features + mirrored
        out.append(torch.nn.functional.normalize(features, dim=1))
    if not out:
        return torch.empty(0, embedding_dim or 0, device=device)
    return torch.cat(out)
