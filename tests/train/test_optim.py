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


def test_unknown_names_list_the_valid_ones():
    param = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="adam, adamw, sgd"):
        build_optimizer([param], "lamb", lr=0.1)
    with pytest.raises(ValueError, match="constant, cosine, step"):
        lr_factor(0, total_steps=1, steps_per_epoch=1, schedule="poly")
