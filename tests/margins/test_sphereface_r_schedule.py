"""SphereFace-R's stepped margin (OpenSphere ``model/head/spherefacer.py``, ``SphereFaceR_N`` and
``SphereFaceR_S``): their forward counts its calls (``self.iter += 1``) and uses
``m = 1 + dm·len([s for s in steps if s < iter])``. Restated here over 6 steps in float64,
dense and chunked, against ``margin=1, margin_increment=dm, margin_steps=steps``; the
``iteration`` buffer in ``state_dict``; bad inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import marginface
from marginface.margins import SphereFaceRMargin
from marginface.margins.sphereface_r import scheduled_margin

from .._facex_reference import sphereface_r_factor, sphereface_r_loss
from .test_sphereface_r import LR, TOLERANCE, C, D, _batch, _tangent

SCHEDULE_STEPS = 6


class _TheirSchedule:
    """Their ``_N``/``_S`` margin schedule, restated: an iteration counter advanced at each call,
    ``m = 1 + dm·#{s in steps : s < iter}``."""

    def __init__(self, dm: float, steps: list[int], variant: str, kind: str) -> None:
        self.dm, self.steps, self.variant, self.kind = dm, steps, variant, kind
        self.iter = 0
        self.margins: list[float] = []

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor):
        self.iter += 1
        n_step = len([step for step in self.steps if step < self.iter])
        m = 1.0 + self.dm * n_step
        self.margins.append(m)
        return sphereface_r_loss(x, weight, labels, variant=self.variant, kind=self.kind, m=m)


CASES = [  # (variant, kind, dm, steps)
    ("N", "v0", 0.25, [1, 3]),
    ("S", "v0", 1.5, [2]),
    ("N", "v1", 0.3, [0, 2, 4]),
    ("S", "v2", 0.4, [1, 3]),
]


def _schedule_parity(variant: str, kind: str, dm: float, steps: list[int], impl: str):
    """Loss, ∂x, ∂W max errors over SCHEDULE_STEPS steps (as tests/margins/test_sphereface_r.py:
    the centers renormalized before each step, their ∂W taken to the tangent space, our update
    on both sides), and the margins each side used."""
    torch.manual_seed(0)
    extra = {"chunk_size": 4} if impl == "chunked" else {}
    feature_norm = {"N": "none", "S": "soft"}[variant]
    options = {"margin": 1.0, "margin_increment": dm, "margin_steps": steps, "kind": kind}
    if variant == "S":
        options["soft_weight"] = 0.01 * 30.0 / 50.0  # their t, over the loss weight lw/s
    loss = marginface.create_loss(
        "sphereface-r", C, D, impl=impl, dtype=torch.float64, feature_norm=feature_norm,
        **extra, **options,
    )  # fmt: skip
    factor = sphereface_r_factor(variant)  # their default lw (/ s)
    theirs = _TheirSchedule(dm, steps, variant, kind)
    ours_margins = []
    errors = {"loss": 0.0, "∂x": 0.0, "∂W": 0.0}
    for step in range(SCHEDULE_STEPS):
        with torch.no_grad():
            loss.weight.copy_(F.normalize(loss.weight, dim=1))
        weight = loss.weight.detach().clone().requires_grad_(True)
        x, labels = _batch(step)
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ours = factor * loss(xa, labels)
        ours_margins.append(loss.margin.current_margin)
        gxa, gwa = torch.autograd.grad(ours, [xa, loss.weight])
        reference = theirs(xb, weight, labels)
        gxb, gwb = torch.autograd.grad(reference, [xb, weight])
        errors["loss"] = max(errors["loss"], float((ours - reference).detach().abs()))
        errors["∂x"] = max(errors["∂x"], float((gxa - gxb).abs().max()))
        tangent = _tangent(weight.detach(), gwb)
        errors["∂W"] = max(errors["∂W"], float((gwa - tangent).abs().max()))
        with torch.no_grad():
            loss.weight -= LR * gwa
    return errors, ours_margins, theirs.margins


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize(("variant", "kind", "dm", "steps"), CASES)
def test_the_stepped_margin_reproduces_opensphere(variant, kind, dm, steps, impl) -> None:
    errors, ours, theirs = _schedule_parity(variant, kind, dm, steps, impl)
    assert max(errors.values()) <= TOLERANCE, errors
    assert ours == theirs
    assert len(set(theirs)) > 1  # the schedule moved within the steps checked


def test_scheduled_margin_counts_the_steps_passed() -> None:
    steps = torch.tensor([2, 5])
    values = [float(scheduled_margin(torch.tensor(t), 1.2, 0.5, steps)) for t in range(1, 8)]
    assert values == [1.2, 1.2, 1.7, 1.7, 1.7, 2.2, 2.2]


def test_the_iteration_is_saved_advanced_in_training_only_and_resumed() -> None:
    margin = SphereFaceRMargin(1.0, margin_steps=[1], margin_increment=0.5)
    cosine = torch.tensor([[0.3, 0.1]], dtype=torch.float64)
    labels = torch.tensor([0])
    margin.eval()
    margin(cosine, labels)
    assert int(margin.iteration) == 0 and margin.current_margin == 1.0
    margin.train()
    margin(cosine, labels)
    margin(cosine, labels)  # iteration 2 > step 1
    assert margin.current_margin == 1.5
    resumed = SphereFaceRMargin(1.0, margin_steps=[1], margin_increment=0.5)
    resumed.load_state_dict(margin.state_dict())
    assert int(resumed.iteration) == 2 and resumed.current_margin == 1.5
    assert set(margin.state_dict()) == {"iteration"}
    assert SphereFaceRMargin().state_dict() == {}  # a fixed margin holds no state


def test_v2_with_a_margin_that_starts_at_one_is_not_an_identity() -> None:
    assert SphereFaceRMargin(1.0, kind="v2").nontarget_is_identity()
    stepped = SphereFaceRMargin(1.0, kind="v2", margin_steps=[3], margin_increment=0.2)
    assert not stepped.nontarget_is_identity()


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"margin_steps": "10"}, TypeError, "margin_steps must be a sequence of integers"),
        ({"margin_steps": 10}, TypeError, "margin_steps must be a sequence of integers, got 10"),
        ({"margin_steps": [1.5]}, TypeError, r"margin_steps must be an integer, got 1\.5"),
        ({"margin_steps": [-1]}, ValueError, "margin_steps must be >= 0, got -1"),
        ({"margin_steps": [3, 3]}, ValueError, r"strictly increasing, got \[3, 3\]"),
        ({"margin_increment": -0.1}, ValueError, r"margin_increment must be >= 0, got -0\.1"),
    ],
)
def test_bad_schedules_are_named(kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        SphereFaceRMargin(**kwargs)


def measured_table() -> list[str]:
    """docs/parity.md's rows: ``case: dense loss/∂x/∂W | chunked ...``."""
    lines = []
    for variant, kind, dm, steps in CASES:
        cells = []
        for impl in ("dense", "chunked"):
            errors, _, margins = _schedule_parity(variant, kind, dm, steps, impl)
            cells.append(" / ".join(f"{errors[k]:.1e}" for k in ("loss", "∂x", "∂W")))
        lines.append(f"_{variant} {kind} dm={dm} steps={steps} m={margins}: {' | '.join(cells)}")
    return lines


if __name__ == "__main__":
    print("\n".join(measured_table()))
