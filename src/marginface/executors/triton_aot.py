"""Compile the chunked executor's Triton kernels ahead of time, for a CUDA architecture, on a
machine without a GPU, and read what each compiled kernel uses.

The kernels of :mod:`~marginface.executors.triton_kernels`, each launched with the reduction of
the softmax losses, of a margin's row statistics (:mod:`~.triton_row_statistics`) or of the
one-vs-all losses (:mod:`~.triton_binary`), are compiled by Triton when they are first launched
on a GPU. This module runs the same compiler (Triton's front end, its MLIR passes, LLVM and
``ptxas``, all shipped in the ``triton`` wheel) for a named target, e.g. the H100/H200's
``sm_90``, with the specializations a launch on PyTorch tensors gets (16-byte
aligned pointers, sizes divisible by 16 marked as such), and reports per kernel:

* registers per thread (read from the cubin with the ``cuobjdump`` shipped beside ``ptxas``),
  register spill stores (ptxas's own ``-v`` report of the compilation) and shared memory;
* whether the matrix products became Hopper's warp-group MMA (``wgmma``) or the older ``mma``.

What it cannot tell: speed (no GPU runs), nor whether the compiled code computes the right
numbers (the interpreter tests and the GPU tests do that). It is used by
``tests/executors/test_triton_aot.py`` (every kernel, dtype and rule compiles for ``sm_90``) and
``benchmarks/triton_resources.py`` (the resource table of the tile candidates that a tuning run
on a GPU then times).

Importing this module imports :mod:`triton` (and :mod:`~marginface.executors.triton_kernels`,
which must not have been imported under ``TRITON_INTERPRET=1``: the interpreter's kernels cannot
be compiled).
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ..margins.base import NONTARGET_KERNELS
from . import triton_gradient_tiles, triton_kernels
from .triton_kernels import Blocks

__all__ = ["ALL_KERNELS", "KERNELS", "OTHER_KERNELS", "CompiledKernel", "compile_kernel"]

KERNELS = ("statistics", "embedding_gradient", "weight_gradient", "gradient_tile")
"""The softmax kernels, each with a non-target ``rule``: the forward's ``(max, Σexp)``, the fused
backward's ``∂x̂`` and ``∂W``, and the tiled backward's ``∂L/∂(x̂·w)``
(:mod:`~marginface.executors.triton_gradient_tiles`)."""

OTHER_KERNELS = (
    "above_threshold",
    "binary_sums",
    "binary_embedding_gradient",
    "binary_weight_gradient",
    "binary_gradient_tile",
)
"""The row statistics ``"above_threshold"`` (NPCFace's hard negatives) and the one-vs-all
kernels (the forward's ``Σ softplus`` and the backward's ``∂x̂``, ``∂b`` and ``∂W``)."""

ALL_KERNELS = KERNELS + OTHER_KERNELS
"""Every kernel :func:`compile_kernel` compiles."""

_FUNCTIONS = {  # kernel -> (its function in triton_kernels, the reduction it is launched with)
    "statistics": ("_reduce_kernel", "softmax"),
    "embedding_gradient": ("_embedding_gradient_kernel", "softmax"),
    "weight_gradient": ("_weight_gradient_kernel", "softmax"),
    "above_threshold": ("_reduce_kernel", "above_threshold"),
    "binary_sums": ("_reduce_kernel", "softplus"),
    "binary_embedding_gradient": ("_embedding_gradient_kernel", "softplus"),
    "binary_weight_gradient": ("_weight_gradient_kernel", "softplus"),
    "gradient_tile": ("_gradient_tile_kernel", "softmax"),
    "binary_gradient_tile": ("_gradient_tile_kernel", "softplus"),
}

_TRITON_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_INT_POINTERS = ("label_ptr",)
_OPERAND_POINTERS = ("x_ptr", "w_ptr", "g_ptr")


@dataclass(frozen=True)
class CompiledKernel:
    """What one compiled kernel uses on its target.

    Attributes:
        kernel: one of :data:`KERNELS`.
        dtype: the GEMM dtype (``torch.float32``, ``torch.bfloat16`` or ``torch.float16``).
        blocks: the tile sizes, warps and pipeline stages it was compiled with.
        arch: the compute capability as an integer (``90`` for ``sm_90``).
        registers: registers per thread.
        spilled_bytes: register spill stores per thread (ptxas's ``-v`` report), bytes; 0 when
            nothing spills.
        shared_bytes: shared memory per program, bytes (Triton's figure, which includes the
            pipeline's buffers).
        wgmma: whether the products use Hopper's ``wgmma`` instructions.
        mma: whether they use the pre-Hopper ``mma`` instructions.
    """

    kernel: str
    dtype: torch.dtype
    blocks: Blocks
    arch: int
    registers: int
    spilled_bytes: int
    shared_bytes: int
    wgmma: bool
    mma: bool


def _kernel_function(kernel: str) -> triton.runtime.jit.JITFunction:
    if kernel not in ALL_KERNELS:
        raise ValueError(f"kernel must be one of {ALL_KERNELS}, got {kernel!r}")
    name = _FUNCTIONS[kernel][0]
    module = triton_kernels if hasattr(triton_kernels, name) else triton_gradient_tiles
    function = getattr(module, name)
    if not isinstance(function, triton.runtime.jit.JITFunction):
        raise RuntimeError(
            f"{triton_kernels.__name__} was imported under TRITON_INTERPRET=1; its interpreted "
            "kernels cannot be compiled (import it in a process without it)"
        )
    return function


def _signature(
    function: triton.runtime.jit.JITFunction, dtype: torch.dtype, dim: int, chunk: int
) -> tuple[dict[str, str], dict[tuple[int], list]]:
    """Triton's signature of the kernel's runtime arguments and the divisibility attributes a
    launch gives them: every pointer (PyTorch allocations are 256-byte aligned) and the sizes
    ``dim``, ``chunk`` and strides ``= dim`` when divisible by 16 (row counts and class ranges
    are left unspecialized: they vary from call to call)."""
    signature: dict[str, str] = {}
    attributes: dict[tuple[int], list] = {}
    divisible = [["tt.divisibility", 16]]
    sizes = {"dim": dim, "chunk": chunk, "stride_x": dim, "stride_w": dim, "stride_g": chunk}
    constexprs = set(function.constexprs)
    for index, name in enumerate(function.arg_names):
        if index in constexprs:
            signature[name] = "constexpr"
        elif name.isupper():  # a runtime float (the one-vs-all rule's s, t, μ, b, L)
            signature[name] = "fp32"
        elif name.endswith("_ptr"):
            if name in _OPERAND_POINTERS:
                signature[name] = "*" + _TRITON_TYPES[dtype]
            else:
                signature[name] = "*i64" if name in _INT_POINTERS else "*fp32"
            attributes[(index,)] = divisible
        else:
            signature[name] = "i32"
            if name in sizes and sizes[name] % 16 == 0:
                attributes[(index,)] = divisible
    return signature, attributes


def _registers(cubin: bytes) -> int:
    """Registers per thread of the one function in ``cubin``, from ``cuobjdump``."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        report = subprocess.run(
            [str(tool), "--dump-resource-usage", str(path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    found = re.search(r"REG:(\d+)", report)
    if found is None:
        raise RuntimeError(f"cuobjdump printed no resource usage: {report!r}")
    return int(found.group(1))


@contextlib.contextmanager
def _ptxas_report() -> Iterator[io.StringIO]:
    """Compile afresh (no cache) with ptxas's ``-v`` report printed, captured in the yielded
    buffer (Triton's ``always_compile`` and ``dump_ptxas_log`` settings, restored after)."""
    knobs = triton.knobs
    saved = (knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log)
    knobs.compilation.always_compile = True
    knobs.nvidia.dump_ptxas_log = True
    report = io.StringIO()
    try:
        with contextlib.redirect_stdout(report):
            yield report
    finally:
        knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log = saved


def _spilled_bytes(report: str) -> int:
    """Bytes of register spill stores per thread in ptxas's ``-v`` report (``N bytes spill
    stores``; a stack frame for calls is not a spill)."""
    found = re.findall(r"(\d+) bytes spill stores", report)
    if not found:
        raise RuntimeError(f"ptxas printed no spill figures: {report[-2000:]!r}")
    return max(int(value) for value in found)


def compile_kernel(
    kernel: str,
    dtype: torch.dtype,
    *,
    blocks: Blocks | None = None,
    sub_centers: int = 1,
    curricular: bool = False,
    rule: str | None = None,
    clamp: bool = False,
    straight_through: bool = False,
    dim: int = 512,
    chunk: int = 8192,
    arch: int = 90,
) -> CompiledKernel:
    """Compile one kernel for ``sm_<arch>`` and return what it uses.

    Args:
        kernel: one of :data:`ALL_KERNELS`.
        dtype: the GEMM dtype of ``x̂`` and ``W``: float32 (IEEE products), bfloat16 or float16.
        blocks: tiles, warps and stages; default :class:`~.triton_kernels.Blocks` ``()``.
        sub_centers: ``K`` (a compile-time constant of the kernels).
        curricular: CurricularFace's non-target rule instead of the identity (the same as
            ``rule="curricular"``).
        rule: the non-target rule of a softmax kernel (:data:`KERNELS`), one of
            :data:`~marginface.margins.base.NONTARGET_KERNELS` (a compile-time constant of the
            kernels). Default: None, ``"curricular"`` if ``curricular`` else ``"identity"``.
            The other kernels have no rule: None only.
        clamp, straight_through: the one-vs-all kernels' compile-time flags (the logit
            clamped to ``[-L, L]``; ``∂z/∂c = s``, :class:`~.binary_rule.BinaryRule`).
        dim: the embedding dimension ``D`` the launch would have (only its divisibility by
            16 matters to the compiler). Default: 512.
        chunk: classes per program of the forward and ``∂x̂`` kernels (likewise). Default 8192.
        arch: compute capability, e.g. 90 (H100/H200), 80 (A100). Default: 90.

    Returns:
        The :class:`CompiledKernel`.

    Raises:
        ValueError: an unknown kernel, a dtype the kernels do not take, ``sub_centers < 1``,
            an unknown ``rule``, or a rule for a kernel without one.
        triton.CompilationError / RuntimeError: the kernel does not compile (the point of
            calling this), e.g. tiles whose buffers exceed the target's shared memory.
    """
    function = _kernel_function(kernel)
    if dtype not in _TRITON_TYPES:
        raise ValueError(f"dtype must be one of {tuple(_TRITON_TYPES)}, got {dtype}")
    if isinstance(sub_centers, bool) or not isinstance(sub_centers, int) or sub_centers < 1:
        raise ValueError(f"sub_centers must be an integer >= 1, got {sub_centers!r}")
    names = function.arg_names
    reduction = _FUNCTIONS[kernel][1]
    if reduction == "softmax":
        if rule is None:
            rule = "curricular" if curricular else "identity"
        if rule not in NONTARGET_KERNELS:
            raise ValueError(f"rule must be one of {NONTARGET_KERNELS}, got {rule!r}")
    elif rule is not None or curricular:
        raise ValueError(f"kernel {kernel!r} has no non-target rule, got rule={rule!r}")
    else:
        rule = "identity"  # not read by the other reductions
    blocks = blocks or Blocks()
    signature, attributes = _signature(function, dtype, dim, chunk)
    constants = {
        "REDUCTION": reduction,
        "K": sub_centers,
        "RULE": rule,
        "CLAMP": bool(clamp),
        "ST": bool(straight_through),
        "PRECISION": "ieee" if dtype == torch.float32 else "tf32",
        "DOT_UPCAST": False,
        "BLOCK_N": blocks.n,
        "BLOCK_C": blocks.c,
        "BLOCK_D": blocks.d,
    }
    source = ASTSource(
        function,
        signature,
        constexprs={
            (names.index(name),): value for name, value in constants.items() if name in names
        },
        attrs=attributes,
    )
    with _ptxas_report() as report:
        compiled = triton.compile(
            source,
            target=GPUTarget("cuda", arch, 32),
            options={"num_warps": blocks.warps, "num_stages": blocks.stages},
        )
    registers, spilled = _registers(compiled.asm["cubin"]), _spilled_bytes(report.getvalue())
    ptx = compiled.asm["ptx"]
    return CompiledKernel(
        kernel=kernel,
        dtype=dtype,
        blocks=blocks,
        arch=arch,
        registers=registers,
        spilled_bytes=spilled,
        shared_bytes=int(compiled.metadata.shared),
        wgmma="wgmma" in ptx,
        mma=re.search(r"\bmma\.sync", ptx) is not None,
    )
