"""Triton's CPU interpreter for ``test_triton.py`` on machines without CUDA.

``TRITON_INTERPRET`` is read when triton's own language library and our kernels are decorated,
that is when they are imported, so it must be in the environment before anything imports
triton. Pytest loads this file before it collects the executors' test modules (and nothing in
marginface or torch imports triton on import). It is set only where there is no CUDA (there the
interpreter is the only way the kernels can run at all), not over an explicit value, and not if
triton is already imported. tests/conftest.py does the same first (the order in which test
files are collected can import triton before this file is loaded); this is for runs rooted here.

Fixtures: ``kernels`` (the kernel module, or a skip) and ``launches`` (counts its launches).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections import Counter
from types import ModuleType

import pytest
import torch

from ._compare import BINARY_KERNEL_LAUNCHERS, DEVICE, KERNEL_LAUNCHERS, TILE_LAUNCHERS

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def kernels() -> ModuleType:
    """The Triton kernel module: compiled on CUDA, else built for the interpreter (which this
    file turns on before triton is imported). Skips without triton or without either."""
    pytest.importorskip("triton")
    module = importlib.import_module("marginface.executors.triton_kernels")
    if DEVICE.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("no CUDA and TRITON_INTERPRET is not 1: the kernels cannot run here")
        from triton.language import standard
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(standard.zeros, InterpretedFunction) or not module.interpreted():
            pytest.fail(
                "triton (or the kernel module) was imported before TRITON_INTERPRET=1 was set; "
                "see tests/executors/conftest.py"
            )
    return module


@pytest.fixture
def launches(kernels: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts the calls of each kernel launcher, the softmax kernels' and the one-vs-all
    kernels' (so a test can tell the kernels did run)."""
    binary = importlib.import_module("marginface.executors.triton_binary")
    tiles = importlib.import_module("marginface.executors.triton_gradient_tiles")
    counts: Counter = Counter()
    counted_modules = (
        (kernels, KERNEL_LAUNCHERS),
        (binary, BINARY_KERNEL_LAUNCHERS),
        (tiles, TILE_LAUNCHERS),
    )
    for module, names in counted_modules:
        for name in names:
            original = getattr(module, name)

            def counted(*args, _original=original, _name=name, **kwargs):
                counts[_name] += 1
                return _original(*args, **kwargs)

            monkeypatch.setattr(module, name, counted)
    return counts
