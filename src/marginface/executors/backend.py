"""The chunked executor's backend, chosen in one place, once per call.

A call of :func:`~marginface.executors.chunked.chunked_margin_cross_entropy` or
:func:`~marginface.executors.chunked.sharded_margin_cross_entropy` asks :func:`choose_backend`
once, at its entry, and passes the :class:`Backend` down; nothing below it decides again. A
backend is two answers:

* **the autograd path** (:data:`AUTOGRAD_PATHS`): the ``torch.library`` custom operators of
  :mod:`~marginface.executors.fused_op` (``"compiled_op"`` under ``torch.compile``, where
  Dynamo and AOTAutograd see each operator as one node; ``"eager_op"`` outside it, the same
  forward and backward implementations through the operators' eager twin, an autograd
  Function that does not import ``torch._dynamo``), or the one autograd Function
  :class:`~marginface.executors.chunked_function.ChunkedLoss` (``"function"``, a graph break
  under ``torch.compile``);
* **who runs the per-chunk work**: the Triton kernels (``triton=True``,
  :mod:`~marginface.executors.triton_kernels`) or PyTorch ops.

The table (``requested``: the caller's ``kernels``, or the environment variable
:data:`~marginface.executors.chunk_plan.KERNELS_ENV` read once here when it is None):

=============================  ==========================================================
condition                      answer
=============================  ==========================================================
a class shard                  ``"function"``
softmax, row blocks            ``"function"``, PyTorch (``"triton"``: ``ValueError``)
softmax, no compiled rule      ``"function"`` (:func:`~.fused_op.nontarget_rule` is None:
                               another rule, inter-class filtering, a statistics pass in
                               the margin's own Python)
softmax, a compiled rule       a custom-op path
binary, no declared rule or    ``"function"``
inter-class filtering
binary, a declared rule        a custom-op path
custom-op path                 ``"compiled_op"`` if ``torch.compiler.is_compiling()``,
                               else ``"eager_op"``
``requested == "torch"``       PyTorch
``requested == "auto"``        Triton iff CUDA tensors, triton imports, a GEMM dtype of
                               :data:`~.chunk_plan.TRITON_DTYPES` with a weight of that
                               dtype and unit stride along D, a rule the kernels know, no
                               inter-class filtering (:func:`use_triton_kernels`,
                               :func:`use_binary_kernels`)
``requested == "triton"``      Triton, or ``ValueError`` naming what is unsupported
=============================  ==========================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .._validation import check_choice
from ..margins.base import Margin
from .chunk_plan import (
    KERNELS,
    KERNELS_ENV,
    TRITON_DTYPES,
    TRITON_NONTARGET_KERNELS,
    gemm_dtype,
    nontarget_kernel_of,
)
from .fused_op import nontarget_rule
from .sharding import ClassShard

__all__ = [
    "AUTOGRAD_PATHS",
    "Backend",
    "choose_backend",
    "requested_kernels",
    "triton_available",
    "use_binary_kernels",
    "use_triton_kernels",
]

AUTOGRAD_PATHS = ("compiled_op", "eager_op", "function")
"""The autograd paths of a chunked call: the custom operators under ``torch.compile``
(``"compiled_op"``), their eager twin (``"eager_op"``), the autograd Function
(``"function"``)."""


@dataclass(frozen=True)
class Backend:
    """What :func:`choose_backend` decided for one call.

    Attributes:
        autograd: one of :data:`AUTOGRAD_PATHS`.
        triton: whether the per-chunk work runs on the Triton kernels (else PyTorch ops).
    """

    autograd: str
    triton: bool

    def __post_init__(self) -> None:
        check_choice("autograd", self.autograd, AUTOGRAD_PATHS)
        if not isinstance(self.triton, bool):
            raise TypeError(f"triton must be a bool, got {self.triton!r}")

    @property
    def custom_ops(self) -> bool:
        """Whether the call runs on the custom operators (compiled or their eager twin)."""
        return self.autograd != "function"

    @property
    def compiled(self) -> bool:
        """Whether the custom operators are called as ``torch.library`` operators (under
        ``torch.compile``) rather than through their eager twin."""
        return self.autograd == "compiled_op"

    @property
    def kernels(self) -> str:
        """``"triton"`` or ``"torch"``: the operators' ``kernels`` argument."""
        return "triton" if self.triton else "torch"


def choose_backend(
    margin: Margin,
    embeddings: Tensor,
    weight: Tensor,
    *,
    kernels: str | None = None,
    shard: ClassShard | None = None,
    row_block: int | None = None,
) -> Backend:
    """The :class:`Backend` of one chunked call, by the table of this module's docstring.

    Args:
        margin: the margin (its :attr:`~marginface.margins.base.Margin.objective` picks the
            softmax's or the one-vs-all's rows of the table).
        embeddings: ``Tensor[N, D]`` (only its device and dtype are read).
        weight: ``Tensor[C·K, D]`` (only its dtype and stride are read).
        kernels: one of :data:`~marginface.executors.chunk_plan.KERNELS`, or None (default):
            the environment variable ``MARGINFACE_KERNELS``, read once here (unset: ``"auto"``).
        shard: the class shard of a sharded call, or None (default: one process).
        row_block: the softmax's rows per block, or None (default: no row blocks).

    Raises:
        ValueError: ``kernels`` (or the environment variable) is not one of ``KERNELS``;
            ``kernels="triton"`` where the kernels cannot run (the message says why).
    """
    requested = requested_kernels(kernels)
    if margin.objective == "binary":
        triton = use_binary_kernels(margin, requested, embeddings, weight)
        custom = (
            shard is None
            and margin.binary_kernel_parameters() is not None
            and margin.interclass_filtering_threshold == 0
        )
    else:
        custom = shard is None and nontarget_rule(margin) is not None and row_block is None
        if row_block is not None:
            if requested == "triton":
                raise ValueError(
                    "row_block runs on PyTorch ops only, got kernels='triton'; use kernels='torch'"
                )
            triton = False
        else:
            triton = use_triton_kernels(requested, embeddings, weight, margin)
    if not custom:
        return Backend("function", triton)
    return Backend("compiled_op" if torch.compiler.is_compiling() else "eager_op", triton)


