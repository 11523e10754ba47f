"""Evaluation metrics: closed-set accuracy, verification on pairs, open-set retrieval.

Every function accepts torch tensors (any device; detached) or NumPy arrays and returns plain
Python floats or NumPy arrays.

* :func:`closed_set_accuracy` -- argmax of cosines to the class centers.
* :func:`l2_normalize` -- rows scaled to unit L2 norm (zero rows stay zero).
* :func:`target_and_nearest_angles` -- each sample's angle to its class center and to the
  nearest other one.
* :class:`PairSet`, :func:`pair_scores`, :func:`sample_pairs` -- verification pairs, their cosine
  scores, balanced random pairs.
* :func:`verification_metrics` -- LFW 10-fold accuracy, ROC AUC, EER, TAR at FAR.
* :func:`bin_verification_metrics` -- insightface's ``.bin`` protocol (Accuracy-Flip on its
  squared-L2 grid, XNorm, VAL@FAR), the numbers papers print.
* :mod:`~marginface.evaluation.ijb` -- IJB-B/C template pooling, 1:1 TAR@FAR and 1:N
  rank/TPIR (insightface's protocol), from image embeddings to a result (:func:`evaluate_ijb`);
  :mod:`~marginface.data.ijb` reads the dataset and its images.
* :func:`clopper_pearson`, :func:`supported_rate` -- the exact binomial interval of a measured
  error rate, and the smallest rate a number of trials supports.
* :class:`OpenSetReport`, :func:`open_set_counts` -- a 1:N search's decisions on probes of
  known identity: rank-1, mated accepted right/wrong/rejected, non-mated rejected/accepted.
* :func:`retrieval_metrics` -- leave-one-out precision@1 and MAP@R.
* :func:`error_versus_reject`, :func:`pair_quality` -- a quality score's error-versus-reject
  curve (MagFace's feature magnitude).
"""

from .angles import target_and_nearest_angles
from .bin_verification import (
    ACCURACY_THRESHOLDS,
    VAL_THRESHOLDS,
    BinVerificationMetrics,
    bin_set_metrics,
    bin_verification_metrics,
    grid_note,
    grid_notes,
    kfold_folds,
    threshold_at_far,
)
from .binomial import (
    DEFAULT_MIN_ERRORS,
    binomial_cdf,
    clopper_pearson,
    rate_is_supported,
    supported_rate,
)
from .closed_set import closed_set_accuracy, cosine_to_centers, l2_normalize
from .ijb import (
    IJB_FAR_TARGETS,
    IdentificationMetrics,
    IjbVerificationMetrics,
    ijb_identification,
    ijb_image_features,
    ijb_verification,
    template_features,
    template_pair_scores,
)
from .open_set import OpenSetReport, open_set_counts
from .pairs import NUM_FOLDS, PairSet, pair_scores, sample_pairs
from .quality import ErrorVersusReject, error_versus_reject, pair_quality
from .retrieval import retrieval_metrics
from .verification import (
    DEFAULT_FAR_TARGETS,
    VerificationMetrics,
    best_threshold,
    equal_error_rate,
    kfold_accuracy,
    roc_auc,
    roc_curve,
    tar_at_far,
    verification_metrics,
)

__all__ = [
    "ACCURACY_THRESHOLDS",
    "DEFAULT_FAR_TARGETS",
    "DEFAULT_MIN_ERRORS",
    "IJB_FAR_TARGETS",
    "NUM_FOLDS",
    "VAL_THRESHOLDS",
    "BinVerificationMetrics",
    "ErrorVersusReject",
    "IdentificationMetrics",
    "IjbVerificationMetrics",
    "OpenSetReport",
    "PairSet",
    "VerificationMetrics",
    "best_threshold",
    "bin_set_metrics",
    "bin_verification_metrics",
    "binomial_cdf",
    "clopper_pearson",
    "closed_set_accuracy",
    "cosine_to_centers",
    "equal_error_rate",
    "error_versus_reject",
    "grid_note",
    "grid_notes",
    "ijb_identification",
    "ijb_image_features",
    "ijb_verification",
    "kfold_accuracy",
    "kfold_folds",
    "l2_normalize",
    "open_set_counts",
    "pair_quality",
    "pair_scores",
    "rate_is_supported",
    "retrieval_metrics",
    "roc_auc",
    "roc_curve",
    "sample_pairs",
    "supported_rate",
    "tar_at_far",
    "target_and_nearest_angles",
    "template_features",
    "template_pair_scores",
    "threshold_at_far",
    "verification_metrics",
]
