"""Small ``torch.library`` custom ops that keep stateful margins whole and exact under
``torch.compile``.

* :func:`seeded_normal`: normal draws from a generator state held in a tensor. A
  ``torch.Generator`` argument breaks the graph, and Inductor's own random numbers would differ
  from eager's; the op draws exactly what eager draws.
* :func:`annealed_lambda`: SphereFace's λ from its iteration buffer. As pointwise ops, AOTAutograd's
  min-cut partitioner (``torch.compile``'s default) recomputes λ in the backward from the
  iteration buffer, which the forward has already incremented in place: the backward would use
  the next step's λ. An operator's output is saved instead of recomputed
  (tests/executors/test_compile.py checks the compiled gradients against eager).

Outside ``torch.compile`` the implementations are called directly: the first call of a custom
op imports ``torch._dynamo`` (a large import, resident for the rest of the process), which an
eager training loop should not pay.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["annealed_lambda", "seeded_normal"]


def _seeded_normal_impl(
    state: Tensor, count: int, mean: float, std: float
) -> tuple[Tensor, Tensor]:
    generator = torch.Generator()
    generator.set_state(state.cpu())
    drawn = torch.normal(mean, std, size=(count,), generator=generator)
    return drawn, generator.get_state().to(state.device)


_seeded_normal = torch.library.custom_op(
    "marginface::seeded_normal", _seeded_normal_impl, mutates_args=()
)


@_seeded_normal.register_fake
def _seeded_normal_fake(
    state: Tensor, count: int, mean: float, std: float
) -> tuple[Tensor, Tensor]:
    return torch.empty(count), torch.empty_like(state)


def seeded_normal(state: Tensor, count: int, mean: float, std: float) -> Tensor:
    """``count`` draws of ``N(mean, std²)`` (float32, CPU) from the CPU generator state ``state``
    (``torch.Generator.get_state()``'s uint8 tensor), which is advanced in place: the same
    draws, in the same order, as ``torch.normal(mean, std, size=(count,), generator=g)`` on a
    generator ``g`` holding that state."""
    op = _seeded_normal if torch.compiler.is_compiling() else _seeded_normal_impl
    drawn, advanced = op(state, count, mean, std)
    state.copy_(advanced)
    return drawn


def _annealed_lambda_impl(
    iteration: Tensor, base: float, gamma: float, power: float, minimum: float
) -> Tensor:
    step = iteration.to(torch.float64)
    return (base * (1.0 + gamma * step) ** (-power)).clamp_min(minimum)


_annealed_lambda = torch.library.custom_op(
    "marginface::annealed_lambda", _annealed_lambda_impl, mutates_args=()
)


@_annealed_lambda.register_fake
def _annealed_lambda_fake(
    iteration: Tensor, base: float, gamma: float, power: float, minimum: float
) -> Tensor:
    return torch.empty((), dtype=torch.float64, device=iteration.device)


def annealed_lambda(
    iteration: Tensor, base: float, gamma: float, power: float, minimum: float
) -> Tensor:
    """``max(minimum, base·(1 + gamma·iteration)^(-power))``, 0-dim float64, from the 0-dim
    integer ``iteration``."""
    op = _annealed_lambda if torch.compiler.is_compiling() else _annealed_lambda_impl
    return op(iteration, base, gamma, power, minimum)
