"""A 3×3 convolution fused with the 2×2 max-pool and ReLU after it, for the small CNN's first layer.

``relu(max_pool2d(conv2d(x, w, b, padding=p), 2))`` computed without the full-resolution map:
pooled pixel ``(i, j)`` is the max of the convolution at the four offsets ``(2i + a, 2j + b)``,
``a, b ∈ {0, 1}``, which all read the 4×4 input patch at ``(2i, 2j)``. So one matmul of the
patches ``[N·Ho·Wo, C·16]`` with the four kernels embedded in 4×4 windows ``[C·16, 4·O]``
(plus a ones column times the bias) gives the four candidates; their max (``max_pool2d`` on
them: its tie-breaking and NaN handling), then ReLU, is the layer's output. Row chunks keep
the candidates ``[rows, 4·O]`` in cache: on ``seed-cnn``'s first layer (C = 1, O = 32, 32×32
padded map, batch 1024) the 134 MB fp32 map that ``conv2d`` writes, ``max_pool2d`` reads and
its backward zero-fills, never exists.

Backward: only the weight and bias gradients (the input is an image batch, it needs none);
the output gradient is routed to the winning offset and multiplied by the patches,
``dW_big = Pᵀ · G_big``; autograd folds ``dW_big`` back onto the 3×3 kernel and the bias.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["conv3x3_maxpool2_relu"]

_CHUNK_ROWS = 2048
"""Pooled pixels per chunk: 2048 × 4·32 fp32 candidates = 1 MiB, within a core's L2 (measured
2.4× faster than 8192 rows on the matmul that writes them)."""


def _patches(images: Tensor, padding: int) -> Tensor:
    """4×4 input patches at stride 2 and a ones column (for the bias):
    ``[N, C, H, W] -> [N·Ho·Wo, C·16 + 1]``, ``Ho = ⌊(H + 2·padding - 2) / 2⌋`` (likewise
    ``Wo``), the pooled output size."""
    padded = F.pad(images, (padding,) * 4)  # (N, C, H + 2p, W + 2p)
    windows = padded.unfold(2, 4, 2).unfold(3, 4, 2)  # (N, C, Ho, Wo, 4, 4)
    n, c, ho, wo = windows.shape[:4]
    patches = images.new_empty(n, ho, wo, c * 16 + 1)
    patches[..., :-1].view(n, ho, wo, c, 4, 4).copy_(windows.permute(0, 2, 3, 1, 4, 5))
    patches[..., -1] = 1
    return patches.view(n * ho * wo, c * 16 + 1)


def _offset_kernels(weight: Tensor, bias: Tensor) -> Tensor:
    """``[O, C, 3, 3], [O] -> [C·16 + 1, 4·O]``: the kernel placed at the four 2×2 pool offsets
    of a 4×4 window (row-major offsets, as ``max_pool2d`` scans its window), column
    ``k·O + o``; the last row is the bias (times the patches' ones column)."""
    out_channels = weight.shape[0]
    placed = [F.pad(weight, (b, 1 - b, a, 1 - a)) for a in (0, 1) for b in (0, 1)]  # (O, C, 4, 4)
    kernels = torch.stack(placed).reshape(4 * out_channels, -1).t()  # (C·16, 4·O)
    return torch.cat([kernels, bias.repeat(4)[None]])


def _as_pool_windows(rows: Tensor, out_channels: int) -> Tensor:
    """``[n, 4·O]`` (offset-major) -> ``[n, O, 2, 2]`` channels-last view: each pooled pixel's
    four candidates as the 2×2 window ``max_pool2d`` scans (flat index ``2a + b``)."""
    return rows.view(-1, 2, 2, out_channels).permute(0, 3, 1, 2)


class _ConvMaxPoolReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, patches: Tensor, kernels: Tensor) -> Tensor:
        rows = patches.shape[0]
        out_channels = kernels.shape[1] // 4
        device = patches.device.type
        autocast_dtype = (
            torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        )
        # under autocast the output has the autocast dtype, as a conv's would (saves the next
        # conv a full-size cast); the candidates and their max are fp32 either way
        output = patches.new_empty(rows, out_channels, dtype=autocast_dtype or kernels.dtype)
        pooled = patches.new_empty(_CHUNK_ROWS, out_channels, dtype=kernels.dtype)
        # The winning offsets, 0-3, as uint8 (the fp32 output's quarter): this layer is bound by
        # memory traffic (~5-10 GB/s per core here), so each full-size pass counts.
        winner = torch.empty(rows, out_channels, dtype=torch.uint8, device=patches.device)
        index = torch.empty(
            _CHUNK_ROWS, out_channels, 1, 1, dtype=torch.int64, device=patches.device
        )
        with torch.autocast(device, enabled=False):  # the matmul is cheap in fp32
            for start in range(0, rows, _CHUNK_ROWS):
                stop = min(start + _CHUNK_ROWS, rows)
                candidates = _as_pool_windows(patches[start:stop] @ kernels, out_channels)
                best = (
                    pooled[: stop - start] if output.dtype != pooled.dtype else output[start:stop]
                )
                # max_pool2d itself, writing into the output rows: [n, O] is [n, O, 1, 1]
                torch.ops.aten.max_pool2d_with_indices.out(
                    candidates,
                    [2, 2],
                    [2, 2],
                    [0, 0],
                    [1, 1],
                    False,
                    out=best.view(-1, out_channels, 1, 1),
                    indices=index[: stop - start],
                )
                best.clamp_(min=0)
                if best.data_ptr() != output[start:stop].data_ptr():
                    output[start:stop] = best
                winner[start:stop] = index[: stop - start].view(-1, out_channels)
        # Under autocast the reference conv's weight gradient multiplies bf16/fp16 operands: so
        # does ours (the products; the sum over chunks accumulates in the weight's dtype).
        low = autocast_dtype is not None and autocast_dtype != patches.dtype
        ctx.save_for_backward(patches.to(autocast_dtype) if low else patches, output, winner)
        ctx.weight_dtype = kernels.dtype
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[None, Tensor]:
        patches, output, winner = ctx.saved_tensors
        rows, out_channels = output.shape
        grad_kernels = patches.new_zeros(patches.shape[1], 4 * out_channels, dtype=ctx.weight_dtype)
        for start in range(0, rows, _CHUNK_ROWS):
            stop = min(start + _CHUNK_ROWS, rows)
            # ReLU, then the gradient at the winning offset: d(candidates)  (n, 4, O)
            grad = torch.ops.aten.threshold_backward(
                grad_output[start:stop], output[start:stop], 0
            ).to(patches.dtype)
            spread = grad.new_zeros(stop - start, 4, out_channels)
            spread.scatter_(1, winner[start:stop, None].long(), grad[:, None])
            spread = spread.view(stop - start, -1)
            if patches.dtype == grad_kernels.dtype:
                grad_kernels.addmm_(patches[start:stop].t(), spread)
            else:
                grad_kernels += patches[start:stop].t() @ spread
        return None, grad_kernels


