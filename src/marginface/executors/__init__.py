"""Executors: how the cosines are computed and reduced to a loss.

An executor takes embeddings ``[N, D]``, class centers ``[C·K, D]``, labels ``[N]`` and a
:class:`~marginface.margins.Margin`, and returns the per-sample loss ``[N]``. Every margin runs
on every executor.
"""

from .dense import compute_dtype, dense_margin_cross_entropy, normalized_cosine

__all__ = ["compute_dtype", "dense_margin_cross_entropy", "normalized_cosine"]
