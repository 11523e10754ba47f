"""IJB-B / IJB-C protocol from image embeddings to a result: image features, templates, pair
scores, the 1:1 metrics and the 1:N ones of each gallery, their mean and the pooled G1+G2
search (:func:`evaluate_ijb`). The dataset's files are read by :mod:`marginface.data.ijb`; a
model's embeddings of its images come from
:func:`marginface.train.evaluation.ijb_evaluation.ijb_results`, which calls this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .metrics import (
    IJB_FAR_TARGETS,
    IdentificationMetrics,
    IjbVerificationMetrics,
    ijb_identification,
    ijb_verification,
)
from .templates import ijb_image_features, template_features, template_pair_scores

__all__ = ["IjbLists", "IjbResult", "evaluate_ijb"]


class IjbLists(Protocol):
    """What the protocol reads of an IJB dataset (:class:`~marginface.data.ijb.IjbLayout` has
    it): per image (``N``, in the embeddings' order) its detector score, template and media;
    the 1:1 pairs (``P``); the 1:N galleries and probes.

    Attributes:
        face_scores: ``float32[N]``; templates, medias: ``int64[N]``.
        pair_first, pair_second: ``int64[P]`` template ids; pair_label: ``bool[P]``.
        galleries: ``{"G1": (template ids, subject ids), "G2": ...}`` (empty without 1:N).
        probes: ``(template ids, subject ids)`` of the mixed probes, or None.
    """

    @property
    def face_scores(self) -> np.ndarray: ...
    @property
    def templates(self) -> np.ndarray: ...
    @property
    def medias(self) -> np.ndarray: ...
    @property
    def pair_first(self) -> np.ndarray: ...
    @property
    def pair_second(self) -> np.ndarray: ...
    @property
    def pair_label(self) -> np.ndarray: ...
    @property
    def galleries(self) -> dict[str, tuple[np.ndarray, np.ndarray]]: ...
    @property
    def probes(self) -> tuple[np.ndarray, np.ndarray] | None: ...


@dataclass(frozen=True)
class IjbResult:
    """What :func:`evaluate_ijb` measured.

    Attributes:
        verification: 1:1 (:class:`~marginface.evaluation.ijb.IjbVerificationMetrics`).
        identification: 1:N by gallery: ``"G1"``, ``"G2"`` (``gallery_rule``), their
            ``"mean"`` (as insightface's per-gallery script prints it: rank-k pooled over the
            probes, ``Σ hits / Q``, TPIR averaged over the two galleries; probe and gallery
            counts summed) and ``"G1+G2"``
            (insightface's rule); empty without the 1:N files.
        scores: ``float64[P]`` the 1:1 pair scores (``layout.pair_label`` their labels).
        template_ids, template_features: ``int64[T]`` and ``float[T, D]``, each template's
            L2-normalised feature (what users reuse); None when not kept.
    """

    verification: IjbVerificationMetrics
    identification: dict[str, IdentificationMetrics]
    scores: np.ndarray
    template_ids: np.ndarray | None = None
    template_features: np.ndarray | None = None

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """Every scalar, keys prefixed (``ijbc_tar@far=1e-04``, ``ijbc_G1_rank1`` ...)."""
        out = {f"{prefix}{k}": v for k, v in self.verification.as_dict().items()}
        for gallery, metrics in self.identification.items():
            out.update({f"{prefix}{gallery}_{k}": v for k, v in metrics.as_dict().items()})
        return out


def evaluate_ijb(
    layout: IjbLists,
    embeddings: np.ndarray,
    flipped: np.ndarray | None,
    *,
    flip: bool = True,
    norm_score: bool = True,
    detector_score: bool = True,
    far_targets: tuple[float, ...] = IJB_FAR_TARGETS,
    gallery_rule: str = "open-set",
) -> IjbResult:
    """The 1:1 and 1:N protocols on the embedded images: image features
    (:func:`~marginface.evaluation.ijb.templates.ijb_image_features`), templates pooled over
    their media (:func:`~marginface.evaluation.ijb.templates.template_features`), the pair
    scores, the 1:1 metrics and, with the 1:N lists, each gallery's, their ``"mean"``
    (:func:`_mean_of_galleries`) and ``G1+G2``'s (insightface's rule).

    Args:
        layout: the protocol's lists (:class:`IjbLists`; a
            :class:`~marginface.data.ijb.IjbLayout` is one).
        embeddings, flipped: ``[N, D]`` each, in ``layout.names`` order.
        flip, norm_score, detector_score: the ablations (all on: insightface's setting).
        far_targets: 1:1 FARs. Default: 1e-6 ... 1e-1.
        gallery_rule: the TPIR rule of each gallery, ``"open-set"`` (default, ours) or
            ``"insightface-per-gallery"``
            (:func:`~marginface.evaluation.ijb.ijb_identification`).
    """
    features = ijb_image_features(
        embeddings,
        flipped,
        layout.face_scores,
        flip=flip,
        norm_score=norm_score,
        detector_score=detector_score,
    )
    ids, pooled = template_features(features, layout.templates, layout.medias)
    scores = template_pair_scores(ids, pooled, layout.pair_first, layout.pair_second)
    verification = ijb_verification(scores, layout.pair_label, far_targets)
    identification: dict[str, IdentificationMetrics] = {}
    if layout.probes is not None:
        probe_t, probe_s = layout.probes
        probe_f = pooled[_rows(ids, probe_t)]
        both_t, both_s = [], []
        for name, (gallery_t, gallery_s) in layout.galleries.items():
            gallery_f = pooled[_rows(ids, gallery_t)]
            identification[name] = ijb_identification(
                probe_f, probe_s, gallery_f, gallery_s, rule=gallery_rule
            )
            both_t.append(gallery_t)
            both_s.append(gallery_s)
        if len(identification) == 2:
            identification["mean"] = _mean_of_galleries(list(identification.values()))
        if both_t:
            gallery_t, gallery_s = np.concatenate(both_t), np.concatenate(both_s)
            identification["+".join(layout.galleries)] = ijb_identification(
                probe_f, probe_s, pooled[_rows(ids, gallery_t)], gallery_s, rule="insightface"
            )
    return IjbResult(verification, identification, scores, ids, pooled)


def _mean_of_galleries(galleries: list[IdentificationMetrics]) -> IdentificationMetrics:
    """The "mean" row of insightface's per-gallery script (``ijb_evals.py``'s
    ``run_model_test_1N``), over galleries searched by the same ``Q`` probes.

    Rank-k pools the counts: ``Σ_g (mates among the k best in g) / Q``, ``Q`` the probes
    (each probe is mated in one gallery: e.g. ``(35 + 29) / 123``, not the mean of the two
    galleries' rates); TPIR at each FPIR is the plain mean of the galleries' TPIRs, as theirs. Probe
    and gallery counts summed.
    """
    first = galleries[0]
    probes = first.num_mated + first.num_non_mated  # Q: every gallery is searched by all
    counts = {k: sum(round(g.rank[k] * g.num_mated) for g in galleries) for k in first.rank}
    return IdentificationMetrics(
        rank={k: counts[k] / probes if probes else 0.0 for k in first.rank},
        tpir_at_fpir={
            f: float(np.mean([g.tpir_at_fpir[f] for g in galleries])) for f in first.tpir_at_fpir
        },
        rule=(
            f"insightface's mean of {len(galleries)} galleries: rank-k pooled over the probes, "
            f"TPIR averaged ({first.rule})"
        ),
        num_mated=sum(g.num_mated for g in galleries),
        num_non_mated=sum(g.num_non_mated for g in galleries),
        num_gallery=sum(g.num_gallery for g in galleries),
    )


def _rows(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    rows = np.searchsorted(ids, wanted)
    rows = np.minimum(rows, ids.shape[0] - 1)
    if (ids[rows] != wanted).any():
        missing = int(wanted[ids[rows] != wanted][0])
        raise ValueError(f"template {missing} of the 1:N lists has no image")
    return rows
