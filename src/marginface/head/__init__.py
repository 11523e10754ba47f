"""The head: :class:`MarginSoftmaxLoss`, an ``nn.Module`` that owns the class centers and wires
one margin to one executor (``margin_softmax.py``), with one file per part of it: class centers
(``centers.py``), Partial FC sampling (``sampling.py``), executor choice and memory figures
(``executor_choice.py``), sub-center clean-up (``subcenter_cleanup.py``), input checks
(``inputs.py``), checkpoint layout (``state.py``)."""

from ..executors.choice import (
    AUTO_CHUNKED_MIN_LOGITS,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_ROW_BLOCK_BYTES,
    DENSE_LOGIT_COPIES,
    IMPLEMENTATIONS,
    ROW_BLOCK_DTYPES,
    ROW_BLOCK_MAX_ROWS,
    ROW_BLOCK_MIN_DIM,
)
from ..executors.chunk_plan import KERNELS
from ..executors.margin_loss import REDUCTIONS
from .margin_softmax import MarginSoftmaxLoss
from .state import class_rows, reshardable_state_dict

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
