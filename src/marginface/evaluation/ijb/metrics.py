"""IJB-B / IJB-C metrics of template scores, 1:1 verification and 1:N identification, as
insightface's ``recognition/arcface_torch/eval_ijbc.py`` (1:1) and
``recognition/_evaluation_/ijb/ijb_1n.py`` (1:N) compute them. The template features and pair
scores they start from are :mod:`marginface.evaluation.ijb.templates`.

1:1 (:func:`ijb_verification`): the ROC of the pair scores (scikit-learn's ``roc_curve`` with
``drop_intermediate=True``), and at each FAR target ``x`` in 1e-6 ... 1e-1 the TAR of the ROC
point whose FPR is nearest to ``x`` (insightface's rule: among equally near points the one
latest on the ROC, i.e. of highest TPR), and beside it the conservative TAR: the largest TPR of
an ROC point with FPR <= ``x`` (:func:`~marginface.evaluation.tar_at_far`).

1:N (:func:`ijb_identification`): probes (templates of known subjects) against a gallery
(one template per subject). Rank-k is the fraction of mated probes whose mate scores among the
``k`` best: fewer than ``k`` gallery templates score strictly higher than the mate (insightface
sorts with ``numpy.argsort``, whose order among equal scores is unspecified). TPIR at FPIR:

* insightface's rule (``ijb_1n.py``, every probe mated, gallery G1 ∪ G2): the threshold is the
  ``ceil(Q·f)``-th largest of all ``Q·(G-1)`` non-mate scores; TPIR is the fraction of probes
  whose mate scores above it;
* the open-set rule (NIST's, for one gallery, G1 or G2, where some probes are not mated): the
  threshold lets at most a fraction ``f`` of the non-mated probes' best scores exceed it; TPIR
  is the fraction of mated probes whose mate is ranked first and scores above it;
* insightface's per-gallery rule (``rule="insightface-per-gallery"``, one gallery): the
  threshold is the ``max(int(n·f), 1)``-th best of the ``n`` non-mated probes' best scores;
  TPIR as the open-set rule. It differs from ours where ``n·f >= 1``: the threshold is one
  non-mated score higher, so at most ``max(int(n·f), 1) - 1`` false alarms instead of
  ``floor(n·f)`` (docs/evaluation.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ..arrays import (
    ArrayLike,
    as_bool_vector,
    as_embeddings,
    as_float_vector,
    as_int_vector,
)
from ..verification import roc_auc, roc_curve, tar_at_far

__all__ = [
    "IDENTIFICATION_RULES",
    "IJB_FAR_TARGETS",
    "IJB_FPIR_TARGETS",
    "IJB_RANKS",
    "IdentificationMetrics",
    "IjbVerificationMetrics",
    "ijb_identification",
    "ijb_verification",
    "insightface_operating_points",
]

IJB_FAR_TARGETS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
"""The FARs of insightface's IJB-B/C 1:1 table."""

IJB_FPIR_TARGETS = (0.01, 0.1)
"""The FPIRs of insightface's 1:N report."""

IJB_RANKS = (1, 5, 10)
"""The ranks of insightface's 1:N report."""

IDENTIFICATION_RULES = ("open-set", "insightface", "insightface-per-gallery")
"""The TPIR-at-FPIR rules of :func:`ijb_identification` (module docstring)."""


def insightface_operating_points(
    scores: np.ndarray, same: np.ndarray, far_targets: Iterable[float]
) -> dict[float, float]:
    """insightface's TAR at each FAR target (module docstring): on scikit-learn's ROC with
    ``drop_intermediate=True``, the point of FPR nearest the target, the latest on ties."""
    fpr, tpr, _ = roc_curve(scores, same)  # every distinct score, (0, 0) first
    # scikit-learn drops the points where the curve of *counts* goes on in a straight line
    # with equal steps (second differences zero), before (0, 0) is prepended
    fps = np.round(fpr[1:] * int((~same).sum()))  # accepted impostors, (T,)
    tps = np.round(tpr[1:] * int(same.sum()))  # accepted genuine pairs, (T,)
    keep = np.r_[True, (np.diff(fps, 2) != 0) | (np.diff(tps, 2) != 0), True]
    fpr_kept = np.r_[0.0, fpr[1:][keep]]
    tpr_kept = np.r_[0.0, tpr[1:][keep]]
    result = {}
    for target in far_targets:
        distance = np.abs(fpr_kept - target)
        index = int(np.flatnonzero(distance == distance.min())[-1])  # the latest of the nearest
        result[float(target)] = float(tpr_kept[index])
    return result


