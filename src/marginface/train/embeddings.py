"""Embedding extraction in batches, optionally averaged with the horizontally flipped image."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["extract_embeddings"]


@torch.no_grad()
def extract_embeddings(
    model: nn.Module,
    images: np.ndarray | Tensor,
    *,
    batch_size: int = 1024,
    device: torch.device | str = "cpu",
    flip: bool = False,
    channels_last: bool = False,
    amp_dtype: torch.dtype | None = None,
    transform: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Embeddings ``Tensor[N, D]`` (float32, on CPU, not normalized) of ``images[N, C, H, W]``.

    The model is put in eval mode (and restored to its previous mode afterwards).
    ``flip=True`` returns ``(f(x) + f(flip_w(x))) / 2``, the usual test-time augmentation of
    face verification. ``transform`` maps each batch (on ``device``) to model input, e.g.
    ``uint8`` images to normalized floats
    (:meth:`~marginface.data.base.VerificationSet.model_input`).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    if images.ndim != 4:
        raise ValueError(f"images must have shape (N, C, H, W), got {tuple(images.shape)}")
    was_training = model.training
    model.eval()
    device = torch.device(device)
    outputs: list[Tensor] = []
    try:
        for start in range(0, images.shape[0], batch_size):
            batch = torch.as_tensor(images[start : start + batch_size]).to(device)
            if transform is not None:
                batch = transform(batch)
            if channels_last:
                batch = batch.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                out = model(batch).float()  # (B, D)
                if flip:
                    out = (out + model(torch.flip(batch, dims=(3,))).float()) / 2
            outputs.append(out.cpu())
    finally:
        model.train(was_training)
    if not outputs:
        raise ValueError("images is empty (N = 0)")
    return torch.cat(outputs)
