"""Which executor a batch runs on: ``impl="auto"``'s rule, and the memory each executor's
``N×C``-sized part takes.

A head (:class:`~marginface.head.MarginSoftmaxLoss`) calls :func:`choose_executor` for each
batch. The rule rests on measured step times and memory (docs/fused.md, "Choosing an executor";
docs/benchmarks.md, "Row blocks").
"""

from __future__ import annotations

import torch

__all__ = [
    "AUTO_CHUNKED_MIN_LOGITS",
    "BINARY_DENSE_COPIES",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_ROW_BLOCK_BYTES",
    "DENSE_LOGIT_COPIES",
    "IMPLEMENTATIONS",
    "ROW_BLOCK_DTYPES",
    "ROW_BLOCK_MAX_ROWS",
    "ROW_BLOCK_MIN_DIM",
    "choose_executor",
    "default_row_block",
    "dense_step_bytes",
    "even_blocks",
    "row_block_bytes",
]

IMPLEMENTATIONS = ("dense", "chunked", "auto", "row_block")
"""The executors a head's ``impl`` names (``"auto"``: :func:`choose_executor` per batch)."""

DENSE_LOGIT_COPIES = 4
"""How many ``N×C·K`` matrices (in the compute dtype) a dense training step holds at its peak,
beyond the inputs, the weight and the gradients a training loop holds anyway: the cosines, the
logits, the softmax and its gradient (``benchmarks/bench_memory.py`` measures it; the figures
are in docs/benchmarks.md)."""

BINARY_DENSE_COPIES = 9
"""The same count for a one-vs-all margin (``Margin.objective == "binary"``: SphereFace2,
UniFace): the cosines, the logits, their softplus terms, the sigmoid and the slopes of its
gradient, about 9 ``N×C·K`` float32 matrices (1834 MB at N = 512, C = 100k; docs/benchmarks.md,
"One-vs-all losses")."""

DEFAULT_MEMORY_BUDGET = 1 << 28
"""``impl="auto"``'s default ``memory_budget``: 256 MiB. With :data:`DENSE_LOGIT_COPIES` float32
copies that is ``N·C·K <= 16M`` logits (:data:`AUTO_CHUNKED_MIN_LOGITS`, e.g. N = 512 and
C <= 32768), where the dense path was also the faster one in eager mode on a 2-core CPU, and
chunked the faster one beyond (``benchmarks/bench_fused.py``). Under ``torch.compile`` in
float32 dense can be the faster one at larger sizes too, for several times the memory
(``benchmarks/bench_compile.py``): raise the budget to get it (docs/fused.md, "Choosing an
executor"; the measured figures are in docs/benchmarks.md)."""

DEFAULT_ROW_BLOCK_BYTES = 1 << 28
"""Bytes of the row-block executor's store of products when ``row_block`` is not given:
256 MiB: at most 671 rows at C = 100k in float32 (so one block for a batch of 512), 67 at
C = 1M (:func:`default_row_block`)."""

ROW_BLOCK_MAX_ROWS = 1024
"""``impl="auto"`` takes the row-block tiling only for batches of at most 1024 rows, all in one
block: measured on the 2-core CPU (C = 100k), one block beat the class-chunked loop at N = 512
(float32, D = 128 and 512; bf16) and N = 1024 (float32, D = 512), and at C = 1M with N = 512;
at N = 2048 (one loaded run) one block was slower (docs/benchmarks.md, "Row blocks")."""

ROW_BLOCK_MIN_DIM = 128
"""``impl="auto"`` takes the row-block tiling only for ``D >= 128`` (measured at D = 128 and
512): what it saves is one GEMM of ``2·N·C·D`` flops, what it adds (writing and reading back
its store of products) does not shrink with ``D`` (docs/benchmarks.md, "Row blocks")."""

ROW_BLOCK_DTYPES = (torch.float32, torch.bfloat16)
"""Weight dtypes for which ``impl="auto"`` takes the row-block tiling: those measured."""

AUTO_CHUNKED_MIN_LOGITS = DEFAULT_MEMORY_BUDGET // (DENSE_LOGIT_COPIES * 4)
"""``N·C·K`` above which ``impl="auto"`` leaves dense under the default budget in float32
(16M, 64 MB of logits, e.g. N = 512 and C > 32768): :data:`DEFAULT_MEMORY_BUDGET` divided by
:func:`dense_step_bytes`'s bytes per logit. The rule itself is :func:`choose_executor`."""


