"""One registry type for every name → object table: losses, backbones, datasets, Keras heads.

A :class:`Registry` maps names to objects (classes, factories, loaders). Names are compared after
:func:`canonical_name` (case-insensitive, ``_`` and ``-`` interchangeable, surrounding spaces
dropped), each entry may have aliases, and an unknown name raises ``ValueError`` naming it, with
the closest registered spelling ("did you mean") and the list of valid names. The same shape as
timm's ``register_model`` / ``list_models`` (``timm/models/_registry.py``), reduced to what
marginface uses:

>>> heads = Registry("head")
>>> @heads.register("arc-face", "aam")
... class Arc: ...
>>> heads.get("ARC_FACE") is heads.get("aam") is Arc
True
>>> heads.names()
['arc-face']
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "canonical_name", "describe_unknown"]

T = TypeVar("T")
E = TypeVar("E")


def canonical_name(name: str) -> str:
    """The form names are compared in: stripped, lower case, ``_`` read as ``-``.

    >>> canonical_name(" SubCenter_ArcFace ")
    'subcenter-arcface'
    """
    return name.strip().lower().replace("_", "-")


def describe_unknown(words: Iterable[str], valid: Iterable[str]) -> str:
    """``"'margn' (did you mean 'margin'?), 'bogus'"``: each unknown word, quoted, with the
    closest of ``valid`` (:func:`difflib.get_close_matches`, cutoff 0.6) when there is one."""
    choices = sorted(valid)
    hints = []
    for word in words:
        close = difflib.get_close_matches(word, choices, n=1)
        hints.append(f"{word!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ", ".join(hints)


class Registry(Generic[T]):
    """A name → object table with aliases and helpful errors.

    Args:
        kind: what the entries are, used in error messages (``"loss"`` gives
            ``"unknown loss 'arcfase'; valid names: ..."``).

    Registration is a decorator (:meth:`register`) or a call (:meth:`add`); registering a
    name or alias that is already taken raises ``ValueError`` naming it. :meth:`get` takes any
    spelling that :func:`canonical_name` maps to a name or an alias; :meth:`names` lists the
    canonical names, sorted.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}  # canonical alias -> canonical name

    # ------------------------------------------------------------ registration
    def add(self, name: str, entry: T, *aliases: str) -> T:
        """Register ``entry`` under ``name`` and ``aliases``; returns ``entry``.

        Raises:
            TypeError: ``name`` or an alias is not a string.
            ValueError: ``name`` or an alias is empty or already registered (as a name or an
                alias).
        """
        keys = [self._new_key(spelling) for spelling in (name, *aliases)]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{self.kind} {name!r} lists the same name twice in {aliases!r}")
        self._entries[keys[0]] = entry
        for key in keys[1:]:
            self._aliases[key] = keys[0]
        return entry

    def register(self, name: str, *aliases: str) -> Callable[[E], E]:
        """Decorator form of :meth:`add`: ``@registry.register("arcface", "aam-softmax")``."""

        def decorator(entry: E) -> E:
            self.add(name, entry, *aliases)  # type: ignore[arg-type]
            return entry

        return decorator

    def _new_key(self, spelling: object) -> str:
        if not isinstance(spelling, str):
            raise TypeError(f"{self.kind} name must be a string, got {spelling!r}")
        key = canonical_name(spelling)
        if not key:
            raise ValueError(f"{self.kind} name must not be empty, got {spelling!r}")
        if key in self._entries or key in self._aliases:
            raise ValueError(f"a {self.kind} named {spelling!r} is already registered")
        return key

    # ------------------------------------------------------------ look-up
    def canonical(self, name: str) -> str:
        """The registered name that ``name`` (any spelling, or an alias) stands for.

        Raises:
            TypeError: ``name`` is not a string.
            ValueError: nothing is registered under ``name``; the message names it, suggests the
                closest registered spelling and lists the valid names.
        """
        if not isinstance(name, str):
            raise TypeError(f"{self.kind} name must be a string, got {name!r}")
        key = canonical_name(name)
        key = self._aliases.get(key, key)
        if key not in self._entries:
            close = difflib.get_close_matches(key, self.names(include_aliases=True), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}{hint}"
            )
        return key

    def get(self, name: str) -> T:
        """The entry registered under ``name``; errors as :meth:`canonical`."""
        return self._entries[self.canonical(name)]

    def create(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """``get(name)(*args, **kwargs)``: build the registered class or call the factory."""
        factory = self.get(name)
        return factory(*args, **kwargs)  # type: ignore[operator]

    def names(self, *, include_aliases: bool = False) -> list[str]:
        """Registered names, sorted; ``include_aliases`` adds the aliases."""
        names = set(self._entries)
        if include_aliases:
            names |= set(self._aliases)
        return sorted(names)

    def aliases(self, name: str) -> list[str]:
        """The aliases of the entry ``name`` stands for, sorted."""
        key = self.canonical(name)
        return sorted(alias for alias, target in self._aliases.items() if target == key)

    def items(self) -> list[tuple[str, T]]:
        """``(name, entry)`` pairs, sorted by name (aliases not repeated)."""
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        key = canonical_name(name)
        return key in self._entries or key in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
