"""The sharded head beyond the DDP invariant: checkpoints that reshard (2 → 3, 3 → 1, a plain
torch.save into a sharded head), bad input raised on every rank, and Partial FC sampling."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import marginface

from .harness import run_distributed

C, D = 10, 3


def _trained(name: str, options: dict, group) -> marginface.MarginSoftmaxLoss:
    """A loss whose weight and margin buffers moved away from their initial values."""
    torch.manual_seed(3)
    loss_fn = marginface.create_loss(name, C, D, process_group=group, **options).double()
    with torch.no_grad():
        loss_fn.weight.normal_()
    generator = torch.Generator().manual_seed(5)
    for _ in range(2):
        x = torch.randn(8, D, generator=generator, dtype=torch.float64)
        y = torch.randint(0, C, (8,), generator=generator)
        loss_fn(x, y)  # advances CurricularFace's t, AdaCos's s, SphereFace's iteration...
    return loss_fn


CASES = [("curricularface", {}), ("subcenter-arcface", {"sub_centers": 3}), ("adacos", {})]


def _save_sharded(rank: int, world: int, folder: str) -> None:
    for name, options in CASES:
        loss_fn = _trained(name, options, dist.group.WORLD)
        dcp.save(loss_fn.state_dict(), checkpoint_id=f"{folder}/{name}")
        full = [torch.empty(0)] * world
        dist.all_gather_object(full, loss_fn.weight.detach())
        if rank == 0:
            torch.save(
                {"weight": torch.cat(full), "margin": loss_fn.margin.state_dict()},
                f"{folder}/{name}.expected.pt",
            )


def _load_sharded(rank: int, world: int, folder: str) -> None:
    for name, options in CASES:
        expected = torch.load(f"{folder}/{name}.expected.pt", weights_only=True)
        loss_fn = marginface.create_loss(
            name, C, D, process_group=dist.group.WORLD, **options
        ).double()
        state = loss_fn.state_dict()
        dcp.load(state, checkpoint_id=f"{folder}/{name}")
        loss_fn.load_state_dict(state)
        start, stop = loss_fn.class_range
        k = loss_fn.sub_centers
        assert torch.equal(loss_fn.weight.detach(), expected["weight"][start * k : stop * k])
        for key, value in expected["margin"].items():
            assert torch.equal(loss_fn.margin.state_dict()[key], value), (name, key)


def test_a_checkpoint_saved_at_2_ranks_loads_at_3_and_into_one_unsharded_process(tmp_path):
    run_distributed(_save_sharded, 2, str(tmp_path))
    run_distributed(_load_sharded, 3, str(tmp_path))
    for name, options in CASES:  # no process group at all
        expected = torch.load(tmp_path / f"{name}.expected.pt", weights_only=True)
        loss_fn = marginface.create_loss(name, C, D, **options).double()
        dcp.load(
            marginface.reshardable_state_dict(loss_fn), checkpoint_id=tmp_path / name, no_dist=True
        )
        assert torch.equal(loss_fn.weight.detach(), expected["weight"]), name
        for key, value in expected["margin"].items():
            assert torch.equal(loss_fn.margin.state_dict()[key], value), (name, key)


def _save_three(rank: int, world: int, folder: str) -> None:
    _save_sharded(rank, world, folder)


def test_a_checkpoint_saved_at_3_ranks_loads_unsharded(tmp_path):
    run_distributed(_save_three, 3, str(tmp_path))
    name, options = CASES[1]
    expected = torch.load(tmp_path / f"{name}.expected.pt", weights_only=True)
    loss_fn = marginface.create_loss(name, C, D, **options).double()
    dcp.load(
        marginface.reshardable_state_dict(loss_fn), checkpoint_id=tmp_path / name, no_dist=True
    )
    assert torch.equal(loss_fn.weight.detach(), expected["weight"])


def _load_plain(rank: int, world: int, path: str) -> None:
    saved = torch.load(path, weights_only=True)
    loss_fn = marginface.create_loss(
        "subcenter-arcface", C, D, sub_centers=2, process_group=dist.group.WORLD
    )
    loss_fn.load_state_dict(saved)
    start, stop = loss_fn.class_range
    assert torch.equal(loss_fn.weight.detach(), saved["weight"][start * 2 : stop * 2])


def test_a_plain_torch_save_of_an_unsharded_loss_loads_into_a_sharded_one(tmp_path):
    loss_fn = marginface.create_loss("subcenter-arcface", C, D, sub_centers=2)
    torch.save(loss_fn.state_dict(), tmp_path / "plain.pt")
    run_distributed(_load_plain, 3, str(tmp_path / "plain.pt"))


# ------------------------------------------------------------------ bad input, every rank
def _expect_everywhere(error: type, pattern: str, build) -> None:
    with pytest.raises(error, match=pattern):
        build()


def _bad_inputs(rank: int, world: int) -> None:
    group = dist.group.WORLD
    if world >= 3:
        _expect_everywhere(
            ValueError,
            rf"num_classes = 2 is smaller than the world size {world}",
            lambda: marginface.ArcFaceLoss(2, D, process_group=group),
        )
    _expect_everywhere(
        ValueError,
        r"the ranks build different heads \(num_classes: rank 0: 10, rank 1: 11",
        lambda: marginface.ArcFaceLoss(10 + min(rank, 1), D, process_group=group),
    )
    _expect_everywhere(
        ValueError,
        r"embedding_dim: rank 0: 3, rank 1: 4",
        lambda: marginface.ArcFaceLoss(C, D + min(rank, 1), process_group=group),
    )
    _expect_everywhere(
        ValueError,
        r"margin options: rank 0: .margin=0\.5.*rank 1: .margin=0\.3",
        lambda: marginface.ArcFaceLoss(C, D, margin=0.5 - 0.2 * min(rank, 1), process_group=group),
    )
    _expect_everywhere(
        ValueError,
        r"sample_rate must be <= 1, got 1.5",
        lambda: marginface.ArcFaceLoss(C, D, sample_rate=1.5, process_group=group),
    )
    _expect_everywhere(
        ValueError,
        r"sample_rate must be > 0, got 0",
        lambda: marginface.ArcFaceLoss(C, D, sample_rate=0, process_group=group),
    )
    loss_fn = marginface.ArcFaceLoss(C, D, process_group=group)
    x, y = torch.randn(4, D), torch.tensor([0, 1, 2, 3])
    bad = y.clone()
    if rank == world - 1:
        bad[2] = 12
    _expect_everywhere(
        ValueError,
        rf"rank {world - 1}: labels must lie in \[0, 9\].*got 12",
        lambda: loss_fn(x, bad),
    )
    wide = torch.randn(4, D + 1) if rank == 1 else x
    _expect_everywhere(
        ValueError,
        r"same width D on every rank \(rank 0: D = 3, rank 1: D = 4",
        lambda: loss_fn(wide, y),
    )
    double = x.double() if rank == 0 else x
    _expect_everywhere(
        TypeError,
        r"same dtype on every rank \(rank 0: torch.float64, rank 1: torch.float32",
        lambda: loss_fn(double, y),
    )
    poisoned = x.clone()
    if rank == 1:
        poisoned[0, 0] = float("nan")
    _expect_everywhere(
        ValueError, r"rank 1: embeddings contain non-finite", lambda: loss_fn(poisoned, y)
    )
    loss = loss_fn(x, y)  # the group is still usable after every refusal
    assert torch.isfinite(loss)


@pytest.mark.parametrize("world", [2, 3])
def test_bad_input_raises_the_same_error_on_every_rank(world):
    run_distributed(_bad_inputs, world)


# ------------------------------------------------------------------ Partial FC
def _check_sampling(loss_fn, x, y, rate, global_labels=None):
    """One step; returns the gradient of the weight, checking the sampling rule (the
    positives are those of ``global_labels``, default ``y``)."""
    start, stop = loss_fn.class_range
    k = loss_fn.sub_centers
    loss_fn.weight.grad = None
    loss_fn(x, y).backward()
    grad = loss_fn.weight.grad.view(stop - start, k, -1)
    touched = grad.abs().sum(dim=(1, 2)) > 0  # (c,)
    every = y if global_labels is None else global_labels
    positives = torch.unique(every[(every >= start) & (every < stop)]) - start
    assert touched[positives].all(), "a positive class was not sampled"
    keep = int(rate * (stop - start))
    assert int(touched.sum()) <= max(keep, len(positives))
    return grad, touched


def test_sample_rate_one_is_the_full_head_and_below_one_keeps_every_positive():
    torch.manual_seed(0)
    full = marginface.create_loss("cosface", 40, D)
    sampled = marginface.create_loss("cosface", 40, D, sample_rate=1.0)
    sampled.load_state_dict(full.state_dict())
    x, y = torch.randn(12, D, requires_grad=True), torch.randint(0, 40, (12,))
    torch.testing.assert_close(full(x, y), sampled(x, y), rtol=0, atol=0)
    partial = marginface.create_loss("cosface", 40, D, sample_rate=0.25, sub_centers=2)
    for _ in range(5):
        y = torch.randint(0, 40, (12,))
        grad, touched = _check_sampling(partial, x, y, 0.25)
        assert (grad[~touched] == 0).all()  # exactly zero, not small
        assert int(touched.sum()) == max(10, len(torch.unique(y)))
    partial.eval()  # evaluation uses every class
    partial.weight.grad = None
    partial(x, y).backward()
    assert (partial.weight.grad.view(40, 2, D).abs().sum(dim=(1, 2)) > 0).sum() > 10


def _partial_fc(rank: int, world: int) -> None:
    torch.manual_seed(rank)
    loss_fn = marginface.create_loss(
        "arcface", 40, D, sample_rate=0.2, process_group=dist.group.WORLD
    )
    generator = torch.Generator().manual_seed(9)
    for _ in range(4):
        x = torch.randn(6 * world, D, generator=generator)
        y = torch.randint(0, 40, (6 * world,), generator=generator)
        mine = slice(6 * rank, 6 * rank + 6)
        _check_sampling(loss_fn, x[mine], y[mine], 0.2, y)  # positives of the *global* batch


def test_partial_fc_keeps_the_positives_of_the_global_batch_on_every_rank():
    run_distributed(_partial_fc, 2)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_what_optimizers_do_to_unsampled_rows(optimizer):
    """Documented in docs/distributed.md: an unsampled row has a zero gradient, yet SGD's
    momentum and weight decay, and AdamW's moments and decoupled decay, still move it."""
    torch.manual_seed(0)
    loss_fn = marginface.create_loss("arcface", 30, D, sample_rate=0.1)
    if optimizer == "sgd":
        opt = torch.optim.SGD(loss_fn.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)
    else:
        opt = torch.optim.AdamW(loss_fn.parameters(), lr=0.1, weight_decay=1e-2)
    x = torch.randn(2, D)
    opt.zero_grad()
    loss_fn(x, torch.tensor([0, 1])).backward()  # classes 0, 1 sampled: 2 positives + 1 drawn
    opt.step()
    before = loss_fn.weight.detach().clone()
    state = {k: v.clone() for k, v in opt.state[loss_fn.weight].items()}
    opt.zero_grad()
    loss_fn(x, torch.tensor([5, 6])).backward()
    grad = loss_fn.weight.grad
    row = 0 if grad[0].abs().sum() == 0 else 1  # a row sampled before, not now
    assert grad[row].abs().sum() == 0
    opt.step()
    after = loss_fn.weight.detach()[row]
    w = before[row]
    if optimizer == "sgd":  # buf = 0.9·buf + (0 + wd·w); w -= lr·buf
        buf = 0.9 * state["momentum_buffer"][row] + 1e-2 * w
        expected = w - 0.1 * buf
    else:  # w *= 1 - lr·wd; m, v decay; w -= lr·m̂/(√v̂ + eps)
        m = 0.9 * state["exp_avg"][row]
        v = 0.999 * state["exp_avg_sq"][row]
        step = 2
        m_hat, v_hat = m / (1 - 0.9**step), v / (1 - 0.999**step)
        expected = w * (1 - 0.1 * 1e-2) - 0.1 * m_hat / (v_hat.sqrt() + 1e-8)
    torch.testing.assert_close(after, expected)
    assert not torch.equal(after, w)  # it moved although it was not sampled
