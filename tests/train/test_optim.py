"""Schedules and optimizers."""

from __future__ import annotations

import math

import pytest
import torch

from marginface.train import build_optimizer, build_scheduler, lr_factor


def test_warmup_then_cosine_reaches_zero():
    kw = {"total_steps": 100, "steps_per_epoch": 10, "schedule": "cosine", "warmup_steps": 10}
    assert lr_factor(0, **kw) == pytest.approx(0.1)
    assert lr_factor(9, **kw) == pytest.approx(1.0)
    assert lr_factor(10, **kw) == pytest.approx(1.0)
    assert lr_factor(55, **kw) == pytest.approx(0.5)
    assert lr_factor(100, **kw) == pytest.approx(0.0, abs=1e-12)


def test_step_schedule_multiplies_by_gamma_every_step_epochs():
    kw = {"total_steps": 100, "steps_per_epoch": 10, "schedule": "step", "step_epochs": 3}
    assert lr_factor(29, **kw, gamma=0.5) == 1.0
    assert lr_factor(30, **kw, gamma=0.5) == 0.5
    assert lr_factor(60, **kw, gamma=0.5) == 0.25


def test_scheduler_drives_the_optimizer():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([param], "sgd", lr=1.0)
    sched = build_scheduler(opt, schedule="cosine", epochs=2, steps_per_epoch=5)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == 1.0
    assert lrs[5] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_optimizers(name):
    param = torch.nn.Parameter(torch.ones(2))
    assert build_optimizer([param], name, lr=0.1).param_groups[0]["lr"] == 0.1


def test_optimizer_classes_and_options():
    param = torch.nn.Parameter(torch.ones(2))
    adam = build_optimizer([param], "adam", lr=0.1, weight_decay=0.01)
    adamw = build_optimizer([param], "adamw", lr=0.1, weight_decay=0.01)
    sgd = build_optimizer([param], "sgd", lr=0.1, weight_decay=0.01, momentum=0.8)
    # exact types: torch's AdamW subclasses Adam, so isinstance would not tell them apart
    assert type(adam) is torch.optim.Adam and type(adamw) is torch.optim.AdamW
    assert type(sgd) is torch.optim.SGD
    assert sgd.param_groups[0]["momentum"] == 0.8 and not sgd.param_groups[0]["nesterov"]
    for optimizer in (adam, adamw, sgd):
        assert optimizer.param_groups[0]["weight_decay"] == 0.01


def reference_steps(name: str, p: float, grad: float, *, lr: float, wd: float, mu: float) -> float:
    """Three steps of ``name`` on one parameter with a constant loss gradient ``grad``, by hand:
    Adam and SGD add the L2 term ``wd·p`` to the gradient; AdamW decays ``p`` by ``1 - lr·wd``
    before its Adam step (Loshchilov & Hutter's decoupled weight decay); SGD uses momentum
    ``mu`` (PyTorch's form: the first buffer is the gradient, no dampening)."""
    m = v = buf = 0.0
    for t in (1, 2, 3):
        g = grad
        if name == "adamw":
            p *= 1.0 - lr * wd
        else:
            g = grad + wd * p
        if name == "sgd":
            buf = g if t == 1 else mu * buf + g
            p -= lr * buf
        else:
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            p -= lr * (m / (1 - 0.9**t)) / (math.sqrt(v / (1 - 0.999**t)) + 1e-8)
    return p


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_optimizer_steps_match_the_hand_computation(name):
    """Swapping Adam and AdamW (L2 vs decoupled decay) or dropping SGD's momentum fails."""
    options = {"lr": 0.1, "wd": 0.2, "mu": 0.9}
    param = torch.nn.Parameter(torch.tensor([2.0], dtype=torch.float64))
    optimizer = build_optimizer(
        [param], name, lr=0.1, weight_decay=options["wd"], momentum=options["mu"]
    )
    for _ in range(3):
        param.grad = torch.tensor([0.5], dtype=torch.float64)
        optimizer.step()
    expected = {n: reference_steps(n, 2.0, 0.5, **options) for n in ("adam", "adamw", "sgd")}
    assert float(param.detach()) == pytest.approx(expected[name], rel=1e-9)
    others = [value for other, value in expected.items() if other != name]
    assert all(abs(value - expected[name]) > 1e-3 for value in others)
    no_momentum = reference_steps("sgd", 2.0, 0.5, lr=0.1, wd=0.2, mu=0.0)
    assert abs(no_momentum - expected["sgd"]) > 1e-3


def test_unknown_names_list_the_valid_ones():
    param = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="adam, adamw, sgd"):
        build_optimizer([param], "lamb", lr=0.1)
    with pytest.raises(ValueError, match="constant, cosine, step"):
        lr_factor(0, total_steps=1, steps_per_epoch=1, schedule="poly")
