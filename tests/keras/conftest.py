"""Keras tests: the torch backend unless ``KERAS_BACKEND`` says otherwise (``make test-keras-jax``
runs the same files on JAX). Keras reads the variable once, at its first import, so it is set here,
before any test module imports Keras."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")

keras = pytest.importorskip("keras")

if keras.backend.backend() == "jax":
    import jax

    jax.config.update("jax_enable_x64", True)  # float64 parity needs JAX's 64-bit mode
