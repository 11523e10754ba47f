"""argparse ``type=`` checks shared by the commands: whole numbers with a lower bound.

Each turns the option's text into an ``int`` or raises :class:`argparse.ArgumentTypeError`
naming the bound and the text given, so argparse prints
``argument --workers: must be >= 0, got -1``.
"""

from __future__ import annotations

import argparse

__all__ = ["non_negative_int", "positive_int"]


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """``int(text)`` when it is >= 0 (``--workers 0``: one thread per CPU).

    Raises:
        argparse.ArgumentTypeError: ``text`` is not an integer, or is < 0.
    """
    return _int_at_least(text, 0)


def positive_int(text: str) -> int:
    """``int(text)`` when it is >= 1 (a batch size, a count).

    Raises:
        argparse.ArgumentTypeError: ``text`` is not an integer, or is < 1.
    """
    return _int_at_least(text, 1)
