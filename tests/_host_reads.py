"""Counting the host's reads of tensor values (each one a synchronization with a GPU)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def counted_reads() -> Iterator[list[str]]:
    """Every read of a tensor's values by the host (``item``, ``tolist``, ``bool(t)``, ...)
    inside, by name (the methods are patched on ``torch.Tensor`` for the block only)."""
    reads: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for name in READS:
            original = getattr(torch.Tensor, name)

            def counted(self, *args, _name=name, _original=original):
                reads.append(_name)
                return _original(self, *args)

            patch.setattr(torch.Tensor, name, counted)
        yield reads
