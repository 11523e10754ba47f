"""Backbones: the seeds' CNN (optionally with BatchNorm) and IResNet-18/50 for faces."""

from .iresnet import IResNet, iresnet18, iresnet50
from .registry import create_model, list_models
from .seed_cnn import SeedCNN

__all__ = ["IResNet", "SeedCNN", "create_model", "iresnet18", "iresnet50", "list_models"]
