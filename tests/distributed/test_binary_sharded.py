"""The one-vs-all losses (SphereFace2, UniFace) class-sharded over 2 gloo processes equal one
process's dense loss on the concatenated batch: the loss, each rank's rows of ∂x, each rank's
block of ∂W, and ∂b (the replicated bias) complete and identical on every rank. Partial FC on
2 ranks: the non-target sum runs over the union of the ranks' samples, not re-weighted."""

from __future__ import annotations

import torch
import torch.distributed as dist

import marginface
from marginface.executors.margin_loss import binary_cross_entropy

from .harness import run_distributed

C, D = 11, 5
SIZES = [6, 3]  # uneven local batches
CASES = [
    ("sphereface2", {}),
    ("sphereface2-a", {"sub_centers": 2}),
    ("sphereface2-m", {"gradient": "straight_through"}),
    ("uniface", {"clamp_logits": True, "interclass_filtering_threshold": 0.4}),
    ("uniface-a", {"policy": "clip"}),
]


def _data(dtype):
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(sum(SIZES), D, generator=generator, dtype=dtype) * 4
    labels = torch.randint(0, C, (sum(SIZES),), generator=generator)
    return x, labels


def _check(rank: int, world: int) -> None:
    dtype = torch.float64
    x, labels = _data(dtype)
    mine = slice(sum(SIZES[:rank]), sum(SIZES[: rank + 1]))
    for name, options in CASES:
        torch.manual_seed(0)
        single = marginface.create_loss(name, C, D, dtype=dtype, **options)
        state = {k: v.clone() for k, v in single.state_dict().items()}
        xs = x.clone().requires_grad_(True)
        expected = single(xs, labels)
        ex, ew, eb = torch.autograd.grad(expected, [xs, single.weight, single.margin.bias])

        sharded = marginface.create_loss(
            name, C, D, dtype=dtype, process_group=dist.group.WORLD, chunk_size=2, **options
        )
        sharded.load_state_dict(state)
        xr = x[mine].clone().requires_grad_(True)
        value = sharded(xr, labels[mine])
        gx, gw, gb = torch.autograd.grad(value, [xr, sharded.weight, sharded.margin.bias])
        start, stop = sharded.class_range
        k = sharded.sub_centers
        what = f"{name} rank {rank}"
        assert torch.allclose(value, expected, rtol=0, atol=1e-10), what
        # the head scales the local embeddings' gradient by W (DDP averages it back)
        assert torch.allclose(gx / world, ex[mine], rtol=0, atol=1e-10), what
        assert torch.allclose(gw, ew[start * k : stop * k], rtol=0, atol=1e-10), what
        assert torch.allclose(gb, eb, rtol=0, atol=1e-10), (what, float(gb), float(eb))
        every = [torch.zeros_like(gb) for _ in range(world)]
        dist.all_gather(every, gb.contiguous())
        assert all(torch.equal(other, every[0]) for other in every), what

    # Partial FC: each rank samples its own classes; the loss is the dense one-vs-all loss on the
    # union of the samples, the non-target terms not re-weighted.
    torch.manual_seed(0)
    sampled = marginface.create_loss(
        "uniface", C, D, dtype=dtype, process_group=dist.group.WORLD, sample_rate=0.5
    )
    full = marginface.create_loss("uniface", C, D, dtype=dtype)
    torch.manual_seed(0)
    full.reset_parameters()
    sampled.load_state_dict(full.state_dict())
    torch.manual_seed(10 + rank)
    start, stop = sampled.class_range
    global_labels = labels
    _, selection = sampled._classes_of_step(global_labels)  # this rank's draw, replayed below
    torch.manual_seed(10 + rank)
    value = sampled(x[mine], labels[mine])
    classes = (selection + start).contiguous()
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([classes.numel()]))
    padded = torch.full((C,), -1, dtype=torch.int64)
    padded[: classes.numel()] = classes
    gathered = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    union = torch.cat([g[: int(n)] for g, n in zip(gathered, counts, strict=True)])
    assert union.numel() < C  # some classes were left out
    with torch.no_grad():
        logits = full.logits(x, labels)[:, union]  # (N, S): the sampled classes' logits
        positions = (union.unsqueeze(0) == labels.unsqueeze(1)).float().argmax(dim=1)
        expected = binary_cross_entropy(logits, positions, full.margin).mean()
    assert torch.allclose(value.detach(), expected, rtol=0, atol=1e-10), (
        float(value),
        float(expected),
    )


def test_binary_losses_sharded_on_2_ranks_equal_one_process_bias_included() -> None:
    run_distributed(_check, 2, deadline_s=180)
