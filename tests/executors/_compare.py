"""Helpers shared by the executors' comparison tests (``test_triton.py``,
``test_precision_matrix.py``)."""

from __future__ import annotations

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
"""Where the comparison tests put their tensors: CUDA when there is a GPU (there ``"auto"``
takes the compiled Triton kernels), else the CPU (PyTorch ops; Triton under its interpreter)."""

KERNEL_LAUNCHERS = ("nontarget_statistics", "embedding_gradient", "weight_gradient")
"""The launchers of :mod:`marginface.executors.triton_kernels` the ``launches`` fixture counts."""

BINARY_KERNEL_LAUNCHERS = (
    "binary_sums",
    "binary_embedding_gradient",
    "binary_weight_gradient",
    "binary_gradient_tile",
)
"""The launchers of :mod:`marginface.executors.triton_binary` (the one-vs-all losses' kernels)
the ``launches`` fixture counts too."""

TILE_LAUNCHERS = ("gradient_tile",)
"""The launchers of :mod:`marginface.executors.triton_gradient_tiles` the ``launches`` fixture
counts (the softmax's backward as gradient tiles)."""


def backward_launcher(binary: bool = False) -> str:
    """The launcher called once per backward (per Partial FC chunk) on the kernels by the
    backward in use (:data:`marginface.executors.triton_dispatch.TRITON_BACKWARD`): the
    gradient tile's, or the fused ``∂x̂`` kernel's."""
    from marginface.executors import triton_dispatch

    name = "gradient_tile" if triton_dispatch.TRITON_BACKWARD == "tiles" else "embedding_gradient"
    return f"binary_{name}" if binary else name


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|a - e| / max|e|`` in float64 (0 if both are zero)."""
    actual, expected = actual.detach().double(), expected.detach().double()
    scale = expected.abs().max()
    difference = (actual - expected).abs().max()
    return float(difference / scale) if scale > 0 else float(difference)