def dense_step_bytes(
    batch_size: int,
    classes: int,
    weight_dtype: torch.dtype,
    *,
    copies: int = DENSE_LOGIT_COPIES,
) -> int:
    """Estimated bytes a dense training step holds beyond the inputs, the weight and the
    gradients: ``copies · N · C·K · itemsize`` (``classes = C·K``; itemsize 8 for a float64
    weight, else 4: the dense math runs in float32 or float64; ``copies``:
    :data:`DENSE_LOGIT_COPIES` for a softmax margin, :data:`BINARY_DENSE_COPIES` for a
    one-vs-all one), e.g. 819 MB at N = 512, C = 100k, float32, softmax."""
    itemsize = 8 if weight_dtype == torch.float64 else 4
    return copies * batch_size * classes * itemsize


def row_block_bytes(rows: int, classes: int, weight_dtype: torch.dtype) -> int:
    """Bytes of the row-block executor's store of products for a block of ``rows`` rows:
    ``rows · C·K · itemsize`` of the GEMM dtype (``classes = C·K``; 2 for a bf16/fp16 weight,
    8 for float64, else 4), e.g. 205 MB for 512 rows at C = 100k in float32."""
    itemsize = weight_dtype.itemsize if weight_dtype.is_floating_point else 4
    return rows * classes * max(itemsize, 2)


def even_blocks(rows: int, most: int) -> int:
    """Rows per block when ``rows`` rows are cut into the fewest blocks of at most ``most``
    (at least 1) rows, of sizes as even as possible: ``⌈rows / ⌈rows / most⌉⌉``."""
    most = max(1, most)
    blocks = -(-rows // most)
    return max(1, -(-rows // max(1, blocks)))


def default_row_block(batch_size: int, classes: int, weight_dtype: torch.dtype) -> int:
    """Rows per block of ``impl="row_block"`` when ``row_block`` is not given: the fewest even
    blocks whose store (:func:`row_block_bytes`) fits :data:`DEFAULT_ROW_BLOCK_BYTES`, at
    least 1 row (e.g. 512 rows at C = 100k in float32, so 4 blocks for N = 2048)."""
    per_row = row_block_bytes(1, classes, weight_dtype)
    return even_blocks(batch_size, DEFAULT_ROW_BLOCK_BYTES // per_row)


def choose_executor(
    impl: str,
    batch_size: int,
    *,
    classes: int,
    embedding_dim: int,
    weight: torch.Tensor,
    reduction: str,
    memory_budget: int,
    runs_chunked: bool,
    row_blocks: bool = True,
    dense_copies: int = DENSE_LOGIT_COPIES,
) -> str:
    """The executor of a batch of ``batch_size`` rows: ``impl`` itself unless it is
    ``"auto"``, which picks

    1. ``"dense"`` while :func:`dense_step_bytes` fit ``memory_budget`` (or if the margin
       cannot run chunked: ``runs_chunked`` False);
    2. else ``"row_block"``, one block of all rows, where that was measured the faster exact
       mode, if its store (:func:`row_block_bytes` of ``N`` rows) fits ``memory_budget``:
       eager mode (not under ``torch.compile``, where it would break the graph), a CPU
       ``weight`` of :data:`ROW_BLOCK_DTYPES` (float32, bf16), ``reduction`` ``"mean"`` or
       ``"sum"`` (one upstream gradient), ``N <= ROW_BLOCK_MAX_ROWS`` and
       ``D >= ROW_BLOCK_MIN_DIM``;
    3. else ``"chunked"``.

    ``classes``: ``C·K``, the head's classes times sub-centers. ``row_blocks``: whether the
    margin's reduction has a row-block tiling (the softmax's; not a one-vs-all margin's).
    ``dense_copies``: :func:`dense_step_bytes`'s ``copies`` for the margin.
    """
    if impl != "auto":
        return impl
    dense = dense_step_bytes(batch_size, classes, weight.dtype, copies=dense_copies)
    if dense <= memory_budget or not runs_chunked:
        return "dense"
    row_block = (
        row_blocks
        and not torch.compiler.is_compiling()
        and weight.device.type == "cpu"
        and weight.dtype in ROW_BLOCK_DTYPES
        and reduction != "none"
        and batch_size <= ROW_BLOCK_MAX_ROWS
        and embedding_dim >= ROW_BLOCK_MIN_DIM
        and row_block_bytes(batch_size, classes, weight.dtype) <= memory_budget
    )
    return "row_block" if row_block else "chunked"