@dataclass(frozen=True)
class IjbVerificationMetrics:
    """1:1 results.

    Attributes:
        tar_at_far: ``{far: TAR}`` by insightface's nearest-point rule.
        tar_at_far_conservative: ``{far: TAR}`` of the best threshold with FPR <= far (None
            where there are fewer than ``1/far`` impostor pairs).
        auc: area under the ROC.
        fpr, tpr: the ROC (every distinct score).
        num_genuine, num_impostor: pair counts.
    """

    tar_at_far: dict[float, float]
    tar_at_far_conservative: dict[float, float | None]
    auc: float
    fpr: np.ndarray = field(repr=False)
    tpr: np.ndarray = field(repr=False)
    num_genuine: int = 0
    num_impostor: int = 0

    def as_dict(self) -> dict[str, float]:
        """``tar@far=1e-06`` ..., ``tar@far=1e-06_conservative`` ... (NaN: not measurable),
        ``auc``, ``pairs_genuine``, ``pairs_impostor``."""
        out: dict[str, float] = {}
        for far, tar in self.tar_at_far.items():
            out[f"tar@far={far:.0e}"] = tar
        for far, tar in self.tar_at_far_conservative.items():
            out[f"tar@far={far:.0e}_conservative"] = math.nan if tar is None else tar
        out["auc"] = self.auc
        out["pairs_genuine"] = float(self.num_genuine)
        out["pairs_impostor"] = float(self.num_impostor)
        return out


def ijb_verification(
    scores: ArrayLike, same: ArrayLike, far_targets: Iterable[float] = IJB_FAR_TARGETS
) -> IjbVerificationMetrics:
    """1:1 metrics of scored template pairs (module docstring).

    Args:
        scores: ``float[P]`` (:func:`template_pair_scores`); same: ``bool[P]`` (the label).
        far_targets: Default: 1e-6, 1e-5 ... 1e-1.
    """
    s = as_float_vector("scores", scores)
    y = as_bool_vector("same", same, length=s.shape[0])
    targets = [float(t) for t in far_targets]
    fpr, tpr, _ = roc_curve(s, y)
    num_impostor = int((~y).sum())
    return IjbVerificationMetrics(
        tar_at_far=insightface_operating_points(s, y, targets),
        tar_at_far_conservative={t: tar_at_far(fpr, tpr, t, num_impostor) for t in targets},
        auc=roc_auc(fpr, tpr),
        fpr=fpr,
        tpr=tpr,
        num_genuine=int(y.sum()),
        num_impostor=num_impostor,
    )


@dataclass(frozen=True)
class IdentificationMetrics:
    """1:N results for one gallery.

    Attributes:
        rank: ``{k: fraction of mated probes whose mate is among the k best}``.
        tpir_at_fpir: ``{fpir: TPIR}`` (see ``rule``).
        rule: ``"insightface"`` (all probes mated) or ``"open-set"``.
        num_mated, num_non_mated: probe counts; num_gallery: gallery templates.
    """

    rank: dict[int, float]
    tpir_at_fpir: dict[float, float]
    rule: str
    num_mated: int
    num_non_mated: int
    num_gallery: int

    def as_dict(self) -> dict[str, float]:
        """``rank1``, ``rank5``, ``rank10``, ``tpir@fpir=1e-02`` ..., ``probes_mated``,
        ``probes_non_mated``, ``gallery``."""
        out: dict[str, float] = {f"rank{k}": v for k, v in self.rank.items()}
        out.update({f"tpir@fpir={f:.0e}": v for f, v in self.tpir_at_fpir.items()})
        out["probes_mated"] = float(self.num_mated)
        out["probes_non_mated"] = float(self.num_non_mated)
        out["gallery"] = float(self.num_gallery)
        return out


