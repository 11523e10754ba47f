"""Which executor a head's batch runs on, and the memory figures that choice reads.

The rule itself is :func:`~marginface.executors.choice.choose_executor`'s; this module turns a
head's settings (classes ``C·K``, the centers' dtype, the margin's objective) into its arguments.
"""

from __future__ import annotations

import torch

from ..executors.choice import (
    BINARY_DENSE_COPIES,
    DENSE_LOGIT_COPIES,
    choose_executor,
    default_row_block,
    dense_step_bytes,
)
from ..margins.base import Margin


def dense_copies(margin: Margin) -> int:
    """``N×C·K`` matrices of a dense step: more for a one-vs-all margin than a softmax's."""
    return BINARY_DENSE_COPIES if margin.objective == "binary" else DENSE_LOGIT_COPIES


def head_executor(
    impl: str,
    batch_size: int,
    *,
    classes: int,
    embedding_dim: int,
    weight: torch.Tensor,
    reduction: str,
    memory_budget: int,
    margin: Margin,
) -> str:
    """``"dense"``, ``"chunked"`` or ``"row_block"`` for a batch of ``batch_size`` rows over
    ``classes = C·K`` centers ``weight`` (``impl="auto"``: the budget rule of
    :func:`~marginface.executors.choice.choose_executor`, in bytes)."""
    return choose_executor(
        impl,
        batch_size,
        classes=classes,
        embedding_dim=embedding_dim,
        weight=weight,
        reduction=reduction,
        memory_budget=memory_budget,
        runs_chunked=margin.runs_chunked(),
        row_blocks=margin.objective == "softmax",
        dense_copies=dense_copies(margin),
    )


def head_row_block_rows(
    impl: str, row_block: int | None, batch_size: int, classes: int, dtype: torch.dtype
) -> int:
    """Rows per block of the row-block executor: ``row_block`` when given; else all
    ``batch_size`` rows in one block for ``impl="auto"`` (its rule), and for
    ``impl="row_block"`` :func:`~marginface.executors.choice.default_row_block` (the fewest even
    blocks whose store of ``rows × classes`` products in ``dtype`` fits its budget)."""
    if row_block is not None:
        return row_block
    if impl == "auto":  # one block (the executor choice's rule)
        return batch_size
    return default_row_block(batch_size, classes, dtype)


def head_dense_step_bytes(batch_size: int, classes: int, dtype: torch.dtype, margin: Margin) -> int:
    """Bytes a dense step holds beyond inputs, weight and gradients for ``batch_size`` rows over
    ``classes = C·K`` centers in ``dtype`` (:func:`~marginface.executors.choice.dense_step_bytes`,
    with the margin's :func:`dense_copies`)."""
    return dense_step_bytes(batch_size, classes, dtype, copies=dense_copies(margin))
