"""IJB-B / IJB-C, insightface's protocol on features of any size, in one package:

* :mod:`~marginface.evaluation.ijb.templates` -- each image's feature (flip, norm and detector
  score), templates pooled over their media, pair scores;
* :mod:`~marginface.evaluation.ijb.metrics` -- 1:1 TAR@FAR (insightface's nearest-point rule
  and the conservative one) and 1:N rank-k / TPIR@FPIR (open-set, insightface's and its
  per-gallery rule);
* :mod:`~marginface.evaluation.ijb.protocol` -- from image embeddings to an :class:`IjbResult`
  (:func:`evaluate_ijb`): 1:1, each gallery, their mean and the pooled G1+G2 search.

The dataset's files and images are :mod:`marginface.data.ijb`; a model evaluated on them (the
one function a training run and ``marginface ijb`` call) is
:func:`marginface.train.evaluation.ijb_evaluation.ijb_results`.
"""

from .metrics import (
    IDENTIFICATION_RULES,
    IJB_FAR_TARGETS,
    IJB_FPIR_TARGETS,
    IJB_RANKS,
    IdentificationMetrics,
    IjbVerificationMetrics,
    ijb_identification,
    ijb_verification,
    insightface_operating_points,
)
from .protocol import IjbLists, IjbResult, evaluate_ijb
from .templates import ijb_image_features, template_features, template_pair_scores

__all__ = [
    "IDENTIFICATION_RULES",
    "IJB_FAR_TARGETS",
    "IJB_FPIR_TARGETS",
    "IJB_RANKS",
    "IdentificationMetrics",
    "IjbLists",
    "IjbResult",
    "IjbVerificationMetrics",
    "evaluate_ijb",
    "ijb_identification",
    "ijb_image_features",
    "ijb_verification",
    "insightface_operating_points",
    "template_features",
    "template_pair_scores",
]