def ijb_identification(
    probe_features: ArrayLike,
    probe_subjects: ArrayLike,
    gallery_features: ArrayLike,
    gallery_subjects: ArrayLike,
    *,
    ranks: Iterable[int] = IJB_RANKS,
    fpir_targets: Iterable[float] = IJB_FPIR_TARGETS,
    rule: str = "open-set",
) -> IdentificationMetrics:
    """1:N identification of probe templates against a gallery (module docstring).

    Args:
        probe_features: ``float[Q, D]`` L2-normalized template features.
        probe_subjects: ``int[Q]`` subject of each probe.
        gallery_features: ``float[G, D]``; gallery_subjects: ``int[G]``, each subject once.
        ranks: Default 1, 5, 10. fpir_targets: Default 0.01, 0.1.
        rule: ``"open-set"`` (default; probes whose subject is not in the gallery are
            non-mated), ``"insightface"`` (``ijb_1n.py``'s: every probe must be mated) or
            ``"insightface-per-gallery"`` (the ``max(int(n·f), 1)``-th best non-mated score).
    """
    q = as_embeddings("probe_features", probe_features)
    g = as_embeddings("gallery_features", gallery_features)
    if g.shape[1] != q.shape[1]:
        raise ValueError(
            f"gallery_features must have {q.shape[1]} columns like probe_features, got {g.shape}"
        )
    probe_ids = as_int_vector("probe_subjects", probe_subjects, length=q.shape[0])
    gallery_ids = as_int_vector("gallery_subjects", gallery_subjects, length=g.shape[0])
    if np.unique(gallery_ids).shape[0] != gallery_ids.shape[0]:
        raise ValueError("gallery_subjects must name each subject once (one template each)")
    if rule not in IDENTIFICATION_RULES:
        raise ValueError(f"rule must be one of {', '.join(IDENTIFICATION_RULES)}, got {rule!r}")
    order = np.argsort(gallery_ids)
    position = np.searchsorted(gallery_ids[order], probe_ids)
    position = np.minimum(position, gallery_ids.shape[0] - 1)
    mated = gallery_ids[order][position] == probe_ids  # (Q,)
    mate = order[position]  # (Q,) gallery row of the mate (where mated)
    if rule == "insightface" and not mated.all():
        raise ValueError(
            f"rule='insightface' needs every probe's subject in the gallery; "
            f"{int((~mated).sum())} probe(s) are not"
        )
    if not mated.any():
        raise ValueError("no probe's subject is in the gallery (no mated probe)")
    similarity = q @ g.T  # (Q, G)
    rows = np.flatnonzero(mated)
    mate_score = similarity[rows, mate[rows]]  # (Qm,)
    higher = (similarity[rows] > mate_score[:, None]).sum(axis=1)  # (Qm,) strictly better
    rank = {int(k): float(np.mean(higher < k)) for k in ranks}
    targets = [float(f) for f in fpir_targets]
    if rule == "insightface":
        others = similarity.copy()
        others[rows, mate[rows]] = -np.inf
        non_mate = others[np.isfinite(others)]  # (Q·(G-1),) every non-mate score
        if non_mate.shape[0] == 0:
            raise ValueError("rule='insightface' needs at least 2 gallery templates")
        tpir = {}
        for f in targets:
            needed = min(max(math.ceil(q.shape[0] * f), 1), non_mate.shape[0])
            # the needed-th largest non-mate score
            threshold = -np.partition(-non_mate, needed - 1)[needed - 1]
            tpir[f] = float(np.mean(mate_score > threshold))
    else:
        best_non_mated = np.sort(similarity[~mated].max(axis=1))[::-1]  # (Qn,) descending
        tpir = {}
        for f in targets:
            count = best_non_mated.shape[0]
            if rule == "insightface-per-gallery":  # the max(int(n·f), 1)-th best non-mated
                threshold = best_non_mated[max(int(count * f), 1) - 1] if count else -np.inf
                tpir[f] = float(np.mean((higher == 0) & (mate_score > threshold)))
                continue
            allowed = math.floor(f * best_non_mated.shape[0] + 1e-9)  # false alarms allowed
            # at most `allowed` best scores exceed the threshold (-inf: no non-mated probe)
            threshold = best_non_mated[allowed] if allowed < count else -np.inf
            tpir[f] = float(np.mean((higher == 0) & (mate_score > threshold)))
    return IdentificationMetrics(
        rank=rank,
        tpir_at_fpir=tpir,
        rule=rule,
        num_mated=int(mated.sum()),
        num_non_mated=int((~mated).sum()),
        num_gallery=int(g.shape[0]),
    )
