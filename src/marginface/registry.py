"""Name → loss class: ``create_loss("arcface", ...)``, ``list_losses()``.

The table is :data:`LOSSES`, a :class:`~marginface._registry.Registry`: the named losses of
:mod:`marginface.losses` register themselves in it with :func:`register_loss`, and
:func:`create_loss`, :func:`list_losses`, the CLI's ``--loss`` and :mod:`marginface.keras` read
it. Names are case-insensitive, ``_`` and ``-`` interchangeable, and aliases resolve
(``"am-softmax"``, ``"subcenter"``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from . import losses as _builtin_losses  # noqa: F401  (its declarations fill LOSSES)
from ._loss_table import LOSSES
from ._registry import describe_unknown

__all__ = [
    "LOSSES",
    "accepted_keywords",
    "create_loss",
    "get_loss_class",
    "list_losses",
    "register_loss",
]

T = TypeVar("T", bound=type)


def register_loss(name: str, *aliases: str) -> Callable[[T], T]:
    """Class decorator: register a loss under ``name`` (and ``aliases``), case-insensitive,
    with ``_`` and ``-`` interchangeable. A name or alias already taken raises ``ValueError``."""
    return LOSSES.register(name, *aliases)


def list_losses(*, include_aliases: bool = False) -> list[str]:
    """Registered loss names, sorted; ``include_aliases`` adds alternative spellings such as
    ``"subcenter"``."""
    return LOSSES.names(include_aliases=include_aliases)


def get_loss_class(name: str) -> type:
    """The loss class registered under ``name``: ``TypeError`` if ``name`` is not a string,
    ``ValueError`` naming it and listing the valid names if nothing is registered under it."""
    return LOSSES.get(name)


def create_loss(name: str, num_classes: int, embedding_dim: int, **kwargs: Any) -> Any:
    """Build a registered loss: ``create_loss("arcface", num_classes=10, embedding_dim=3,
    margin=0.5)``. Unknown keyword arguments raise ``TypeError`` naming them (with the closest
    valid one) and listing the valid ones."""
    cls = get_loss_class(name)
    valid = accepted_keywords(cls)
    unknown = sorted(set(kwargs) - valid)
    if unknown:
        raise TypeError(
            f"loss {name!r} got unknown keyword argument(s) {describe_unknown(unknown, valid)}; "
            f"valid: {', '.join(sorted(valid))}"
        )
    return cls(num_classes, embedding_dim, **kwargs)


def accepted_keywords(cls: type) -> set[str]:
    """The keyword arguments a loss class takes besides ``num_classes`` and ``embedding_dim``.

    For a named loss (:class:`~marginface.losses.NamedLoss`) these are its declared signature's:
    the margin's options and the head options. For any other registered class, its constructor's
    and, where it passes ``**options`` on, those of the classes above it up to
    :class:`~marginface.head.MarginSoftmaxLoss` (whose ``margin`` is the Margin object, not an
    option).
    """
    from .head import MarginSoftmaxLoss

    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters.values()
        names |= {
            p.name
            for p in parameters
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in ("self", "num_classes", "embedding_dim")
            and not (klass is MarginSoftmaxLoss and p.name == "margin")  # the Margin object
        }
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break  # this __init__ passes nothing further up
    return names
