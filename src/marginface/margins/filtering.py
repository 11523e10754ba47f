"""Inter-class filtering (insightface's ``interclass_filtering_threshold``).

A non-target cosine above a threshold ``τ`` is read as label noise (the sample probably belongs
to that other class too: a duplicated identity) and is set to 0 before the margin, so it
contributes ``exp(s·g(0))`` to the softmax and no gradient:

.. math::
    \\tilde c_{ij} = \\begin{cases} 0 & j \\ne y_i \\text{ and } c_{ij} > \\tau \\\\
                                    c_{ij} & \\text{otherwise} \\end{cases}

insightface (``arcface_torch/losses.py``, ``CombinedMarginLoss``) computes ``dirty = logits >
τ`` under ``no_grad`` with the target column of each positive row excluded, then ``logits =
(1 - dirty) * logits``: the same values, and a zero gradient for the filtered entries. Rows
whose class lives elsewhere (label -1) have every column filtered, as there.
``τ = 0`` (the default everywhere) turns the filter off, as in insightface (``if τ > 0``).
"""

from __future__ import annotations

from torch import Tensor

from .._validation import check_real

__all__ = ["check_filtering_threshold", "interclass_filter"]


def check_filtering_threshold(value: object) -> float:
    """``interclass_filtering_threshold`` as a float in ``[0, 1]`` (a cosine; 0 = off).

    Raises:
        TypeError: not a real number (a string, a bool, None...).
        ValueError: negative, above 1, or not finite.
    """
    return check_real("interclass_filtering_threshold", value, nonnegative=True, at_most=1.0)


def interclass_filter(cosine: Tensor, labels: Tensor | None, threshold: float) -> Tensor:
    """Non-target cosines above ``threshold`` set to 0 (value and gradient), ``Tensor[N, C]``.

    Args:
        cosine: ``Tensor[N, C]`` (all classes, or one chunk of them).
        labels: ``Tensor[N]`` int64, each row's target column among these C, or -1 (no target
            here: every column may be filtered). None: no column is protected (the chunked
            executor, which puts the target in separately).
        threshold: ``τ`` in (0, 1]; the filtered entries are those with ``cos > τ``.

    Returns:
        A new ``Tensor[N, C]``; the input is not modified.
    """
    dirty = cosine.detach() > threshold  # (N, C)
    if labels is not None:
        has_target = labels >= 0  # (N,)
        index = labels.clamp_min(0).unsqueeze(1)  # (N, 1)
        dirty.scatter_(1, index, dirty.gather(1, index) & ~has_target.unsqueeze(1))
    return cosine.masked_fill(dirty, 0.0)
