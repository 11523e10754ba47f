"""Balanced verification pairs for datasets without any: :func:`sample_pairs`.

The sampler lives with the other verification code in :mod:`marginface.evaluation.pairs` (the
core); this module keeps the name the dataset loaders have always exported.
"""

from __future__ import annotations

from ..evaluation.pairs import sample_pairs

__all__ = ["sample_pairs"]
