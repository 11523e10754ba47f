"""Backbones: the MNIST recipe's small CNN (``seed-cnn``, optionally with BatchNorm) and
insightface's face backbones (IResNet r18-r200, MobileFaceNet mbf/mbf_large, ViT
vit_t/vit_s/vit_b) under their names."""

from .iresnet import IResNet, iresnet18, iresnet50
from .mobilefacenet import MobileFaceNet
from .registry import create_model, list_models
from .seed_cnn import SeedCNN
from .vit import VisionTransformer

__all__ = [
    "IResNet",
    "MobileFaceNet",
    "SeedCNN",
    "VisionTransformer",
    "create_model",
    "iresnet18",
    "iresnet50",
    "list_models",
]
