"""The Keras heads expose the same unit-naming aliases of the margin's size as the PyTorch
margins (``angular_margin``, ``cosine_margin``...), and the old ``margin``."""

from __future__ import annotations

import pytest

import marginface
import marginface.keras as mfk
from marginface.margins._alias import aliases_of


@pytest.mark.parametrize("name", marginface.list_losses())
def test_keras_heads_have_the_pytorch_aliases(name):
    torch_margin = marginface.create_loss(name, 5, 3).margin
    head = mfk.create_head(name, num_classes=5)
    names = aliases_of(type(torch_margin))
    assert aliases_of(type(head)) == names
    for new, old in names.items():
        assert getattr(head, new) == getattr(head, old) == getattr(torch_margin, new)
        setattr(head, new, 0.125)
        assert getattr(head, old) == 0.125
