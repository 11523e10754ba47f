"""The seeds' printed numbers as test cases."""

from __future__ import annotations

import numpy as np
import torch

from marginface.functional import additive_angular_margin, margin_cross_entropy
from marginface.margins import ArcFaceMargin, CosFaceMargin
from marginface.margins.cosface import additive_cosine_margin


def test_seed002_arcface_margin_step() -> None:
    """Seed 002: target cosines 0.6971 -> 0.2680 and -0.3012 -> -0.7215 at m = 0.5."""
    cos = torch.tensor([0.6971, -0.3012], dtype=torch.float64)
    out = additive_angular_margin(cos, 0.5, "linear")
    torch.testing.assert_close(
        out, torch.tensor([0.2680, -0.7215], dtype=torch.float64), atol=1e-4, rtol=0
    )


def test_seed002_scaled_logits() -> None:
    """Seed 002's full logit matrix at s = 64 from its printed cosines (4-decimal inputs)."""
    cosine = torch.tensor(
        [[0.1924, 0.6971, 0.3102], [0.2836, 0.5013, -0.3012]], dtype=torch.float64
    )
    labels = torch.tensor([1, 2])
    logits = ArcFaceMargin(0.5, 64.0)(cosine, labels)
    expected = torch.tensor(
        [[12.3137, 17.1532, 19.8498], [18.1530, 32.0855, -46.1732]], dtype=torch.float64
    )
    # inputs are rounded to 1e-4, so logits agree to ~64 * 1e-4
    torch.testing.assert_close(logits, expected, atol=64 * 1.2e-4, rtol=0)


# Seed 001: x = arange(12).reshape(3, 4); w = arange(16).reshape(4, 4) - 8 (D x C); y = [0, 3, 1]
def _seed001_cosine() -> tuple[torch.Tensor, torch.Tensor]:
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    w = np.arange(16, dtype=np.float64).reshape(4, 4) - 8
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    w = w / np.linalg.norm(w, axis=0, keepdims=True)
    return torch.from_numpy(x @ w), torch.tensor([0, 3, 1])


def test_seed001_cosines() -> None:
    cosine, _ = _seed001_cosine()
    expected = torch.tensor(
        [
            [0.21821789, 0.40824829, 0.5976143, 0.7581754],
            [-0.21821789, -0.01944039, 0.19920477, 0.40824829],
            [-0.29875272, -0.10265789, 0.11688115, 0.33078652],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(cosine, expected, atol=1e-8, rtol=0)


def test_seed001_conditional_variant_reproduces_printed_losses() -> None:
    """Seed 001 subtracts m only where cos θ_y > m; its printed per-row values are -log(p)/3."""
    cosine, labels = _seed001_cosine()
    margin = CosFaceMargin(0.35, 30.0, conditional=True)
    per_row = margin_cross_entropy(cosine, labels, margin, reduction="none")
    printed = torch.tensor([5.40227082, 1.41485322, 4.33498884], dtype=torch.float64)
    torch.testing.assert_close(per_row / 3, printed, atol=1e-7, rtol=0)
    # the printed intermediate: only row 1's target changes, 0.4082 -> 0.0582
    logits = margin(cosine, labels)
    assert abs(float(logits[1, 3]) / 30 - 0.05824829) < 1e-7
    assert float(logits[0, 0]) / 30 == float(cosine[0, 0])


def test_seed001_paper_formula_on_same_inputs() -> None:
    """The paper's AM-Softmax subtracts m from every target, whatever its cosine."""
    cosine, labels = _seed001_cosine()
    s, m = 30.0, 0.35
    per_row = margin_cross_entropy(cosine, labels, CosFaceMargin(m, s), reduction="none")
    # independent numpy reference of the paper's formula
    c = cosine.numpy()
    rows = np.arange(3)
    logits = s * c
    logits[rows, labels.numpy()] = s * (c[rows, labels.numpy()] - m)
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    expected = lse - logits[rows, labels.numpy()]
    torch.testing.assert_close(per_row, torch.from_numpy(expected), atol=1e-10, rtol=0)
    # rows 0 and 2 differ from the conditional variant (their cos θ_y <= m), row 1 does not
    conditional = margin_cross_entropy(
        cosine, labels, CosFaceMargin(m, s, conditional=True), reduction="none"
    )
    assert torch.allclose(per_row[1], conditional[1])
    assert bool((per_row[[0, 2]] > conditional[[0, 2]]).all())


def test_cosface_margin_is_a_shift() -> None:
    cos = torch.linspace(-1, 1, 11, dtype=torch.float64)
    torch.testing.assert_close(additive_cosine_margin(cos, 0.35), cos - 0.35)
