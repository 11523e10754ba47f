"""The table of named losses, :data:`LOSSES`, which :mod:`marginface.losses` fills.

Read it through :mod:`marginface.registry`: that module imports :mod:`marginface.losses`, so the
table is complete whenever it is read, even though ``import marginface`` itself loads nothing
(the package's names load on first use, so that ``marginface --help`` needs no torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ._registry import Registry

__all__ = ["LOSSES", "register_builtin_loss"]

LOSSES: Registry[type] = Registry("loss")
"""Registered loss name → loss class (a :class:`~marginface.head.MarginSoftmaxLoss` subclass)."""

T = TypeVar("T", bound=type)


def register_builtin_loss(name: str, *aliases: str) -> Callable[[T], T]:
    """Class decorator of :mod:`marginface.losses`: register a loss under ``name`` (and
    ``aliases``) in :data:`LOSSES`; a name already taken raises ``ValueError``."""
    return LOSSES.register(name, *aliases)
