"""docs/architecture.md's worked examples run as written: the smallest complete margin with its
one-class named loss, and a backbone registered with the decorator."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import marginface
import marginface.models.registry as model_registry
import marginface.registry as loss_registry
from marginface._registry import Registry
from marginface.head import MarginSoftmaxLoss
from marginface.margins import CosFaceMargin

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def _example(marker: str) -> str:
    found = [block for block in _blocks() if marker in block]
    assert len(found) == 1, f"one python block holding {marker!r} in {DOC.name}"
    return found[0]


@pytest.fixture
def fresh_tables(monkeypatch):
    """Register the examples in throw-away tables, not the package's."""
    monkeypatch.setattr(loss_registry, "LOSSES", Registry("loss"))
    monkeypatch.setattr(model_registry, "MODELS", Registry("model"))


def test_the_smallest_margin_is_complete(fresh_tables):
    namespace: dict = {}
    exec(compile(_example("class ShiftedCosineMargin"), str(DOC), "exec"), namespace)
    loss_class = namespace["ShiftedCosineLoss"]
    assert loss_registry.LOSSES.get("Shifted_Cosine") is loss_class
    parameters = inspect.signature(loss_class).parameters
    assert (parameters["margin"].default, parameters["scale"].default) == (0.35, 64.0)
    assert {"impl", "chunk_size", "memory_budget", "sample_rate"} <= set(parameters)
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randint(0, 10, (8,))
    # the same value as CosFace with the same centers, on the dense and the chunked executor
    for impl in ("dense", "chunked"):
        loss = loss_class(10, 3, margin=0.2, scale=16.0, impl=impl, dtype=torch.float64)
        reference = MarginSoftmaxLoss(10, 3, CosFaceMargin(0.2, 16.0), dtype=torch.float64)
        reference.load_state_dict(loss.state_dict())
        torch.testing.assert_close(loss(x, y), reference(x, y))
    with pytest.raises(ValueError, match="margin"):
        loss_class(10, 3, margin=-1.0)


def test_the_backbone_example_registers(fresh_tables):
    namespace: dict = {}
    exec(compile(_example('@register_model("tiny-mlp")'), str(DOC), "exec"), namespace)
    model = marginface.models.create_model("tiny-mlp", embedding_dim=4, in_channels=1, image_size=8)
    assert model(torch.randn(5, 1, 8, 8)).shape == (5, 4)


def test_the_page_holds_exactly_these_examples():
    assert len(_blocks()) == 3  # the margin, the one registry line (shown only), the backbone
