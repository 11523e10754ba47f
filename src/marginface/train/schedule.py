"""Per-step training mechanics from insightface's trainer: the polynomial learning-rate
schedule and the micro-batches of gradient accumulation.

insightface's polynomial learning-rate schedule with a linear warm-up, per optimizer step
(``arcface_torch/lr_scheduler.py``, ``PolynomialLRWarmup``; Goyal et al. 2017 for the warm-up).

.. math::

    f(t) = \\begin{cases}
        (t + 1) / w & t < w \\\\
        \\bigl(1 - \\tfrac{t - w}{T - w}\\bigr)^{p} & w \\le t < T
    \\end{cases}

for optimizer step ``t`` (0-based), ``w`` warm-up steps, ``T`` total steps and power ``p``; the
learning rate of step ``t`` is ``lr · f(t)``. insightface's trainer uses ``p = 1`` (linear
decay to 0; its class's default), ``w = warmup_epoch · steps_per_epoch``. The warm-up is the
pipeline's (it reaches the peak at step ``w - 1``; insightface's starts from 0 at step 0, one
step earlier).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["micro_batches", "polynomial_factor"]


def polynomial_factor(step: int, *, total_steps: int, warmup_steps: int, power: float) -> float:
    """Multiplier ``f(step)`` of the peak learning rate (see the module's formula).

    Args:
        step: the optimizer step, 0-based.
        total_steps: ``T``, steps of the whole run (``epochs · steps_per_epoch``).
        warmup_steps: ``w``, linear warm-up steps (0: none).
        power: ``p`` > 0. insightface: 1.

    Returns:
        A factor in ``[0, 1]``; 0 from step ``T`` on.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    remaining = 1.0 - (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return max(0.0, remaining) ** power


def micro_batches(images: Tensor, labels: Tensor, count: int) -> list[tuple[Tensor, Tensor]]:
    """``(images, labels)`` cut into ``count`` consecutive non-empty micro-batches of nearly
    equal size (gradient accumulation: ``config.grad_accumulation``).

    Args:
        images: ``Tensor[B, ...]``.
        labels: ``Tensor[B]``.
        count: micro-batches, >= 1 (fewer when ``B < count``).
    """
    if count == 1:
        return [(images, labels)]
    parts = zip(torch.tensor_split(images, count), torch.tensor_split(labels, count), strict=True)
    return [(x, y) for x, y in parts if y.shape[0] > 0]
