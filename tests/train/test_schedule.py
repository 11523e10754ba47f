"""insightface's training mechanics: the polynomial schedule with warm-up per step, gradient
accumulation, torch.compile and channels-last, on the CPU."""

from __future__ import annotations

import pytest
import torch

from marginface.train import build_optimizer, build_scheduler, lr_factor, train
from marginface.train.config import TrainConfig, config_from_dict
from marginface.train.schedule import micro_batches, polynomial_factor


def _insightface_closed_form(t: int, base: float, warmup: int, total: int, power: float) -> float:
    """``PolynomialLRWarmup._get_closed_form_lr`` restated: ``base · t / w`` up to ``w``, then
    ``base · (1 - (min(T, t) - w) / (T - w)) ** power``."""
    if t <= warmup:
        return base * t / warmup
    return base * (1.0 - (min(total, t) - warmup) / (total - warmup)) ** power


def test_polynomial_factor_by_hand():
    kw = {"total_steps": 100, "warmup_steps": 10, "power": 2.0}
    assert polynomial_factor(0, **kw) == pytest.approx(0.1)
    assert polynomial_factor(9, **kw) == pytest.approx(1.0)
    assert polynomial_factor(10, **kw) == pytest.approx(1.0)
    assert polynomial_factor(55, **kw) == pytest.approx(0.25)  # (1 - 45/90)²
    assert polynomial_factor(100, **kw) == 0.0
    assert polynomial_factor(150, **kw) == 0.0
    assert polynomial_factor(3, total_steps=4, warmup_steps=0, power=1.0) == pytest.approx(0.25)


@pytest.mark.parametrize("power", [1.0, 2.0])
def test_polynomial_decay_equals_insightfaces_after_the_warm_up(power):
    """After the warm-up, step ``t`` here is insightface's step ``t`` (same closed form);
    the warm-up reaches the peak one step earlier (``(t + 1) / w`` instead of ``t / w``)."""
    for t in range(10, 100):
        ours = lr_factor(
            t,
            total_steps=100,
            steps_per_epoch=10,
            schedule="polynomial",
            warmup_steps=10,
            power=power,
        )
        assert ours == pytest.approx(_insightface_closed_form(t, 1.0, 10, 100, power))
    for t in range(10):
        warm = lr_factor(t, total_steps=100, steps_per_epoch=10, schedule="polynomial",
                         warmup_steps=10)  # fmt: skip
        assert warm == pytest.approx(_insightface_closed_form(t + 1, 1.0, 10, 100, 1.0))


def test_polynomial_scheduler_drives_the_optimizer():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([param], "sgd", lr=0.1)
    sched = build_scheduler(
        opt, schedule="polynomial", epochs=2, steps_per_epoch=5, warmup_epochs=0.4, power=2.0
    )
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == pytest.approx([0.05, 0.1, 0.1])
    assert lrs[6] == pytest.approx(0.1 * (1 - 4 / 8) ** 2)


def test_config_keys_are_checked():
    config = config_from_dict({"schedule": "polynomial", "poly_power": 2, "grad_accumulation": 4})
    assert config.poly_power == 2.0 and config.grad_accumulation == 4 and not config.compile
    with pytest.raises(ValueError, match="poly_power must be a finite number > 0"):
        TrainConfig(poly_power=0.0)
    with pytest.raises(ValueError, match="grad_accumulation must be >= 1"):
        TrainConfig(grad_accumulation=0)
    with pytest.raises(ValueError, match=r"grad_accumulation = 9 must be <= batch_size \(8\)"):
        TrainConfig(grad_accumulation=9, batch_size=8)
    with pytest.raises(ValueError, match="schedule must be one of .*polynomial"):
        TrainConfig(schedule="poly")


