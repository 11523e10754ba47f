"""The one-vs-all (binary) reduction on the Triton kernels: the ``N×C`` logits stay on chip.

Importing this module imports :mod:`triton` and :mod:`~marginface.executors.triton_kernels`,
whose kernels it launches with the reduction ``"softplus"``;
:mod:`~marginface.executors.binary_loop` imports it only when a call runs on the kernels. Under
Triton's CPU interpreter, ``TRITON_INTERPRET=1`` must be set before the first import, as for the
softmax kernels.

Per entry ``(i, j)``, with ``c_ij`` the (sub-center max-pooled) cosine, the binary margins'
non-target logit is, for the rules the kernels compile in
(:class:`~marginface.executors.binary_rule.BinaryRule`; its device code
:func:`~marginface.executors.triton_rules._binary_logit`),

.. math::
    z_{ij} = s\\,\\big(2u^t - 1 + \\mu\\big) + \\beta b,\\qquad u = \\max\\big(\\tfrac{c_{ij}+1}{2},
    0\\big)

(SphereFace2: ``t``, ``μ = m`` for variant C else 0, ``β = 1``; UniFace: ``t = 1`` so that
``2u - 1 = c``, ``μ = 0``, ``β = -1``), optionally clamped to ``[-L, L]``. The forward sums
``softplus(z_ij)`` over the non-target columns per row and chunk (summed in PyTorch); the
backward recomputes each tile, ``∂L/∂c_ij = γ_i w_- σ(z_ij) ∂z_ij/∂c_ij`` (``s`` for the
straight-through gradient), routed to the winning sub-center, and accumulates ``∂x̂``, ``∂W`` and
the rows' ``Σ_j γ_i w_- σ(z_ij) ∂z_ij/∂b``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .binary_rule import BinaryRule
from .chunk_workspace import ChunkWorkspace
from .kernel_options import Blocks, RowInputs
from .triton_dispatch import add_parts, kernel_backward, kernel_reduce
from .triton_gradient_tiles import kernel_gradient_tile
from .triton_kernels import kernel_embedding_gradient, kernel_partials, kernel_weight_gradient

__all__ = [
    "binary_embedding_gradient",
    "binary_gradient_tile",
    "binary_sums",
    "binary_weight_gradient",
    "triton_binary_sums",
    "triton_nontarget_gradient",
]


def _inputs(rule: BinaryRule, device: torch.device) -> RowInputs:
    """The kernels' :class:`~marginface.executors.triton_kernels.RowInputs` of ``rule``: its
    bias term as a float32 ``Tensor[1]`` on ``device`` (read there, not by the host)."""
    binary = (rule.scale, rule.power, rule.offset, rule.clamp or 0.0)
    bias = torch.as_tensor(rule.bias_term, dtype=torch.float32, device=device).reshape(1)
    return RowInputs(
        "softplus",
        constants=bias.contiguous(),
        binary=tuple(float(value) for value in binary),  # type: ignore[arg-type]
        clamp=rule.clamp is not None,
        straight_through=bool(rule.straight_through),
    )


def _row_grad(rule: BinaryRule, grad: Tensor) -> Tensor:
    """``γ_i w_-``, float32 ``[N]``, contiguous."""
    return (grad.to(torch.float32) * rule.negative_weight).contiguous()


def binary_sums(
    x_hat: Tensor,
    weight: Tensor,
    inv_norms: Tensor,
    labels: Tensor,
    rule: BinaryRule,
    *,
    sub_centers: int,
    chunk_size: int,
    blocks: Blocks | None = None,
) -> Tensor:
    """Each row's ``Σ_{j≠y_i} softplus(z_ij)``, ``Tensor[N]`` float32 (one program per block of
    rows and chunk of ``chunk_size`` classes; the chunks' sums added in PyTorch). Arguments as
    :func:`~marginface.executors.triton_kernels.nontarget_statistics`."""
    partial = kernel_partials(
        x_hat, weight, inv_norms, labels.contiguous(), _inputs(rule, x_hat.device),
        sub_centers=sub_centers, chunk_size=chunk_size, blocks=blocks,
    )  # fmt: skip
    return partial[0].sum(dim=0)


def binary_embedding_gradient(
    x_hat: Tensor, weight: Tensor, inv_norms: Tensor, labels: Tensor, rule: BinaryRule,
    grad: Tensor, *, sub_centers: int, chunk_size: int, blocks: Blocks | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The non-target part of ``∂L/∂x̂`` (``Tensor[N, D]``) and each row's
    ``Σ_{j≠y} γ_i w_- σ(z_ij)·[not clamped]`` (``Tensor[N]``; times ``β`` it is the row's
    share of ``∂L/∂b``), float32. ``grad``: ``Tensor[N]``, ``γ_i`` (the upstream gradient).
    Per-chunk partial sums are written to a buffer of at most
    :data:`~marginface.executors.triton_kernels.EMBEDDING_GRADIENT_WORKSPACE_BYTES` (the bound
    the softmax's gradient uses), launched in groups of chunks."""
    row_grad, inputs = _row_grad(rule, grad), _inputs(rule, x_hat.device)
    return kernel_embedding_gradient(
        x_hat, weight, inv_norms, labels.contiguous(), inputs, row_grad, row_grad,
        sub_centers=sub_centers, chunk_size=chunk_size, blocks=blocks,
    )  # fmt: skip


