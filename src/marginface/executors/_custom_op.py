"""The one autograd wiring of the chunked executor's custom operators, for both reductions.

The softmax's ``marginface::chunked_nontarget_lse`` (:mod:`~marginface.executors.fused_op`) and
the one-vs-all's ``marginface::chunked_binary_sums`` (:mod:`~marginface.executors.binary_op`)
are each a forward operator with three outputs ``(reduced[N], cos_target[N], inv_norms[C·K])``
(the last not differentiable) and a backward operator. :func:`wire` registers the backward
operator as the forward's autograd formula (what ``torch.compile`` traces) and returns the
call that the executors use: the operator under ``torch.compile``, outside it an
:class:`torch.autograd.Function` with the same forward and backward *implementations* (a custom
operator's first call imports ``torch._dynamo``, sympy included, over a hundred MB resident,
which an eager training loop should not pay).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["wire"]

Outputs = tuple[Tensor, Tensor, Tensor]
SetupContext = Callable[[Any, tuple[Any, ...], Outputs], None]
BackwardThrough = Callable[
    [Any, Any, "Tensor | None", "Tensor | None"], tuple["Tensor | None", ...]
]


def wire(
    op: Any,
    forward_impl: Callable[..., Outputs],
    backward_op: Any,
    backward_impl: Callable[..., Any],
    setup_context: SetupContext,
    backward_through: BackwardThrough,
) -> Callable[..., Outputs]:
    """Register ``backward_op`` as ``op``'s autograd formula and return ``call(*inputs)``:
    ``op`` while ``torch.compile`` traces, else the eager twin of ``forward_impl`` /
    ``backward_impl``. ``setup_context(ctx, inputs, output)`` saves what the backward reads;
    ``backward_through(backward, ctx, grad_reduced, grad_cos)`` returns the inputs'
    gradients by ``backward`` (the operator or its implementation)."""

    def backward(
        ctx: Any, grad_reduced: Tensor | None, grad_cos: Tensor | None, grad_inv: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        return backward_through(backward_op, ctx, grad_reduced, grad_cos)

    op.register_autograd(backward, setup_context=setup_context)

    class Eager(torch.autograd.Function):
        """``op``'s forward and backward called directly, outside ``torch.compile``."""

        @staticmethod
        def forward(ctx: Any, *inputs: Any) -> Outputs:  # type: ignore[override]
            output = forward_impl(*inputs)
            setup_context(ctx, inputs, output)
            ctx.mark_non_differentiable(output[2])
            return output

        @staticmethod
        @once_differentiable
        def backward(  # type: ignore[override]
            ctx: Any, grad_reduced: Tensor | None, grad_cos: Tensor | None, grad_inv: Any
        ) -> tuple[Tensor | None, ...]:
            return backward_through(backward_impl, ctx, grad_reduced, grad_cos)

    def call(*inputs: Any) -> Outputs:
        """The forward operator under ``torch.compile``, its eager twin otherwise."""
        if torch.compiler.is_compiling():
            return op(*inputs)
        return Eager.apply(*inputs)

    return call