def test_micro_batches_cover_the_batch_in_order():
    images, labels = torch.arange(10.0)[:, None], torch.arange(10)
    parts = micro_batches(images, labels, 3)
    assert [p[1].tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert len(micro_batches(images[:2], labels[:2], 3)) == 2  # no empty micro-batch
    assert micro_batches(images, labels, 1)[0][0] is images


def _quick(**overrides: object) -> TrainConfig:
    values: dict[str, object] = {
        "limit": 192,
        "epochs": 2,
        "batch_size": 64,
        "threads": 1,
        "lr": 3e-3,
        "loss": "arcface",  # no batch state: micro-batches see the same margin
        "model": "seed-cnn",  # no BatchNorm
        "model_options": {"dropout": 0.0},  # no random stream that compile would change
        "device": "cpu",
    }
    values.update(overrides)
    return TrainConfig(**values)


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {**trainer.model.state_dict(), **trainer.loss.state_dict()}


FLOAT32_SLACK = 4.0
"""How far two float32 runs may be apart, in units of float32's own error on this training: each
run's distance from the exact (float64) result is float32 rounding; the accumulated run sums its
micro-batches in another order (another rounding pattern of the same size), so the two float32
runs are within twice that distance of each other; the factor 2 on top covers a rounding
pattern larger than the reference run's."""


def _float64_run(config: TrainConfig, run_dir, initial_state) -> tuple[dict, list[float]]:
    """The same run in float64 (parameters, data and the head's arithmetic), from the same
    initial weights: the exact result, up to float64 rounding."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        trainer = train(config, run_dir, initial_state=initial_state)
    finally:
        torch.set_default_dtype(previous)
    weights = _weights(trainer)
    assert all(w.dtype == torch.float64 for w in weights.values() if w.is_floating_point())
    return weights, [r["loss"] for r in trainer.history]


def _start(tmp_path, **overrides: object) -> dict[str, dict]:
    """Initial weights shared by a float32 comparison and its float64 reference (one short
    run's: any weights will do)."""
    start = train(_quick(epochs=1, limit=64, **overrides), tmp_path / "start")
    return {"model": start.model.state_dict(), "loss": start.loss.state_dict()}


def _assert_weights_within_float32_error(ours, theirs, exact) -> None:
    """Tensor by tensor, ``ours`` and ``theirs`` (two float32 runs) are no farther apart than
    :data:`FLOAT32_SLACK` times ``theirs``'s distance from ``exact`` (float64), plus one
    rounding of the tensor's largest weight."""
    assert ours.keys() == theirs.keys() == exact.keys()
    for key in ours:
        if not ours[key].is_floating_point():
            assert torch.equal(ours[key], theirs[key]), key
            continue
        apart = float((ours[key].double() - theirs[key].double()).abs().max())
        error = float((theirs[key].double() - exact[key]).abs().max())
        floor = torch.finfo(torch.float32).eps * float(exact[key].abs().max())
        assert apart <= FLOAT32_SLACK * error + floor, (key, apart, error)


def _assert_losses_within_float32_error(ours, theirs, exact, samples: int) -> None:
    """Epoch losses (float32 means over ``samples`` values: about sqrt(n) roundings each)."""
    eps = torch.finfo(torch.float32).eps
    for a, b, reference in zip(ours, theirs, exact, strict=True):
        floor = FLOAT32_SLACK * samples**0.5 * eps * abs(reference)
        assert abs(a - b) <= FLOAT32_SLACK * abs(b - reference) + floor, (a, b, reference)


def test_gradient_accumulation_takes_the_same_steps(tmp_path):
    """Three micro-batches per batch train the weights the whole batch trains, to float32
    precision: tensor by tensor, the two float32 runs are no farther apart than
    :data:`FLOAT32_SLACK` times the whole-batch run's distance from the same run in float64
    (a bound that follows this CPU's own float32 rounding, whatever its summation order).

    SGD, insightface's optimizer: its step is proportional to the gradient, so a micro-batch
    weighted wrongly shows, and a rounding difference in the gradient moves the weights by a
    rounding-sized amount. Accumulation happens before the optimizer, so this covers Adam's
    runs too; Adam itself would hide a constant factor on the gradient and, dividing each
    component by its own running magnitude, turns a gradient that nearly cancels into a step of
    up to ±lr whatever the summation order: 9 of 18,432 weights 7.5e-5 apart on an Intel Xeon
    against about 1e-7 here, with both runs equally correct."""
    options = {"schedule": "polynomial", "warmup_epochs": 0.5, "optimizer": "sgd", "lr": 0.05}
    initial = _start(tmp_path)
    whole = train(_quick(**options), tmp_path / "whole", initial_state=initial)
    split = train(_quick(grad_accumulation=3, **options), tmp_path / "split", initial_state=initial)
    exact, exact_losses = _float64_run(_quick(**options), tmp_path / "exact", initial)
    _assert_weights_within_float32_error(_weights(split), _weights(whole), exact)
    first = {**initial["model"], **initial["loss"]}
    for key, value in _weights(whole).items():
        if value.is_floating_point():  # float32's error is small against what training moved
            error = float((value.double() - exact[key]).abs().max())
            moved = float((exact[key] - first[key].double()).abs().max())
            assert error <= 1e-4 * moved, (key, error, moved)
    _assert_losses_within_float32_error(
        [r["loss"] for r in split.history],
        [r["loss"] for r in whole.history],
        exact_losses,
        _quick().limit,
    )
    assert [r["lr"] for r in split.history] == [r["lr"] for r in whole.history]


def test_channels_last_trains_like_contiguous(tmp_path):
    """One step from the same weights: the loss of the first (and only) batch agrees."""
    one_step = {"model": "seed-cnn-bn", "epochs": 1, "limit": 64}
    nchw = train(_quick(channels_last=False, **one_step), tmp_path / "nchw")
    nhwc = train(_quick(channels_last=True, **one_step), tmp_path / "nhwc")
    assert next(nhwc.model.parameters()).is_contiguous(memory_format=torch.channels_last)
    assert nhwc.history[0]["loss"] == pytest.approx(nchw.history[0]["loss"], rel=1e-5)


def test_compile_trains_the_same_parameters(tmp_path):
    """torch.compile's kernels sum in other orders: the compiled run's weights are within
    float32's error of the eager run's (the eager run in float64 as the reference). SGD, whose
    step follows the gradient's rounding linearly (see the accumulation test)."""
    options = {"epochs": 1, "limit": 128, "optimizer": "sgd", "lr": 0.05}
    initial = _start(tmp_path)
    eager = train(_quick(**options), tmp_path / "eager", initial_state=initial)
    compiled = train(_quick(compile=True, **options), tmp_path / "compiled", initial_state=initial)
    assert compiled.forward_model is not compiled.model  # trained through torch.compile
    exact, exact_losses = _float64_run(_quick(**options), tmp_path / "exact", initial)
    _assert_weights_within_float32_error(_weights(compiled), _weights(eager), exact)
    _assert_losses_within_float32_error(
        [r["loss"] for r in compiled.history], [r["loss"] for r in eager.history], exact_losses, 128
    )