def binary_weight_gradient(
    x_hat: Tensor, weight: Tensor, inv_norms: Tensor, labels: Tensor, rule: BinaryRule,
    grad: Tensor, *, sub_centers: int, start: int, stop: int, out: Tensor | None = None,
    blocks: Blocks | None = None,
) -> Tensor:  # fmt: skip
    """The non-target part of ``r_{jk}·Σ_i (∂L/∂c_ijk) x̂_i`` for the classes ``[start, stop)``
    (before the projection through ``w/‖w‖``), float32 ``[(stop - start)·K, D]``, written into
    ``out`` (contiguous float32, zeroed here) if given."""
    row_grad, inputs = _row_grad(rule, grad), _inputs(rule, x_hat.device)
    return kernel_weight_gradient(
        x_hat, weight, inv_norms, labels.contiguous(), inputs, row_grad, row_grad,
        sub_centers=sub_centers, start=start, stop=stop, out=out, blocks=blocks,
    )  # fmt: skip


def binary_gradient_tile(
    x_hat: Tensor, weight: Tensor, inv_norms: Tensor, labels: Tensor, rule: BinaryRule,
    grad: Tensor, *, sub_centers: int, out: Tensor | None = None, blocks: Blocks | None = None,
    label_offset: int = 0, share: bool = True,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """The one-vs-all gradient tile ``G_{i,jk} = [j≠y_i][k = k*] r_jk γ_i w_- σ(z_ij)
    ∂z_ij/∂c_ij`` (``Tensor[N, C·K]`` in ``x_hat``'s dtype) and each row's
    ``Σ_{j≠y} γ_i w_- σ(z_ij)·[not clamped]`` (``Tensor[N]`` float32), as
    :func:`~marginface.executors.triton_gradient_tiles.kernel_gradient_tile`."""
    row_grad, inputs = _row_grad(rule, grad), _inputs(rule, x_hat.device)
    return kernel_gradient_tile(
        x_hat, weight, inv_norms, labels.contiguous(), inputs, row_grad, row_grad,
        sub_centers=sub_centers, out=out, blocks=blocks, label_offset=label_offset, share=share,
    )  # fmt: skip


def triton_binary_sums(chunks: ChunkWorkspace, rule: BinaryRule) -> Tensor:
    """The forward's pass of :mod:`~marginface.executors.binary_loop` on these kernels: each
    row's ``Σ_{j≠y_i} softplus(z_ij)`` over every class of ``chunks`` (every sampled one: one
    launch per chunk on its gathered rows, the labels shifted to the chunk's columns),
    ``Tensor[N]`` float32 (:func:`~marginface.executors.triton_dispatch.kernel_reduce`)."""
    return kernel_reduce(chunks, binary_sums, (rule,), add_parts)


def triton_nontarget_gradient(
    chunks: ChunkWorkspace,
    rule: BinaryRule,
    sign: float,
    grad: Tensor,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
) -> Tensor:
    """The backward's non-target pass of :mod:`~marginface.executors.binary_loop` on these
    kernels (:func:`~marginface.executors.triton_dispatch.kernel_backward`): adds into
    ``grad_x_hat``, writes ``grad_weight``, returns the non-target share of ``∂L/∂b``
    (``sign``: ``β``). With a Partial FC sample, per chunk: its rows gathered once, both
    kernels on them, its weight gradient stored into its rows of ``grad_weight``."""
    bias = [torch.zeros((), dtype=torch.float32, device=grad_x_hat.device)]

    def add_bias(share: Tensor) -> None:
        bias[0] = bias[0] + share.sum()

    launchers = (binary_embedding_gradient, binary_weight_gradient, binary_gradient_tile)
    arguments = (rule, grad.contiguous())
    kernel_backward(chunks, launchers, arguments, grad_x_hat, grad_weight, add_bias)
    return (bias[0] * sign).to(grad_x_hat.dtype)
