"""Triton's CPU interpreter for ``test_triton.py`` on machines without CUDA.

``TRITON_INTERPRET`` is read when triton's own language library and our kernels are decorated,
that is when they are imported, so it must be in the environment before anything imports
triton. Pytest loads this file before it collects the executors' test modules (and nothing in
marginface or torch imports triton on import). It is set only where there is no CUDA (there the
interpreter is the only way the kernels can run at all), not over an explicit value, and not if
triton is already imported. tests/conftest.py does the same first (the order in which test
files are collected can import triton before this file is loaded); this is for runs rooted here.
"""

from __future__ import annotations

import os
import sys

import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
