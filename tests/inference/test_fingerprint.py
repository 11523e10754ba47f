"""inference/fingerprint.py: the weights' and the images' fingerprints (their behaviour under
copies and changes is held in tests/train/test_embedding_store.py, which keys a run's
embeddings with them)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from marginface.inference import fingerprint
from marginface.train import embedding_store


def test_the_run_store_keys_with_these_fingerprints() -> None:
    assert embedding_store.weights_fingerprint is fingerprint.weights_fingerprint
    assert embedding_store.data_fingerprint is fingerprint.data_fingerprint


def test_the_weights_fingerprint_sees_the_dtype_and_the_names() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    base = fingerprint.weights_fingerprint(model)
    assert len(base) == 32
    assert fingerprint.weights_fingerprint(nn.Linear(3, 2).double()) != base
    renamed = nn.Sequential(model)  # the same tensors under other names ("0.weight")
    assert fingerprint.weights_fingerprint(renamed) != base


def test_the_data_fingerprint_reads_64_rows_of_a_large_set() -> None:
    images = np.zeros((1000, 2), np.uint8)
    base = fingerprint.data_fingerprint(images)
    unsampled = images.copy()
    unsampled[1] = 1  # not one of the 64 evenly spaced rows (0, 15, 31, ...)
    assert fingerprint.data_fingerprint(unsampled) == base
    sampled = images.copy()
    sampled[0] = 1
    assert fingerprint.data_fingerprint(sampled) != base