def conv3x3_maxpool2_relu(images: Tensor, weight: Tensor, bias: Tensor, padding: int) -> Tensor:
    """``relu(max_pool2d(conv2d(images, weight, bias, padding=padding), 2))``, fused.

    Args:
        images: ``Tensor[N, C, H, W]``; no gradient is computed for it (it must not require one).
        weight: ``Tensor[O, C, 3, 3]``, the convolution kernel.
        bias: ``Tensor[O]``.
        padding: zeros added on each side before the convolution.

    Returns:
        ``Tensor[N, O, Ho, Wo]`` in channels-last memory layout, ``Ho = ⌊(H + 2·padding - 2)/2⌋``,
        in the autocast dtype under autocast (computed in fp32, then rounded), else the
        weight's; under autocast the weight gradient's products use the autocast dtype too, as
        the reference conv's do.
        Equal to the unfused layers up to float rounding (the sums run in another order; pooling
        ties and NaNs are resolved by ``max_pool2d`` itself); the gradients of ``weight`` and
        ``bias`` likewise. Written for CPUs (a Python loop over row chunks).
    """
    if images.requires_grad:
        raise ValueError(
            "conv3x3_maxpool2_relu computes no input gradient; images must not require grad"
        )
    if weight.shape[-2:] != (3, 3) or weight.shape[1] != images.shape[1]:
        raise ValueError(
            f"weight must be [O, {images.shape[1]}, 3, 3] for these images, got "
            f"{tuple(weight.shape)}"
        )
    n, _, height, width = images.shape
    patches = _patches(images.to(weight.dtype), padding)
    out_h, out_w = (height + 2 * padding - 2) // 2, (width + 2 * padding - 2) // 2
    output = _ConvMaxPoolReLU.apply(patches, _offset_kernels(weight, bias))  # (N·Ho·Wo, O)
    return output.view(n, out_h, out_w, -1).permute(0, 3, 1, 2)