def triton_available() -> bool:
    """Whether :mod:`triton` imports (it is optional: ``pip install triton``)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def requested_kernels(kernels: str | None) -> str:
    """The caller's ``kernels`` (one of :data:`~.chunk_plan.KERNELS`), or the environment
    variable :data:`~.chunk_plan.KERNELS_ENV` read now when it is None (unset: ``"auto"``);
    ``ValueError`` naming the value otherwise."""
    if kernels is None:
        value = os.environ.get(KERNELS_ENV, "auto") or "auto"
        if value not in KERNELS:
            raise ValueError(f"{KERNELS_ENV} must be one of {KERNELS}, got {value!r}")
        return value
    return check_choice("kernels", kernels, KERNELS)


def use_triton_kernels(
    requested: str, x: Tensor, weight: Tensor, margin: Margin | None = None
) -> bool:
    """The table's Triton column for the softmax (and, ``margin`` None, for the kernels' dtype,
    device and interpreter checks alone).

    ``requested``: from :func:`requested_kernels`. ``"torch"``: no. ``"auto"``: yes for CUDA
    tensors when triton imports and the case is supported (a GEMM dtype of
    :data:`~.chunk_plan.TRITON_DTYPES` with a weight of that dtype and unit stride along D; a
    margin whose :meth:`~marginface.margins.base.Margin.nontarget_kernel` is known and no
    inter-class filtering), else no. ``"triton"``: yes, or ``ValueError`` saying what is
    unsupported. ``margin`` None: the identity rule (the statistics pass alone).
    """
    if requested == "torch":
        return False
    gemm = gemm_dtype(x, weight)
    supported = gemm in TRITON_DTYPES and weight.dtype == gemm and weight.stride(1) == 1
    filtering = margin is not None and margin.interclass_filtering_threshold > 0
    known_rule = margin is None or nontarget_kernel_of(margin) in TRITON_NONTARGET_KERNELS
    if requested == "auto":
        return (
            x.device.type == "cuda"
            and supported
            and known_rule
            and not filtering
            and triton_available()
        )
    if not triton_available():
        raise ValueError("kernels='triton' needs triton installed (pip install triton)")
    if not supported:
        raise ValueError(
            f"kernels='triton' supports GEMM dtypes {TRITON_DTYPES} with a weight of that dtype "
            f"and unit stride along D, got weight {weight.dtype} (stride {weight.stride()}) and "
            f"GEMM dtype {gemm}; use kernels='torch'"
        )
    if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "kernels='triton' on CPU tensors runs only under Triton's interpreter: set "
            "TRITON_INTERPRET=1 before marginface.executors.triton_kernels is first imported"
        )
    if filtering:
        raise ValueError(
            "interclass_filtering_threshold > 0 has no Triton kernel; use kernels='torch' "
            "(or leave kernels unset)"
        )
    if not known_rule:
        raise ValueError(
            f"margin {type(margin).__name__}'s nontarget_cosine has no Triton kernel (only the "
            "rules of marginface.executors.chunk_plan.TRITON_NONTARGET_KERNELS); use "
            "kernels='torch'"
        )
    return True


def use_binary_kernels(margin: Any, requested: str, x: Tensor, weight: Tensor) -> bool:
    """The table's Triton column for the one-vs-all reduction.

    ``requested``: from :func:`requested_kernels`. ``"torch"``: no. ``"auto"``: yes for CUDA
    tensors when triton imports, the GEMM dtype and the weight suit the kernels, the margin
    declares its rule (:meth:`~marginface.margins.binary.BinaryMargin.binary_kernel_parameters`),
    and there is no inter-class filtering (a Partial FC sample runs on them, one launch per
    chunk of its gathered rows). ``"triton"``: yes, or ``ValueError`` naming the margin and what
    is unsupported.
    """
    if requested == "torch":
        return False
    name = type(margin).__name__
    problems = []
    if margin.binary_kernel_parameters() is None:
        problems.append(f"{name}'s non-target rule has no Triton kernel")
    if margin.interclass_filtering_threshold > 0:
        problems.append("interclass_filtering_threshold > 0 has no Triton kernel")
    if requested == "auto":
        return not problems and use_triton_kernels("auto", x, weight)
    if problems:
        raise ValueError(
            f"kernels='triton' for the binary (one-vs-all) reduction of {name}: "
            f"{'; '.join(problems)}; use kernels='torch' (or 'auto')"
        )
    return use_triton_kernels("triton", x, weight)  # the dtype and interpreter checks
