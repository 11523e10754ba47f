"""The softmax-form losses of FaceX-Zoo / face.evoLVe / OpenSphere (issue 25) on 2 gloo ranks,
in one spawn: the class-sharded head under DDP equals one process (float64 and float32), and
Partial FC (sampled classes read in place) equals the dense path on every rank's sampled
classes (float64, 1e-12). AdaM-Softmax's per-class margins, sharded with the centers, end the
steps equal to one process's block too; with Partial FC, AdaM-Softmax's margins and SphereFace+'s
MHE (terms the head adds) give the formula's loss and gradients on the sampled classes."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

import marginface

from ..margins.test_npcface import _CountedMargin
from .harness import run_distributed
from .test_partial_fc_in_place_sharded import RATE, SIZES, _materialized_sample
from .test_partial_fc_in_place_sharded import C as PFC_C
from .test_partial_fc_in_place_sharded import D as PFC_D
from .test_partial_fc_in_place_sharded import _check as _check_partial_fc
from .test_sharded_head import TOLERANCE, _check_invariant, _close, _train

NEW_LOSSES = [
    "mv-am-softmax", "mv-arc-softmax", "li-arcface", "circle", "arcnegface", "npcface",
    "sphereface-r",
]  # fmt: skip
CLASS_PARAMETER_LOSSES = ["adam-softmax"]


def _check_class_parameters(rank: int, world: int, name: str) -> None:
    """DDP + a sharded head equals one process, the per-class parameters' blocks included."""
    group = dist.group.WORLD
    for dtype in (torch.float64, torch.float32):
        _, expected, expected_values = _train(rank, world, name, dtype, "sgd", None)
        _, sharded, values = _train(rank, world, name, dtype, "sgd", group)
        what = f"{name} {dtype} rank {rank}"
        for step, (a, e) in enumerate(zip(values, expected_values, strict=True)):
            _close(a, e, TOLERANCE[dtype], f"{what} loss of step {step}")
        start, stop = sharded.class_range
        assert sharded.class_parameters.keys() == expected.class_parameters.keys()
        for key, value in expected.class_parameters.items():
            block = sharded.class_parameters[key].detach()
            assert tuple(block.shape) == (stop - start,)
            _close(block, value.detach()[start:stop], TOLERANCE[dtype], f"{what} {key}")
        # the state dict holds the full (C,) vector as a DTensor; a 1-process head loads it
        state = sharded.state_dict()
        full = state["class_parameters.margin"].full_tensor()
        _close(full, expected.class_parameters["margin"].detach(), TOLERANCE[dtype], "saved")


def _expected_adam(xr, weight, margins, classes, targets, labels):
    """The authors' AdaM-Softmax on the union of the sampled classes (margins over all C)."""
    cosine = F.normalize(xr, dim=1) @ F.normalize(weight[classes], dim=1).t()  # (N, ΣS)
    is_target = F.one_hot(targets, classes.numel()).bool()
    logits = 30.0 * torch.where(is_target, cosine - margins[labels].unsqueeze(1), cosine)
    return F.cross_entropy(logits, targets) + 70.0 * (1.0 - margins.mean())


def _expected_sphereface_plus(xr, weight, margins, classes, targets, labels):
    """SphereFace+ on the union of the sampled classes: Δ detached, MHE over the batch's
    distinct classes' normalized centers (pairs a < b)."""
    cosine = F.normalize(xr, dim=1) @ F.normalize(weight[classes], dim=1).t()  # (N, ΣS)
    is_target = F.one_hot(targets, classes.numel()).bool()
    with torch.no_grad():
        m_theta = 1.5 * torch.acos(cosine.clamp(-1 + 1e-5, 1 - 1e-5))
        k = torch.floor(m_theta / torch.pi)
        psi = (1 - 2 * torch.remainder(k, 2)) * torch.cos(m_theta) - 2 * k
    logits = 30.0 * torch.where(is_target, cosine + (psi - cosine).detach(), cosine)
    unit = F.normalize(weight[torch.unique(labels)], dim=1)  # (U, D)
    angles = torch.acos((unit @ unit.t()).clamp(-1 + 1e-5, 1 - 1e-5))
    u = unit.shape[0]
    mhe = torch.triu(angles.pow(-2), diagonal=1).sum() / (u * (u - 1) / 2)
    return F.cross_entropy(logits, targets) + mhe


