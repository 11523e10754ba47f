"""marginface: margin-based softmax losses for embedding learning.

Margins (``marginface.margins``) turn cosines into logits; executors (``marginface.executors``)
compute the cosines and reduce them to a loss; heads (:class:`MarginSoftmaxLoss` and the named
losses) own the class centers and wire one margin to one executor.

>>> import torch, marginface
>>> loss_fn = marginface.create_loss("arcface", num_classes=10, embedding_dim=3)
>>> loss = loss_fn(torch.randn(8, 3), torch.randint(0, 10, (8,)))
>>> loss.shape
torch.Size([])

Importing the package is cheap: the names below are loaded on first use (PEP 562), so that
``marginface --help`` answers without importing torch. ``import marginface`` followed by any
attribute (``marginface.ArcFaceLoss``, ``marginface.create_loss``) loads the whole core, as an
eager import would.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names for type checkers and IDEs; at run time __getattr__ loads them
    from . import functional, margins
    from ._validation import set_value_checks
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
    "set_value_checks",
]

_SUBMODULES = frozenset({"functional", "margins"})
_FROM_HEAD = frozenset({"MarginSoftmaxLoss", "reshardable_state_dict"})
_FROM_REGISTRY = frozenset({"create_loss", "get_loss_class", "list_losses", "register_loss"})


def __getattr__(name: str) -> Any:
    """Load a public name on first use (``marginface.ArcFaceLoss`` imports the core then;
    ``marginface.FaceModel`` the inference package, which pulls in the pipeline)."""
    if name in _SUBMODULES:
        module = importlib.import_module(f".{name}", __name__)
    elif name == "FaceModel":
        module = importlib.import_module(".inference", __name__).FaceModel
    elif name == "set_value_checks":
        module = importlib.import_module("._validation", __name__).set_value_checks
    elif name in __all__:
        importlib.import_module(".losses", __name__)  # every named loss, registered
        source = "losses"
        if name in _FROM_HEAD or name in _FROM_REGISTRY:
            source = "head" if name in _FROM_HEAD else "registry"
        module = getattr(importlib.import_module(f".{source}", __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = module  # later lookups skip __getattr__
    return module


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
