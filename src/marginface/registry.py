"""Name → loss class registry: ``create_loss("arcface", ...)``, ``list_losses()``."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["accepted_keywords", "create_loss", "get_loss_class", "list_losses", "register_loss"]

_LOSSES: dict[str, type] = {}
_ALIASES: dict[str, str] = {}

T = TypeVar("T", bound=type)


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def register_loss(name: str, *aliases: str) -> Callable[[T], T]:
    """Class decorator: register a loss under ``name`` (and ``aliases``), case-insensitive,
    with ``_`` and ``-`` interchangeable."""

    def decorator(cls: T) -> T:
        key = _key(name)
        if key in _LOSSES or key in _ALIASES:
            raise ValueError(f"a loss named {name!r} is already registered")
        _LOSSES[key] = cls
        for alias in aliases:
            _ALIASES[_key(alias)] = key
        return cls

    return decorator


def list_losses(*, include_aliases: bool = False) -> list[str]:
    """Registered loss names, sorted; ``include_aliases`` adds alternative spellings such as
    ``"subcenter"``."""
    names = set(_LOSSES)
    if include_aliases:
        names |= set(_ALIASES)
    return sorted(names)


def get_loss_class(name: str) -> type:
    """The loss class registered under ``name``; ``ValueError`` listing the valid names if none."""
    if not isinstance(name, str):
        raise TypeError(f"loss name must be a string, got {name!r}")
    key = _key(name)
    key = _ALIASES.get(key, key)
    if key not in _LOSSES:
        valid = ", ".join(list_losses())
        raise ValueError(f"unknown loss {name!r}; valid names: {valid}")
    return _LOSSES[key]


def create_loss(name: str, num_classes: int, embedding_dim: int, **kwargs: Any) -> Any:
    """Build a registered loss: ``create_loss("arcface", num_classes=10, embedding_dim=3,
    margin=0.5)``. Unknown keyword arguments raise ``TypeError`` naming them."""
    cls = get_loss_class(name)
    valid = accepted_keywords(cls)
    unknown = sorted(set(kwargs) - valid)
    if unknown:
        hints = []
        for word in unknown:
            close = difflib.get_close_matches(word, sorted(valid), n=1)
            hints.append(f"{word!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise TypeError(
            f"loss {name!r} got unknown keyword argument(s) {', '.join(hints)}; valid: "
            f"{', '.join(sorted(valid))}"
        )
    return cls(num_classes, embedding_dim, **kwargs)


def accepted_keywords(cls: type) -> set[str]:
    """The keyword arguments a loss class takes: its own and those it passes on to
    :class:`~marginface.head.MarginSoftmaxLoss` through ``**options``."""
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
