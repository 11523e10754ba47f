"""The class-sharded head on 2 and 3 gloo processes: DDP + any optimizer gives exactly what one
process gives on the concatenated batch, for every registered loss."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import marginface

from .harness import run_distributed

NUM_CLASSES, DIM, IN_FEATURES = 11, 4, 6
# local batch sizes per step: uneven, and changing between steps (a rank may hold 0 rows)
BATCHES = {2: [[5, 3], [2, 6], [4, 4]], 3: [[4, 1, 3], [0, 5, 2], [3, 3, 3]]}
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5}


def _options(name: str) -> dict:
    options: dict = {"chunk_size": 3, "impl": "chunked"}
    if name == "elasticface":
        options["seed"] = 7
    if name == "subcenter-arcface":
        options["sub_centers"] = 2
    return options


def _data(step: int, sizes: list[int], dtype: torch.dtype):
    generator = torch.Generator().manual_seed(100 + step)
    total = sum(sizes)
    inputs = torch.randn(total, IN_FEATURES, generator=generator, dtype=dtype) * 3
    labels = torch.randint(0, NUM_CLASSES, (total,), generator=generator)
    return inputs, labels


def _optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)


def _train(rank: int, world: int, loss_name: str, dtype, optimizer_name: str, group):
    """Three steps; returns (backbone state, full loss state, losses)."""
    torch.manual_seed(0)
    backbone = nn.Linear(IN_FEATURES, DIM).to(dtype)
    reference_loss = marginface.create_loss(loss_name, NUM_CLASSES, DIM, **_options(loss_name))
    reference_loss = reference_loss.to(dtype)
    with torch.no_grad():  # unit-scale centers: a well-conditioned float32 comparison
        reference_loss.weight.normal_()
    initial = {k: v.clone() for k, v in reference_loss.state_dict().items()}
    if group is None:
        model, loss_fn = backbone, reference_loss
    else:
        model = DistributedDataParallel(backbone, process_group=group)
        loss_fn = marginface.create_loss(
            loss_name, NUM_CLASSES, DIM, process_group=group, **_options(loss_name)
        ).to(dtype)
        loss_fn.load_state_dict(initial)  # the full weight is cut to this rank's block
    optimizer = _optimizer(optimizer_name, list(model.parameters()) + list(loss_fn.parameters()))
    values = []
    for step, sizes in enumerate(BATCHES[world]):
        inputs, labels = _data(step, sizes, dtype)
        if group is not None:
            mine = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
            inputs, labels = inputs[mine], labels[mine]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        values.append(loss.detach().clone())
    return backbone.state_dict(), loss_fn, values


def _close(actual, expected, tolerance, what):
    difference = (actual.double() - expected.double()).abs()
    allowed = tolerance * (1 + expected.double().abs())
    worst = float((difference / allowed).max()) if difference.numel() else 0.0
    assert worst <= 1.0, f"{what}: max |difference| {float(difference.max()):.3g} " + (
        f"({worst:.3g} × the tolerance {tolerance:g}·(1 + |expected|))"
    )


def _check_invariant(rank: int, world: int, loss_names: list[str], optimizer_name: str) -> None:
    group = dist.group.WORLD
    for dtype in (torch.float64, torch.float32):
        tolerance = TOLERANCE[dtype]
        for name in loss_names:
            expected_backbone, expected_loss, expected_values = _train(
                rank, world, name, dtype, optimizer_name, None
            )
            backbone, loss_fn, values = _train(rank, world, name, dtype, optimizer_name, group)
            what = f"{name} {dtype} {optimizer_name} rank {rank}"
            for step, (a, e) in enumerate(zip(values, expected_values, strict=True)):
                _close(a, e, tolerance, f"{what} loss of step {step}")
            for key, value in expected_backbone.items():
                _close(backbone[key], value, tolerance, f"{what} backbone {key}")
            start, stop = loss_fn.class_range
            k = loss_fn.sub_centers
            expected_block = expected_loss.weight.detach()[start * k : stop * k]
            _close(loss_fn.weight.detach(), expected_block, tolerance, f"{what} weight")
            for key, buffer in expected_loss.margin.state_dict().items():
                _close(loss_fn.margin.state_dict()[key], buffer, tolerance, f"{what} {key}")


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_with_a_sharded_head_equals_one_process_for_every_loss(world):
    run_distributed(_check_invariant, world, marginface.list_losses(), "sgd", deadline_s=240)


def test_the_invariant_holds_with_adamw():
    run_distributed(_check_invariant, 2, ["arcface", "magface", "adacos"], "adamw")
