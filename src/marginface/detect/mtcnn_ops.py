"""MTCNN's resampling and pooling, computed faster with results equal bit for bit to the
PyTorch calls facenet-pytorch makes (``F.interpolate(mode="area")``, ``MaxPool2d(ceil_mode)``).

**Area resampling** (PyTorch's adaptive average pooling, both its NCHW and channels-last CPU
kernels): output cell ``(o_h, o_w)`` of an ``H×W → h×w`` resize averages the input rows
``[floor(o_h·H/h), ceil((o_h+1)·H/h))`` and likewise the columns, as
``float32(sum) / k_h / k_w`` (two float32 divisions, ``k`` the window's rows and columns). The
pixels are integers 0..255, so every float32 partial sum is exact while the window's sum is
below ``2^24``: any summation order, here an integral image in integers, gives the same sum,
and the two divisions then give the same float32. Windows whose sum could reach ``2^24``
(more than 65,793 pixels) are not handled here (:func:`exact_area_limit`).

**Max pooling** is exact in any order; the pooling here only picks a faster memory layout.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["area_crops", "area_resize", "ceil_max_pool", "exact_area_limit", "integral_images"]

_EXACT = 1 << 24  # float32 integers are exact below this


def exact_area_limit(in_size: int, out_size: int) -> int:
    """The most pixels one window of an ``in_size → out_size`` resize (one axis) spans:
    ``ceil(in / out) + 1`` (a window may straddle one more pixel)."""
    return -(-in_size // out_size) + 1


def integral_images(images: Tensor) -> Tensor:
    """``uint8[B, H, W, C]`` → integer ``[B, H + 1, W + 1, C]`` with ``I[b, y, x] = Σ`` of the
    pixels above and left of ``(y, x)`` (int32 while ``255·H·W < 2^31``, else int64)."""
    batch, height, width, channels = images.shape
    dtype = torch.int32 if 255 * height * width < 2**31 else torch.int64
    out = images.new_zeros((batch, height + 1, width + 1, channels), dtype=dtype)
    inner = out[:, 1:, 1:]
    torch.cumsum(images, 1, dtype=dtype, out=inner)  # written in place: no temporaries
    torch.cumsum(inner, 2, out=inner)
    return out


def _windows(start: Tensor, length: Tensor, out_size: int) -> tuple[Tensor, Tensor]:
    """First and one-past-last input index of each output cell: ``start + floor(o·n/out)``,
    ``start + ceil((o+1)·n/out)``; ``start``, ``length``: ``[K]`` → ``[K, out]``."""
    o = torch.arange(out_size, device=length.device)
    first = (o[None, :] * length[:, None]).div(out_size, rounding_mode="floor")
    last = -((-(o[None, :] + 1) * length[:, None]).div(out_size, rounding_mode="floor"))
    return start[:, None] + first, start[:, None] + last


def _window_means(
    integral: Tensor, image: Tensor, rows: tuple[Tensor, Tensor], cols: tuple[Tensor, Tensor]
) -> Tensor:
    """``float32[K, h, w, C]``: each window's integer sum over ``integral[image[k]]`` divided
    by its rows then its columns, in float32 (``rows``: ``[K, h]`` pairs, ``cols``: ``[K, w]``).
    """
    (r0, r1), (c0, c1) = rows, cols
    _, height, width, channels = integral.shape  # height, width: one more than the image's
    base = (image * height)[:, None, None]
    shape = (r0.shape[0], r0.shape[1], c0.shape[1], channels)
    pixels = torch.stack(
        [
            (base + r[:, :, None]) * width + c[:, None, :]  # (K, h, w)
            for r, c in ((r1, c1), (r0, c1), (r1, c0), (r0, c0))
        ]
    ).reshape(-1)
    if integral.device.type == "cpu":  # NumPy's row take: about twice PyTorch's index_select
        rows = integral.numpy().reshape(-1, channels)
        found = torch.from_numpy(np.take(rows, pixels.numpy(), axis=0))
    else:
        found = integral.reshape(-1, channels).index_select(0, pixels)
    a, b, c, d = found.reshape(4, *shape)
    total = (a - b - c + d).to(torch.float32)
    k_h = (r1 - r0).to(torch.float32)[:, :, None, None]
    k_w = (c1 - c0).to(torch.float32)[:, None, :, None]
    return total.div_(k_h).div_(k_w)


def area_resize(integral: Tensor, size: tuple[int, int]) -> Tensor:
    """Every image resized to ``size = (h, w)`` by area averaging: ``float32[B, 3, h, w]`` in
    channels-last memory (the layout ``F.interpolate`` gives a channels-last batch), equal to
    ``F.interpolate(images.permute(0, 3, 1, 2).float(), size, mode="area")``.

    Args:
        integral: :func:`integral_images` of ``uint8[B, H, W, C]``.
        size: the output ``(h, w)``; each window must span at most 65,793 pixels.
    """
    height, width = integral.shape[1] - 1, integral.shape[2] - 1
    h, w = size
    if exact_area_limit(height, h) * exact_area_limit(width, w) * 255 >= _EXACT:
        raise ValueError(f"size {size} from {height}x{width}: windows too large to be exact")
    batch, channels = integral.shape[0], integral.shape[3]
    zero = torch.zeros(1, dtype=torch.int64, device=integral.device)
    (r0, r1), (c0, c1) = (
        (first[0], last[0])
        for first, last in (_windows(zero, zero + n, m) for n, m in ((height, h), (width, w)))
    )
    # rows gathered as whole rows of a 2-D view (a copy per row, not per number)
    rows = integral.reshape(batch * (height + 1), (width + 1) * channels)
    first = (torch.arange(batch, device=integral.device) * (height + 1))[:, None]
    strips = rows.index_select(0, (first + r1).reshape(-1)) - rows.index_select(
        0, (first + r0).reshape(-1)
    )
    strips = strips.reshape(batch * h, width + 1, channels)
    total = (strips.index_select(1, c1) - strips.index_select(1, c0)).reshape(batch, h, w, -1)
    k_h = (r1 - r0).to(torch.float32)[:, None, None]
    k_w = (c1 - c0).to(torch.float32)[None, :, None]
    return total.to(torch.float32).div_(k_h).div_(k_w).permute(0, 3, 1, 2)


def area_crops(
    integral: Tensor, image: Tensor, corners: np.ndarray, side: int
) -> tuple[Tensor, np.ndarray]:
    """Crops ``integral[image[k]]`` rows ``y1 - 1 .. y2 - 1``, columns ``x1 - 1 .. x2 - 1``
    (``corners[k] = (x1, y1, x2, y2)``, 1-based inclusive, as facenet-pytorch's ``pad``
    gives them) resized to ``side × side`` by area averaging: contiguous
    ``float32[K, 3, side, side]``, equal to ``F.interpolate(crop, (side, side), mode="area")``
    on each crop; with the boolean mask of the crops that could be made exactly (a window of
    more than 65,793 pixels is not; the caller resamples those itself).
    """
    x1, y1, x2, y2 = (torch.from_numpy(corners[:, i].astype(np.int64)) for i in range(4))
    rows_n, cols_n = y2 - y1 + 1, x2 - x1 + 1
    span = ((-(-rows_n // side)) + 1) * ((-(-cols_n // side)) + 1)  # exact_area_limit, 2 axes
    exact = (span * 255 < _EXACT).numpy()
    device = integral.device
    pick = torch.from_numpy(np.flatnonzero(exact)).to(device)
    if pick.numel() == 0:
        return integral.new_zeros((0, 3, side, side), dtype=torch.float32), exact
    to = {"device": device}
    rows = _windows((y1 - 1).to(**to)[pick], rows_n.to(**to)[pick], side)
    cols = _windows((x1 - 1).to(**to)[pick], cols_n.to(**to)[pick], side)
    means = _window_means(integral, image[pick], rows, cols)
    return means.permute(0, 3, 1, 2).contiguous(), exact


def ceil_max_pool(x: Tensor, kernel: int, stride: int) -> Tensor:
    """``F.max_pool2d(x, kernel, stride, ceil_mode=True)`` with the same values and memory
    layout; ``x``: ``float[N, C, H, W]`` → ``[N, C, h, w]``, ``h = ceil((H - k) / s) + 1``
    (less one when the last window would start past the input).

    Large inputs are pooled separably (the maximum over the window's rows, then over its
    columns, as element-wise maxima of strided views; the last window padded with -inf),
    several times faster than PyTorch's CPU kernel, which also computes indices; small
    ones go to PyTorch. Maxima are exact (NaN propagates either way), so the values are
    the same.
    """
    height, width = x.shape[2:]
    if x.numel() < _SEPARABLE:
        return F.max_pool2d(x, kernel, stride, ceil_mode=True)
    out_h, out_w = (-(-(n - kernel) // stride) + 1 for n in (height, width))
    out_h -= (out_h - 1) * stride >= height
    out_w -= (out_w - 1) * stride >= width
    padded_h, padded_w = (out_h - 1) * stride + kernel, (out_w - 1) * stride + kernel
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    if padded_h > height or padded_w > width:
        x = F.pad(x, (0, padded_w - width, 0, padded_h - height), value=float("-inf"))
    rows = x[:, :, 0 : stride * (out_h - 1) + 1 : stride]
    for d in range(1, kernel):
        rows = torch.maximum(rows, x[:, :, d : d + stride * (out_h - 1) + 1 : stride])
    out = rows[:, :, :, 0 : stride * (out_w - 1) + 1 : stride]
    for d in range(1, kernel):
        out = torch.maximum(out, rows[:, :, :, d : d + stride * (out_w - 1) + 1 : stride])
    layout = torch.channels_last if channels_last else torch.contiguous_format
    return out.contiguous(memory_format=layout)


_SEPARABLE = 1 << 15  # inputs of at least this many numbers are pooled separably
