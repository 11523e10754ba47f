"""What a training run raises when it cannot go on: a loss, embedding or parameter that became
NaN or infinite, and Ctrl-C. Each message says what is on disk and how to go on
(:func:`~marginface.train.state.run_state.describe_kept`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .distributed import collective_failure

__all__ = [
    "TrainingDivergedError",
    "TrainingInterrupted",
    "diverged",
    "first_non_finite",
    "training_failure",
    "training_failures",
]


class TrainingDivergedError(RuntimeError):
    """The loss, the embeddings or a parameter became NaN or infinite; the message names the
    parameter (if one is to blame) and says truthfully what is on disk: the last good
    checkpoint, or none when no epoch was completed."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during :meth:`Trainer.fit`; the message says what was kept and how to go on."""


def first_non_finite(model: nn.Module, head: nn.Module) -> str | None:
    """The name of the first parameter (``model.<name>``, then ``loss.<name>`` for the head's)
    holding a NaN or an infinity, or None when every parameter is finite."""
    for prefix, module in (("model", model), ("loss", head)):
        for name, parameter in module.named_parameters():
            if not bool(torch.isfinite(parameter).all()):
                return f"{prefix}.{name}"
    return None


def diverged(
    what: str,
    *,
    epoch: int,
    step: int | None,
    parameter: str | None,
    way_forward: str,
) -> TrainingDivergedError:
    """The error for a run that diverged in ``epoch`` (counted from 0), at ``step`` (from 0;
    None: found after the epoch).

    Args:
        what: what became non-finite (``"the loss became nan"``), used when no ``parameter``
            is to blame.
        parameter: the first non-finite parameter (:func:`first_non_finite`), or None.
        way_forward: what is on disk and how to go on
            (:func:`~marginface.train.state.run_state.describe_kept`).
    """
    where = f"epoch {epoch + 1}" + (f", step {step + 1}" if step is not None else "")
    cause = f"parameter {parameter} became non-finite" if parameter else what
    return TrainingDivergedError(
        f"{cause} at {where}; {way_forward}. Try a lower lr, a warm-up, grad_clip or another scale."
    )


def training_failure(
    error: BaseException,
    *,
    distributed: bool,
    rank: int,
    timeout_s: float,
    way_forward: str,
) -> BaseException:
    """What :meth:`Trainer.fit <marginface.train.Trainer.fit>` raises for ``error`` caught
    around its epochs: Ctrl-C becomes :class:`TrainingInterrupted` saying what was kept; in a
    process group, any other ``RuntimeError`` (a collective that failed or timed out, a peer
    gone) becomes :func:`~marginface.train.distributed.collective_failure`'s one-line error
    naming the rank and the timeout of ``timeout_s`` seconds; everything else, and a
    :class:`TrainingDivergedError`, is ``error`` itself (raise it unchanged)."""
    if isinstance(error, KeyboardInterrupt):
        return TrainingInterrupted(f"interrupted; {way_forward}")
    if not distributed or not isinstance(error, RuntimeError):
        return error
    if isinstance(error, TrainingDivergedError):
        return error
    return collective_failure(error, rank=rank, timeout_s=timeout_s, way_forward=way_forward)


@contextmanager
def training_failures(
    *, distributed: bool, rank: int, timeout_s: float, way_forward: Callable[[], str]
) -> Iterator[None]:
    """Raise what :func:`training_failure` makes of a ``KeyboardInterrupt`` or
    ``RuntimeError`` raised inside the block: ``error`` itself unchanged, or the failure
    chained to it (Ctrl-C's :class:`TrainingInterrupted` without the ``KeyboardInterrupt``'s
    context). ``way_forward()`` is asked when an error happens, so it tells what is on disk
    then."""
    try:
        yield
    except (KeyboardInterrupt, RuntimeError) as error:
        failure = training_failure(
            error, distributed=distributed, rank=rank, timeout_s=timeout_s,
            way_forward=way_forward(),
        )  # fmt: skip
        if failure is error:
            raise
        raise failure from (None if isinstance(error, KeyboardInterrupt) else error)
