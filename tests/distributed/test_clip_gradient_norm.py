"""``clip_gradient_norm`` on 2 gloo ranks: the global norm counts each replicated gradient once
and every rank's block of each sharded parameter (class centers and per-class parameters such
as AdaM-Softmax's margins), so every rank scales by the same factor."""

from __future__ import annotations

import math

import torch

from marginface.train.distributed import clip_gradient_norm

from .harness import run_distributed


def _gradients(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(replicated, this rank's centers block, this rank's margins block) gradients."""
    replicated = torch.tensor([3.0, 4.0])  # the same on every rank (DDP averaged it)
    centers = torch.full((2, 2), 1.0 + rank)
    margins = torch.tensor([2.0 * (rank + 1)])
    return replicated, centers, margins


def _check(rank: int, world: int, with_margins: bool) -> None:
    """With the margins: ``sharded=[centers, margins]``; without: the single-parameter form
    ``sharded=centers``."""
    count = 3 if with_margins else 2
    gradients = _gradients(rank)[:count]
    parameters = [torch.nn.Parameter(torch.zeros_like(g)) for g in gradients]
    for parameter, gradient in zip(parameters, gradients, strict=True):
        parameter.grad = gradient.clone()
    blocks = [_gradients(r)[:count] for r in range(world)]
    squares = float(blocks[0][0].pow(2).sum())  # the replicated gradient, once
    squares += sum(float(g.pow(2).sum()) for block in blocks for g in block[1:])
    factor = 1.0 / (math.sqrt(squares) + 1e-6)
    sharded = parameters[1:] if with_margins else parameters[1]
    clip_gradient_norm(parameters, 1.0, sharded=sharded)
    for parameter, gradient in zip(parameters, gradients, strict=True):
        torch.testing.assert_close(parameter.grad, gradient * factor, rtol=1e-6, atol=0)


def _check_all(rank: int, world: int) -> None:
    _check(rank, world, with_margins=True)
    _check(rank, world, with_margins=False)


def test_sharded_parameters_count_every_ranks_block_once() -> None:
    run_distributed(_check_all, 2, deadline_s=60)
