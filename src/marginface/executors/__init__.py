"""Executors: how the cosines are computed and reduced to a loss.

An executor takes embeddings ``[N, D]``, class centers ``[C·K, D]``, labels ``[N]`` and a
:class:`~marginface.margins.Margin`, and returns the per-sample loss ``[N]``. Every margin runs
on every executor.

* :mod:`~marginface.executors.dense`: materialize the ``N×C`` cosines (the reference).
* :mod:`~marginface.executors.chunked`: visit the classes in chunks with an online
  log-sum-exp; never holds ``N×C``. One chunk loop (:mod:`~.chunk_plan`, :mod:`~.chunk_loop`,
  :mod:`~.chunk_workspace`, :mod:`~.triton_dispatch`) behind two thin wrappers: custom operators
  for ``torch.compile`` (:mod:`~.fused_op`) and an autograd Function (:mod:`~.chunked_function`),
  each one for both reductions (softmax; the one-vs-all Σ softplus of :mod:`~.binary_loop`).
* :mod:`~marginface.executors.sharding`: the classes split over processes.
* :mod:`~marginface.executors.margin_loss`: cross-entropy + regularizer + reduction, shared.

What an executor needs from a margin is declared on the margin
(:class:`~marginface.margins.base.Margin`), never found from its type.
"""

from .chunked import (
    DEFAULT_CHUNK_BYTES,
    check_chunkable,
    chunked_margin_cross_entropy,
    default_chunk_size,
)
from .dense import compute_dtype, dense_margin_cross_entropy, normalized_cosine

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "check_chunkable",
    "chunked_margin_cross_entropy",
    "compute_dtype",
    "default_chunk_size",
    "dense_margin_cross_entropy",
    "normalized_cosine",
]
