"""A second, unit-naming attribute for a margin's size (docs/losses.md, "Names").

A head holds its margin module as ``loss.margin``, and the margin modules store their size under
their constructor argument's name, ``margin`` (as ``nn.Linear`` stores ``in_features``): so
``loss.margin.margin`` reads the size, which says neither what it is nor its unit. Each margin
class therefore also exposes the size under a name that says what it holds, ``angular_margin``
(radians), ``cosine_margin`` (cosine units), ``angle_multiplier``, ``mean_margin`` or
``base_margin``: an :class:`alias` that reads and writes the stored attribute, so both names
always agree.
"""

from __future__ import annotations

from typing import Any

__all__ = ["alias", "aliases_of"]


class alias:  # noqa: N801 (used like a property)
    """Class attribute: ``obj.<this name>`` reads and writes ``obj.<target>``.

    Args:
        target: the stored attribute's name (``"margin"``).
        doc: what the value is, with its unit; becomes the attribute's docstring.

    >>> class Toy:
    ...     angular_margin = alias("margin", "m in radians")
    ...     def __init__(self): self.margin = 0.5
    >>> toy = Toy(); toy.angular_margin = 0.3; toy.margin
    0.3
    """

    def __init__(self, target: str, doc: str) -> None:
        self.target = target
        self.__doc__ = doc
        self.name = target

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj, self.target)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj, self.target, value)

    def __repr__(self) -> str:
        return f"alias({self.target!r}) as {self.name!r}"


def aliases_of(cls: type) -> dict[str, str]:
    """``{alias name: stored attribute}`` of every :class:`alias` on ``cls`` and its bases."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, alias):
                found[name] = value.target
    return found
