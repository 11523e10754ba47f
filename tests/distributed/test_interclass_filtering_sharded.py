"""Inter-class filtering on the class-sharded head (2 gloo processes), with and without
Partial FC's class sampling: the global loss and every rank's gradients equal insightface's
computation (tests/_insightface_reference.py) on the whole batch, in float64."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import marginface

from .._insightface_reference import insightface_loss
from .harness import run_distributed

THRESHOLD = 0.3
C, D = 8, 5
SIZES = [4, 3]  # local batch sizes of the two ranks
ARC = {"margin": 0.5, "policy": "none", "gradient": "straight_through"}


def _data():
    generator = torch.Generator().manual_seed(12)
    weight = torch.randn(C, D, generator=generator, dtype=torch.float64)
    labels = torch.tensor([0, 1, 5, 6, 1, 4, 6])  # positives: 0, 1 | 4, 5, 6 on ranks 0 | 1
    other = (labels + 3) % C
    x = weight[labels] + 0.9 * weight[other]
    x = (x + 0.3 * torch.randn(x.shape, generator=generator, dtype=torch.float64)) * 4.0
    return x, weight, labels


def _reference(x, weight, labels, columns):
    """insightface's loss over the classes ``columns`` (Partial FC's sample: every positive
    is among them), and its gradients in x and the full weight."""
    x = x.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    cosine = F.normalize(x) @ F.normalize(w[columns]).t()  # (N, S)
    position = {int(c): i for i, c in enumerate(columns)}
    targets = torch.tensor([position[int(y)] for y in labels])
    loss = insightface_loss(
        cosine, targets, s=64.0, m1=1.0, m2=0.5, m3=0.0, interclass_filtering_threshold=THRESHOLD
    ).mean()
    loss.backward()
    return loss.detach(), x.grad, w.grad


def _check(rank: int, world: int, sample_rate: float) -> None:
    x, weight, labels = _data()
    columns = torch.arange(C) if sample_rate == 1.0 else torch.unique(labels)
    expected_loss, expected_x, expected_w = _reference(x, weight, labels, columns)
    cosine = F.normalize(x) @ F.normalize(weight).t()
    above = (cosine > THRESHOLD).sum() - (cosine.gather(1, labels[:, None]) > THRESHOLD).sum()
    assert int(above) >= 3  # non-target entries the filter zeroes

    loss_fn = marginface.ArcFaceLoss(
        C,
        D,
        scale=64.0,
        interclass_filtering_threshold=THRESHOLD,
        process_group=dist.group.WORLD,
        sample_rate=sample_rate,
        chunk_size=2,
        dtype=torch.float64,
        **ARC,
    )
    loss_fn.load_state_dict({"weight": weight})  # cut to this rank's block
    start, stop = loss_fn.class_range
    mine = slice(sum(SIZES[:rank]), sum(SIZES[: rank + 1]))
    local_x = x[mine].clone().requires_grad_(True)
    loss = loss_fn(local_x, labels[mine])
    loss.backward()
    torch.testing.assert_close(loss.detach(), expected_loss, rtol=1e-12, atol=1e-12)
    # the backbone's gradient is scaled by W (DistributedDataParallel averages it)
    torch.testing.assert_close(local_x.grad / world, expected_x[mine], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(loss_fn.weight.grad, expected_w[start:stop], rtol=1e-9, atol=1e-12)


def _check_both(rank: int, world: int) -> None:
    for sample_rate in (1.0, 0.5):  # every class; Partial FC keeping only the positives
        _check(rank, world, sample_rate)


def test_sharded_filtering_equals_insightface_with_and_without_class_sampling():
    run_distributed(_check_both, 2)


def test_ranks_with_different_thresholds_are_told():
    run_distributed(_mismatch, 2)


def _mismatch(rank: int, world: int) -> None:
    threshold = 0.3 if rank == 0 else 0.0
    with pytest.raises(ValueError, match="interclass_filtering_threshold=0.3"):
        marginface.ArcFaceLoss(
            C, D, interclass_filtering_threshold=threshold, process_group=dist.group.WORLD
        )
