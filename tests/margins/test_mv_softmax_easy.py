"""MV-AM-Softmax's ``conditional="easy"``: the MV-Softmax authors' own code
(xiaoboCASIA/SV-X-Softmax ``fc_layers.py``, ``fc_type='MV-AM'``, ``easy_margin=True``, the
default there) subtracts the margin only where ``cos θ_y > 0``. Its computation restated in
float64 (nothing copied), the loss and both gradients against ours; chunked equals dense;
gradcheck; compiled equals eager; the option's errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import marginface
from marginface.functional import margin_cross_entropy
from marginface.margins import MVAMSoftmaxMargin
from marginface.margins.mv_softmax import MV_CONDITIONS, am_target

N, C, D = 16, 11, 6
M, S, T = 0.35, 32.0, 0.2  # SV-X-Softmax's defaults: margin 0.35, scale 32, t 0.2


def sv_x_mv_am_loss(x: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """SV-X-Softmax's MV-AM head with ``easy_margin=True``, then mean cross-entropy.

    Its caller passes L2-normalized embeddings (the head itself does not normalize ``x``);
    ``centers`` is ``Tensor[C, D]`` (their ``(D, C)`` weight transposed), normalized per class.
    Cosines clamped to [-1, 1]; ``gt = cos θ_y``; non-targets with ``cos θ_j > gt - m`` become
    ``(t + 1)·cos θ_j + t``; the target becomes ``gt - m`` where ``gt > 0``, else ``gt``;
    everything times ``s``.
    """
    cos_theta = (F.normalize(x, dim=1) @ F.normalize(centers, dim=1).t()).clamp(-1.0, 1.0)
    gt = cos_theta.gather(1, labels[:, None])  # (N, 1)
    hard = cos_theta > gt - M
    reweighted = torch.where(hard, (T + 1.0) * cos_theta + T, cos_theta)
    final_gt = torch.where(gt > 0, gt - M, gt)
    logits = reweighted.scatter(1, labels[:, None], final_gt) * S
    return F.cross_entropy(logits, labels)


def _batch(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(C, D, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, C, (N,), generator=generator)
    # embeddings near their class's center, at varied distances: target cosines from about
    # -0.9 to 0.95, so rows fall in each of the three regions (<= 0, (0, m], > m)
    unit = F.normalize(centers, dim=1)[labels]
    noise = torch.randn(N, D, generator=generator, dtype=torch.float64)
    pull = torch.linspace(-1.5, 3.0, N, dtype=torch.float64)[:, None]
    x = (pull * unit + noise) * 4.0
    return x, centers, labels


def _target_cosines(x, centers, labels) -> torch.Tensor:
    cosine = F.normalize(x, dim=1) @ F.normalize(centers, dim=1).t()
    return cosine.gather(1, labels[:, None]).squeeze(1)


def test_the_batch_has_rows_in_every_region() -> None:
    """The comparison below can tell the three conditions apart only with rows where
    ``cos θ_y <= 0`` (easy and True keep the cosine, False subtracts m) and where
    ``0 < cos θ_y <= m`` (easy subtracts m, True does not)."""
    cos_y = _target_cosines(*_batch())
    assert int((cos_y <= 0).sum()) >= 2
    assert int(((cos_y > 0) & (cos_y <= M)).sum()) >= 2
    assert int((cos_y > M).sum()) >= 2


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_the_authors_code_is_reproduced(impl: str) -> None:
    """``MVAMSoftmaxLoss(C, D, t=0.2, conditional="easy")`` equals SV-X-Softmax's MV-AM head:
    loss, ∂x, ∂W over three SGD steps on the centers, in float64."""
    x, centers, labels = _batch()
    options = {"chunk_size": 4} if impl == "chunked" else {}
    loss_fn = marginface.MVAMSoftmaxLoss(
        C, D, M, S, t=T, conditional="easy", impl=impl, dtype=torch.float64, **options
    )
    reference_centers = centers.clone()
    with torch.no_grad():
        loss_fn.weight.copy_(centers)
    for _ in range(3):
        ours_x = x.clone().requires_grad_(True)
        ours = loss_fn(ours_x, labels)
        ours.backward()
        ref_x = x.clone().requires_grad_(True)
        ref_w = reference_centers.clone().requires_grad_(True)
        reference = sv_x_mv_am_loss(ref_x, ref_w, labels)
        reference.backward()
        assert abs(float(ours.detach()) - float(reference.detach())) <= 1e-10
        assert torch.allclose(ours_x.grad, ref_x.grad, rtol=0, atol=1e-10)
        assert torch.allclose(loss_fn.weight.grad, ref_w.grad, rtol=0, atol=1e-10)
        with torch.no_grad():
            loss_fn.weight -= 0.5 * loss_fn.weight.grad
            reference_centers -= 0.5 * ref_w.grad
        loss_fn.weight.grad = None


@pytest.mark.parametrize("conditional", [True, False])
def test_the_other_conditions_differ_from_the_authors_code(conditional: bool) -> None:
    """Neither FaceX-Zoo's condition nor the paper's reproduces SV-X on this batch."""
    x, centers, labels = _batch()
    loss_fn = marginface.MVAMSoftmaxLoss(
        C, D, M, S, t=T, conditional=conditional, dtype=torch.float64
    )
    with torch.no_grad():
        loss_fn.weight.copy_(centers)
    assert abs(float(loss_fn(x, labels)) - float(sv_x_mv_am_loss(x, centers, labels))) > 1e-3


def test_am_target_by_region() -> None:
    cos = torch.tensor([-0.5, 0.0, 0.2, 0.35, 0.36, 0.9], dtype=torch.float64)
    shifted = cos - M
    assert torch.equal(am_target(cos, M, "easy"), torch.where(cos > 0, shifted, cos))
    assert torch.equal(am_target(cos, M, True), torch.where(cos > M, shifted, cos))
    assert torch.equal(am_target(cos, M, False), shifted)


def test_chunked_equals_dense_on_random_batches() -> None:
    for seed in range(3):
        x, centers, labels = _batch(seed)
        results = []
        for impl, options in (("dense", {}), ("chunked", {"chunk_size": 3})):
            loss_fn = marginface.MVAMSoftmaxLoss(
                C, D, conditional="easy", impl=impl, dtype=torch.float64, **options
            )
            with torch.no_grad():
                loss_fn.weight.copy_(centers)
            leaf = x.clone().requires_grad_(True)
            loss = loss_fn(leaf, labels)
            loss.backward()
            results.append((loss.detach(), leaf.grad, loss_fn.weight.grad))
        for dense, chunked in zip(*results, strict=True):
            assert torch.allclose(chunked, dense, rtol=0, atol=1e-12)


def test_gradcheck_on_the_cosines() -> None:
    """float64 gradcheck away from the two kinks (``cos θ_y = 0``, and a non-target cosine at
    the mis-classified threshold ``cos θ_y - m``)."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.tensor([0, 1, 2, 3])
    cosine = torch.rand(4, 5, generator=generator, dtype=torch.float64) * 1.6 - 0.8
    cosine[torch.arange(4), labels] = torch.tensor([-0.4, 0.15, 0.3, 0.7], dtype=torch.float64)
    threshold = cosine[torch.arange(4), labels][:, None] - M
    assert float((cosine - threshold).abs().min()) > 1e-3
    margin = MVAMSoftmaxMargin(M, S, t=T, conditional="easy")

    def loss(c: torch.Tensor) -> torch.Tensor:
        return margin_cross_entropy(c, labels, margin, reduction="none")

    assert torch.autograd.gradcheck(loss, (cosine.requires_grad_(True),))


