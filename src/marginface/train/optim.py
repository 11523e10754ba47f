"""Optimizers and per-step learning-rate schedules (linear warm-up, then constant, cosine, step
or polynomial)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from .config import SCHEDULES
from .schedule import polynomial_factor

__all__ = ["build_optimizer", "build_scheduler", "lr_factor"]


def build_optimizer(
    parameters: Iterable[nn.Parameter],
    name: str,
    *,
    lr: float,
    weight_decay: float = 0.0,
    momentum: float = 0.9,
) -> torch.optim.Optimizer:
    """``adam`` (L2 weight decay), ``adamw`` (decoupled) or ``sgd``
    (momentum). Unknown names raise ``ValueError`` listing the valid ones."""
    params = [p for p in parameters if p.requires_grad]
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; valid names: adam, adamw, sgd")


def lr_factor(
    step: int,
    *,
    total_steps: int,
    steps_per_epoch: int,
    schedule: str,
    warmup_steps: int = 0,
    step_epochs: int = 10,
    gamma: float = 0.1,
    power: float = 1.0,
) -> float:
    r"""Multiplier of the peak learning rate before optimizer step ``step`` (0-based).

    Warm-up: ``(step + 1) / warmup_steps`` for ``step < warmup_steps``. Then
    ``constant``: 1; ``cosine``: :math:`\tfrac12(1 + \cos(\pi\,p))` with
    ``p = (step - warmup) / (total - warmup)``; ``step``: ``gamma ** (epoch // step_epochs)``;
    ``polynomial``: ``(1 - p) ** power`` (insightface's; :mod:`marginface.train.schedule`).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    if schedule == "step":
        return gamma ** ((step // steps_per_epoch) // step_epochs)
    if schedule == "polynomial":
        return polynomial_factor(
            step, total_steps=total_steps, warmup_steps=warmup_steps, power=power
        )
    raise ValueError(f"unknown schedule {schedule!r}; valid names: {', '.join(SCHEDULES)}")


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    schedule: str,
    epochs: int,
    steps_per_epoch: int,
    warmup_epochs: float = 0.0,
    step_epochs: int = 10,
    gamma: float = 0.1,
    power: float = 1.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` stepped once per optimizer step, following :func:`lr_factor`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; valid names: {', '.join(SCHEDULES)}")
    warmup_steps = round(warmup_epochs * steps_per_epoch)

    def factor(step: int) -> float:
        return lr_factor(
            step,
            total_steps=epochs * steps_per_epoch,
            steps_per_epoch=steps_per_epoch,
            schedule=schedule,
            warmup_steps=warmup_steps,
            step_epochs=step_epochs,
            gamma=gamma,
            power=power,
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
