"""NPCFace (Zeng et al., 2020): the formula restated on cosines, the per-row statistics pass (a
row without hard negatives gets m' = m0), the gradient with the hard mask and m' frozen, a
margin with its own row statistics declared in this file running chunked with no executor edit,
bad inputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import marginface
from marginface.margins import Margin, NPCFaceMargin
from marginface.margins.base import Context

from ._frozen_weights import check_frozen_weight_gradient

N, C = 8, 6


def _cosine(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    cosine = torch.rand(N, C, generator=generator, dtype=torch.float64) * 1.8 - 0.9
    return cosine, torch.randint(0, C, (N,), generator=generator)


def test_the_papers_logits() -> None:
    """hard_j = [cos θ_j > cos(θ_y + m)]; m' = m0 + m1·mean(hard cosines) (m0 without any);
    logit_y = s cos(θ_y + m'); logit_j = s(t cos θ_j + a) if hard else s cos θ_j."""
    cosine, labels = _cosine()
    cosine[0] = -0.5
    cosine[0, labels[0]] = 0.9  # row 0: no hard negative
    m, s, m0, m1, t, a = 0.5, 64.0, 0.4, 0.2, 1.1, 0.2
    logits = NPCFaceMargin(m, s, m0=m0, m1=m1, t=t, a=a, policy="none")(cosine, labels)
    for i in range(N):
        y = int(labels[i])
        theta = math.acos(float(cosine[i, y]))
        hard = [j for j in range(C) if j != y and float(cosine[i, j]) > math.cos(theta + m)]
        mean = sum(float(cosine[i, j]) for j in hard) / max(1, len(hard))
        if i == 0:
            assert hard == [] and mean == 0.0
        new_margin = m0 + m1 * mean
        for j in range(C):
            c = float(cosine[i, j])
            if j == y:
                expected = s * math.cos(theta + new_margin)
            else:
                expected = s * (t * c + a if j in hard else c)
            assert float(logits[i, j]) == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_the_heads_gradient_is_the_frozen_mask_derivative(impl: str) -> None:
    """float64: ∂L/∂x, ∂L/∂W equal central differences with the hard mask and m' frozen."""
    m, s, m0, m1, t, a = 0.5, 16.0, 0.4, 0.2, 1.1, 0.2

    def frozen(c0: torch.Tensor, y: torch.Tensor, x: torch.Tensor):
        is_target = F.one_hot(y, c0.shape[1]).bool()
        g0 = c0.gather(1, y[:, None]).clamp(-1, 1)
        threshold = torch.cos(torch.acos(g0) + m)
        hard = (c0 > threshold) & ~is_target
        mean = torch.where(hard, c0, 0.0).sum(1, keepdim=True) / hard.sum(1, keepdim=True).clamp(1)
        new_margin = m0 + m1 * mean  # (N, 1)
        mask = c0 > threshold

        def logits(cosine: torch.Tensor) -> torch.Tensor:
            g = cosine.gather(1, y[:, None])
            target = torch.where(g > 0, torch.cos(torch.acos(g) + new_margin), g)
            others = torch.where(mask, t * cosine + a, cosine)
            return s * torch.where(is_target, target, others)

        return logits

    check_frozen_weight_gradient("npcface", {"margin": m, "scale": s}, frozen, impl)


class _CountedMargin(Margin):
    """A margin defined only here with its own per-row statistic: the target margin is
    ``0.1·(number of non-targets with cos θ_j > 0)``, ``s·(cos θ_y - m_i)``."""

    def scale_for(self, norms):
        return 8.0

    def row_statistics_size(self) -> int:
        return 1

    def row_statistics_terms(self, cosine, cos_target):
        return ((cosine > 0).to(cosine.dtype),)

    def prepare(self, cos_target, labels, norms, cosine=None) -> Context:
        sums = self.dense_row_statistics(cosine, cos_target, labels)
        return self.prepare_with_row_statistics(cos_target, labels, norms, sums)

    def prepare_with_row_statistics(self, cos_target, labels, norms, sums) -> Context:
        return {"scale": 8.0, "shift": 0.1 * sums[0]}

    def target_cosine(self, cos_target, norms, context):
        return cos_target - context["shift"].to(cos_target.dtype)


@pytest.mark.parametrize("sample_rate", [1.0, 0.5])
def test_a_margin_with_row_statistics_declared_in_a_test_runs_chunked(sample_rate) -> None:
    """Dense = chunked (several chunks, sub-centers, Partial FC) for a margin defined here."""
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(10, 5, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 23, (10,), generator=generator)
    results = []
    for impl in ("dense", "chunked"):
        torch.manual_seed(0)
        head = marginface.MarginSoftmaxLoss(
            23, 5, _CountedMargin(), impl=impl, chunk_size=4, sub_centers=2,
            dtype=torch.float64, sample_rate=sample_rate,
        )  # fmt: skip
        xi = x.clone().requires_grad_(True)
        torch.manual_seed(1)
        value = head(xi, labels)
        results.append((value, *torch.autograd.grad(value, [xi, head.weight])))
    # by hand, dense, without Partial FC
    if sample_rate == 1.0:
        torch.manual_seed(0)
        weight = marginface.MarginSoftmaxLoss(
            23, 5, _CountedMargin(), sub_centers=2, dtype=torch.float64
        ).weight.detach()
        cosine = (F.normalize(x, dim=1) @ F.normalize(weight, dim=1).t()).view(10, 23, 2).amax(2)
        is_target = F.one_hot(labels, 23).bool()
        shift = 0.1 * ((cosine > 0) & ~is_target).sum(1)
        logits = 8.0 * torch.where(is_target, (cosine - shift[:, None]), cosine)
        torch.testing.assert_close(results[0][0], F.cross_entropy(logits, labels))
    for a, b in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"m0": -0.1}, ValueError, r"m0 must be >= 0, got -0\.1"),
        ({"m1": "0.2"}, TypeError, "m1 must be a real number"),
        ({"t": 0.9}, ValueError, r"t must be >= 1, got 0\.9"),
        ({"a": -0.2}, ValueError, r"a must be >= 0, got -0\.2"),
        ({"margin": 3.5}, ValueError, "margin must be < "),
        ({"policy": "hard"}, ValueError, "policy must be one of"),
        ({"scale": float("nan")}, ValueError, "scale must be finite"),
    ],
)
def test_bad_options_are_named(kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        NPCFaceMargin(**kwargs)


def test_prepare_without_the_cosines_says_what_to_call() -> None:
    with pytest.raises(ValueError, match="prepare_with_row_statistics"):
        NPCFaceMargin().prepare(torch.zeros(2), torch.tensor([0, 1]), None)