@pytest.mark.parametrize("impl", ["chunked", "dense"])
def test_compiled_equals_eager(impl: str) -> None:
    """``torch.compile`` (aot_eager, fullgraph: the chunked executor's custom ops) equals
    eager with the option set."""
    torch._dynamo.reset()
    x, centers, labels = _batch()
    x, centers = x.float(), centers.float()
    options = {"chunk_size": 4} if impl == "chunked" else {}
    results = []
    for compiled in (False, True):
        loss_fn = marginface.MVAMSoftmaxLoss(C, D, conditional="easy", impl=impl, **options)
        with torch.no_grad():
            loss_fn.weight.copy_(centers)
        call = torch.compile(loss_fn, backend="aot_eager", fullgraph=True) if compiled else loss_fn
        leaf = x.clone().requires_grad_(True)
        loss = call(leaf, labels)
        loss.backward()
        results.append((loss.detach(), leaf.grad, loss_fn.weight.grad))
    torch._dynamo.reset()
    for eager, compiled in zip(*results, strict=True):
        scale = float(eager.abs().max())
        assert float((compiled - eager).abs().max()) <= 1e-5 * scale


def test_options_read_back() -> None:
    assert MV_CONDITIONS == (True, False, "easy")
    margin = MVAMSoftmaxMargin(conditional="easy")
    assert margin.conditional == "easy"
    assert "conditional='easy'" in repr(margin)
    assert "conditional" not in repr(MVAMSoftmaxMargin())
    loss = marginface.create_loss("mv-am-softmax", 4, 3, conditional="easy")
    assert loss.margin.conditional == "easy"


@pytest.mark.parametrize(
    ("value", "error", "pattern"),
    [
        ("hard", ValueError, r"conditional must be True, False or 'easy'.*got 'hard'"),
        ("Easy", ValueError, r"got 'Easy'"),
        (1, TypeError, r"conditional must be a bool or 'easy', got 1"),
        (None, TypeError, r"got None"),
    ],
)
def test_a_bad_condition_is_named(value: object, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        MVAMSoftmaxMargin(conditional=value)
