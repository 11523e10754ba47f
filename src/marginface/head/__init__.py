"""The head: an ``nn.Module`` that owns the class centers and wires one margin to one executor
(:class:`MarginSoftmaxLoss`, ``margin_softmax.py``; its checkpoint layout in ``state.py``)."""

from .margin_softmax import (
    AUTO_CHUNKED_MIN_LOGITS,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_ROW_BLOCK_BYTES,
    DENSE_LOGIT_COPIES,
    IMPLEMENTATIONS,
    KERNELS,
    REDUCTIONS,
    ROW_BLOCK_DTYPES,
    ROW_BLOCK_MAX_ROWS,
    ROW_BLOCK_MIN_DIM,
    MarginSoftmaxLoss,
    class_rows,
    reshardable_state_dict,
)

__all__ = [
    "AUTO_CHUNKED_MIN_LOGITS",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_ROW_BLOCK_BYTES",
    "DENSE_LOGIT_COPIES",
    "IMPLEMENTATIONS",
    "KERNELS",
    "REDUCTIONS",
    "ROW_BLOCK_DTYPES",
    "ROW_BLOCK_MAX_ROWS",
    "ROW_BLOCK_MIN_DIM",
    "MarginSoftmaxLoss",
    "class_rows",
    "reshardable_state_dict",
]