def _check_head_term_partial_fc(rank: int, world: int, name: str, expected_loss) -> None:
    """Sharded Partial FC with a head-level term (AdaM-Softmax's margins' regularizer,
    SphereFace+'s MHE): loss, ∂x, ∂W (and ∂m) equal the formula on the union of every rank's
    sampled classes, float64."""
    group = dist.group.WORLD
    torch.manual_seed(11)
    full = marginface.create_loss(name, PFC_C, PFC_D, dtype=torch.float64)
    with torch.no_grad():
        full.weight.normal_()  # unit-scale centers: MHE's gradient well conditioned
    head = marginface.create_loss(
        name, PFC_C, PFC_D, dtype=torch.float64, process_group=group,
        sample_rate=RATE, chunk_size=4,
    )  # fmt: skip
    head.load_state_dict(full.state_dict())
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(sum(SIZES), PFC_D, generator=generator, dtype=torch.float64) * 4
    labels = torch.randint(0, PFC_C, (sum(SIZES),), generator=generator)
    mine = slice(sum(SIZES[:rank]), sum(SIZES[: rank + 1]))
    torch.manual_seed(100 + rank)
    state = torch.get_rng_state()
    x_head = x[mine].clone().requires_grad_(True)
    loss = head(x_head, labels[mine])
    loss.backward()

    torch.set_rng_state(state)
    selected = _materialized_sample(head, labels)
    start, stop = head.class_range
    counts = [torch.zeros((), dtype=torch.int64) for _ in range(world)]
    dist.all_gather(counts, torch.tensor(selected.numel()))
    padded = torch.zeros(int(max(counts)), dtype=torch.int64)
    padded[: selected.numel()] = selected + start
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    classes = torch.cat([p[: int(n)] for p, n in zip(parts, counts, strict=True)])  # (ΣS,)
    weight = full.weight.detach().clone().requires_grad_(True)
    margins = None
    if "margin" in full.class_parameters:
        margins = full.class_parameters["margin"].detach().clone().requires_grad_(True)
    xr = x.clone().requires_grad_(True)
    targets = torch.searchsorted(classes, labels)
    expected = expected_loss(xr, weight, margins, classes, targets, labels)
    expected.backward()
    torch.testing.assert_close(loss.detach(), expected.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(x_head.grad, world * xr.grad[mine], rtol=0, atol=1e-12)
    torch.testing.assert_close(head.weight.grad, weight.grad[start:stop], rtol=1e-12, atol=1e-12)
    if margins is not None:
        grad_m = head.class_parameters["margin"].grad
        torch.testing.assert_close(grad_m, margins.grad[start:stop], rtol=0, atol=1e-12)


def _check_row_statistics_margin(rank: int, world: int) -> None:
    """A margin with per-row statistics declared in a test file: the sharded head (each rank's
    sums all-reduced) equals one process, loss, ∂x and the weight's gradient, float64."""
    group = dist.group.WORLD
    torch.manual_seed(0)
    full = marginface.MarginSoftmaxLoss(23, 5, _CountedMargin(), dtype=torch.float64)
    head = marginface.MarginSoftmaxLoss(
        23, 5, _CountedMargin(), dtype=torch.float64, process_group=group, chunk_size=4
    )
    head.load_state_dict(full.state_dict())
    generator = torch.Generator().manual_seed(9)
    x = torch.randn(8, 5, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 23, (8,), generator=generator)
    sizes = [5, 3]
    mine = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
    x_full = x.clone().requires_grad_(True)
    expected = full(x_full, labels)
    expected.backward()
    x_head = x[mine].clone().requires_grad_(True)
    loss = head(x_head, labels[mine])
    loss.backward()
    start, stop = head.class_range
    torch.testing.assert_close(loss.detach(), expected.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(x_head.grad, world * x_full.grad[mine], rtol=0, atol=1e-12)
    torch.testing.assert_close(head.weight.grad, full.weight.grad[start:stop], rtol=0, atol=1e-12)


def _check_all(rank: int, world: int) -> None:
    _check_invariant(rank, world, NEW_LOSSES, "sgd")
    for name in NEW_LOSSES:
        _check_partial_fc(rank, world, name)
    _check_invariant(rank, world, ["sphereface-plus"], "sgd")
    for name in CLASS_PARAMETER_LOSSES:
        _check_class_parameters(rank, world, name)
    _check_head_term_partial_fc(rank, world, "adam-softmax", _expected_adam)
    _check_head_term_partial_fc(rank, world, "sphereface-plus", _expected_sphereface_plus)
    _check_row_statistics_margin(rank, world)


def test_sharded_and_partial_fc_equal_one_process_on_2_ranks() -> None:
    run_distributed(_check_all, 2, deadline_s=240)
