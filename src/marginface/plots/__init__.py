"""Pictures (matplotlib): embeddings on the circle and sphere, margin curves, training curves,
ROC curves, IJB results over training, angle distributions, error-versus-reject curves, a
verification run's accuracy curves, score histograms and PCA projection, and an atomic PNG
writer; interactive 3-D embeddings as plotly figure specifications
(:func:`sphere_figure`, rendered by :mod:`marginface.report`).

Every ``plot_*`` function returns a :class:`matplotlib.figure.Figure` on its own Agg canvas (see
:mod:`._figure`): importing this package does not import matplotlib or change its backend.
"""

from .angles import plot_angle_distributions
from .embeddings import plot_embedding_grid, plot_embeddings
from .ijb import ijb_prefixes, plot_ijb_history
from .interactive import sphere_figure
from .margin_curves import DEFAULT_NORM, default_margins, margin_curve, plot_margin_curves
from .quality import plot_error_versus_reject
from .roc import plot_roc
from .save import save_figure
from .training import plot_state_curve, plot_training_curves
from .verification import (
    TEST_PAIRS,
    plot_pca_projection,
    plot_score_histograms,
    plot_verification_curves,
    verification_set_names,
)

__all__ = [
    "DEFAULT_NORM",
    "TEST_PAIRS",
    "default_margins",
    "ijb_prefixes",
    "margin_curve",
    "plot_angle_distributions",
    "plot_embedding_grid",
    "plot_embeddings",
    "plot_error_versus_reject",
    "plot_ijb_history",
    "plot_margin_curves",
    "plot_pca_projection",
    "plot_roc",
    "plot_score_histograms",
    "plot_state_curve",
    "plot_training_curves",
    "plot_verification_curves",
    "save_figure",
    "sphere_figure",
    "verification_set_names",
]
