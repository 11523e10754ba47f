"""Margins: small objects that turn cosines into logits, ``(cosine, labels[, norms]) -> logits``.

They never own class centers; see :mod:`marginface.margins.base` for the interface.
"""

from .adacos import AdaCosMargin
from .adaface import AdaFaceMargin
from .adam_softmax import AdaMSoftmaxMargin
from .arcface import ANGLE_POLICIES, ArcFaceMargin
from .arcnegface import ArcNegFaceMargin
from .base import GRADIENT_MODES, ClassParameter, Context, Margin
from .circle import CircleMargin
from .combined import CombinedMargin
from .cosface import CosFaceMargin
from .curricularface import CurricularFaceMargin
from .elasticface import ElasticFaceMargin
from .li_arcface import LiArcFaceMargin
from .magface import MagFaceMargin
from .mv_softmax import MVAMSoftmaxMargin, MVArcSoftmaxMargin
from .normface import NormFaceMargin
from .npcface import NPCFaceMargin
from .sphereface import SphereFaceMargin
from .sphereface2 import SPHEREFACE2_VARIANTS, SphereFace2Margin
from .sphereface_r import SphereFaceRMargin
from .uniface import UniFaceMargin

__all__ = [
    "ANGLE_POLICIES",
    "GRADIENT_MODES",
    "SPHEREFACE2_VARIANTS",
    "AdaCosMargin",
    "AdaFaceMargin",
    "AdaMSoftmaxMargin",
    "ArcFaceMargin",
    "ArcNegFaceMargin",
    "CircleMargin",
    "ClassParameter",
    "CombinedMargin",
    "Context",
    "CosFaceMargin",
    "CurricularFaceMargin",
    "ElasticFaceMargin",
    "LiArcFaceMargin",
    "MVAMSoftmaxMargin",
    "MVArcSoftmaxMargin",
    "MagFaceMargin",
    "Margin",
    "NPCFaceMargin",
    "NormFaceMargin",
    "SphereFace2Margin",
    "SphereFaceMargin",
    "SphereFaceRMargin",
    "UniFaceMargin",
]
