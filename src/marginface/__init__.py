"""marginface: margin-based softmax losses for embedding learning.

Margins (``marginface.margins``) turn cosines into logits; executors (``marginface.executors``)
compute the cosines and reduce them to a loss; heads (:class:`MarginSoftmaxLoss` and the named
losses) own the class centers and wire one margin to one executor.

>>> import torch, marginface
>>> loss_fn = marginface.create_loss("arcface", num_classes=10, embedding_dim=3)
>>> loss = loss_fn(torch.randn(8, 3), torch.randint(0, 10, (8,)))
>>> loss.shape
torch.Size([])
"""

from . import functional, margins
from .head import MarginSoftmaxLoss, reshardable_state_dict
from .losses import (
    AdaCosLoss,
    AdaFaceLoss,
    AdaMSoftmaxLoss,
    AMSoftmaxLoss,
    ArcFaceLoss,
    ArcNegFaceLoss,
    CircleLoss,
    CombinedMarginLoss,
    CosFaceLoss,
    CurricularFaceLoss,
    ElasticFaceLoss,
    LiArcFaceLoss,
    MagFaceLoss,
    MVAMSoftmaxLoss,
    MVArcSoftmaxLoss,
    NormFaceLoss,
    NPCFaceLoss,
    SphereFace2ALoss,
    SphereFace2Loss,
    SphereFace2MLoss,
    SphereFaceLoss,
    SphereFacePlusLoss,
    SphereFaceRLoss,
    SubCenterArcFaceLoss,
    UniFaceALoss,
    UniFaceLoss,
)
from .registry import create_loss, get_loss_class, list_losses, register_loss

__version__ = "0.1.0"


def __getattr__(name: str):
    """``marginface.FaceModel``, imported on first use (the inference package pulls in the
    pipeline; ``import marginface`` stays the core)."""
    if name == "FaceModel":
        from .inference import FaceModel

        return FaceModel
    raise AttributeError(f"module 'marginface' has no attribute {name!r}")


__all__ = [
    "AMSoftmaxLoss",
    "AdaCosLoss",
    "AdaFaceLoss",
    "AdaMSoftmaxLoss",
    "ArcFaceLoss",
    "ArcNegFaceLoss",
    "CircleLoss",
    "CombinedMarginLoss",
    "CosFaceLoss",
    "CurricularFaceLoss",
    "ElasticFaceLoss",
    "FaceModel",
    "LiArcFaceLoss",
    "MVAMSoftmaxLoss",
    "MVArcSoftmaxLoss",
    "MagFaceLoss",
    "MarginSoftmaxLoss",
    "NPCFaceLoss",
    "NormFaceLoss",
    "SphereFace2ALoss",
    "SphereFace2Loss",
    "SphereFace2MLoss",
    "SphereFaceLoss",
    "SphereFacePlusLoss",
    "SphereFaceRLoss",
    "SubCenterArcFaceLoss",
    "UniFaceALoss",
    "UniFaceLoss",
    "__version__",
    "create_loss",
    "functional",
    "get_loss_class",
    "list_losses",
    "margins",
    "register_loss",
    "reshardable_state_dict",
]
