"""Partial FC on 2 gloo ranks, the sampled rows read in place: each rank's step equals the
formulation the head used before (the sample copied out of the shard, then the executor), and
the dense path on the concatenation of every rank's sampled classes, in float64 to 1e-12
(relative, for the dense path's weight gradient)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

import marginface
from marginface.executors.chunked import sharded_margin_cross_entropy
from marginface.executors.dense import dense_margin_cross_entropy

from .harness import run_distributed

C, D = 61, 5  # blocks of 31 and 30 classes
SIZES = [5, 3]  # uneven local batches
RATE = 0.5  # 15 classes kept per rank: more than the global batch's 8 positives
ATOL = 1e-12


def _materialized_sample(head, global_labels: torch.Tensor) -> torch.Tensor:
    """The head's draw, written out as it was before (same rule, same random numbers)."""
    start, stop = head.class_range
    count = stop - start
    owned = (global_labels >= start) & (global_labels < stop)
    positive = torch.zeros(count, dtype=torch.bool)
    positive[global_labels[owned] - start] = True
    keep = int(RATE * count)
    assert int(positive.sum()) < keep  # negatives are drawn too
    score = torch.rand(count)
    score[positive] = 2.0
    return score.topk(keep).indices.sort().values  # (S,)


def _check(rank: int, world: int, name: str) -> None:
    group = dist.group.WORLD
    options = {"sub_centers": 2} if name == "subcenter-arcface" else {}
    torch.manual_seed(11)  # the same initial full weight on every rank
    full = marginface.create_loss(name, C, D, dtype=torch.float64, **options)
    head = marginface.create_loss(
        name, C, D, dtype=torch.float64, process_group=group, sample_rate=RATE, chunk_size=4,
        **options,
    )  # fmt: skip
    head.load_state_dict(full.state_dict())
    k = head.sub_centers
    margin = copy.deepcopy(head.margin)  # before the step updates its state
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(sum(SIZES), D, generator=generator, dtype=torch.float64) * 4
    labels = torch.randint(0, C, (sum(SIZES),), generator=generator)
    mine = slice(sum(SIZES[:rank]), sum(SIZES[: rank + 1]))
    upstream = torch.rand(sum(SIZES), generator=generator, dtype=torch.float64)

    torch.manual_seed(100 + rank)  # each rank draws its own negatives
    state = torch.get_rng_state()
    head.reduction = "none"
    x_head = x[mine].clone().requires_grad_(True)
    loss = head(x_head, labels[mine])  # (N,), the global batch's
    (loss * upstream).sum().backward()

    # 1. The materialized formulation, on the same draw.
    torch.set_rng_state(state)
    selected = _materialized_sample(head, labels)
    start, stop = head.class_range
    owned = (labels >= start) & (labels < stop)
    local = (labels - start).clamp(0, stop - start - 1)
    targets = torch.where(owned, torch.searchsorted(selected, local), -1)
    weight = head.weight.detach().clone().requires_grad_(True)
    rows = weight.view(-1, k, D)[selected].reshape(-1, D)  # (S·K, D), the copy
    x_ref = x[mine].clone().requires_grad_(True)
    shard = copy.copy(head.shard)
    shard.gather_metadata(x_ref, labels[mine], C)
    expected = sharded_margin_cross_entropy(
        marginface.executors.sharding.scale_gradient(x_ref, world), rows, targets, labels,
        copy.deepcopy(margin), shard, sub_centers=k, chunk_size=4,
    )  # fmt: skip
    (expected * upstream).sum().backward()
    torch.testing.assert_close(loss.detach(), expected.detach(), rtol=0, atol=ATOL)
    torch.testing.assert_close(x_head.grad, x_ref.grad, rtol=0, atol=ATOL)
    torch.testing.assert_close(head.weight.grad, weight.grad, rtol=0, atol=ATOL)
    outside = torch.ones(stop - start, dtype=torch.bool)
    outside[selected] = False
    assert (head.weight.grad.view(-1, k, D)[outside] == 0).all()

    # 2. The dense path on every rank's sampled classes, concatenated in rank order.
    counts = [torch.zeros((), dtype=torch.int64) for _ in range(world)]
    dist.all_gather(counts, torch.tensor(selected.numel()))
    largest = int(max(counts))
    padded = torch.zeros(largest, dtype=torch.int64)
    padded[: selected.numel()] = selected + start
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    classes = torch.cat([p[: int(n)] for p, n in zip(parts, counts, strict=True)])  # (ΣS,)
    global_targets = torch.searchsorted(classes, labels)  # every label was sampled
    assert torch.equal(classes[global_targets], labels)
    centers = full.weight.detach().view(C, k, D)[classes].reshape(-1, D).requires_grad_(True)
    x_dense = x.clone().requires_grad_(True)
    dense = dense_margin_cross_entropy(x_dense, centers, global_targets, margin, sub_centers=k)
    (dense * upstream).sum().backward()
    torch.testing.assert_close(loss.detach(), dense.detach(), rtol=0, atol=ATOL)
    # the head multiplies the embeddings' gradient by W for DDP's averaging
    torch.testing.assert_close(x_head.grad, world * x_dense.grad[mine], rtol=0, atol=ATOL)
    offset = sum(int(n) for n in counts[:rank])
    mine_rows = centers.grad.view(-1, k, D)[offset : offset + selected.numel()]
    # (centers of norm ~0.01: gradients ~1e3, so relative to them)
    torch.testing.assert_close(
        head.weight.grad.view(-1, k, D)[selected], mine_rows, rtol=ATOL, atol=ATOL
    )


def _check_all(rank: int, world: int) -> None:
    for name in ("arcface", "subcenter-arcface", "curricularface"):  # one group: one spawn
        _check(rank, world, name)


def test_partial_fc_in_place_matches_the_copy_and_dense_on_2_ranks() -> None:
    run_distributed(_check_all, 2)
