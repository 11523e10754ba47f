"""One parametrized sweep over every registered loss."""

from __future__ import annotations

import io

import pytest
import torch

import marginface
from marginface.registry import LOSSES

from .conftest import make_loss

ALL = LOSSES.names()  # the one table create_loss, list_losses, the CLI and Keras read
C, D, N = 7, 5, 12


def test_registry_lists_every_paper() -> None:
    expected = {
        "normface", "sphereface", "cosface", "amsoftmax", "arcface", "combined",
        "curricularface", "adacos", "subcenter-arcface", "magface", "adaface", "elasticface",
    }  # fmt: skip
    assert expected <= set(ALL)


def test_registry_names_are_case_and_separator_insensitive() -> None:
    assert marginface.get_loss_class("SubCenter_ArcFace") is marginface.SubCenterArcFaceLoss
    assert marginface.get_loss_class("am-softmax") is marginface.AMSoftmaxLoss


@pytest.mark.parametrize("spelling", LOSSES.names(include_aliases=True))
def test_every_name_and_alias_builds_its_class(spelling: str) -> None:
    cls = LOSSES.get(spelling)
    assert marginface.list_losses() == ALL
    loss = make_loss(LOSSES.canonical(spelling), C, D)
    assert type(loss) is cls is marginface.get_loss_class(spelling.upper())
    assert (
        type(
            marginface.create_loss(spelling, C, D, **({"seed": 0} if "elastic" in spelling else {}))
        )
        is cls
    )


def test_unknown_loss_lists_valid_names() -> None:
    with pytest.raises(ValueError, match=r"unknown loss 'arcfase'.*arcface"):
        marginface.create_loss("arcfase", num_classes=3, embedding_dim=2)


def test_unknown_option_is_named() -> None:
    with pytest.raises(TypeError, match="bogus"):
        marginface.create_loss("arcface", num_classes=3, embedding_dim=2, bogus=1)


def _batch(dtype=torch.float32):
    x = (torch.randn(N, D) * 8).to(dtype)  # norms ~ 18: inside MagFace's [10, 110] often
    y = torch.randint(0, C, (N,))
    return x, y


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_finite_backward(name: str, dtype: torch.dtype) -> None:
    loss_fn = make_loss(name, C, D, dtype=dtype)
    x, y = _batch(dtype)
    x.requires_grad_(True)
    loss = loss_fn(x, y)
    assert loss.shape == () and loss.dtype == dtype and torch.isfinite(loss)
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert loss_fn.weight.grad is not None and torch.isfinite(loss_fn.weight.grad).all()
    per_sample = make_loss(name, C, D, dtype=dtype, reduction="none")(x.detach(), y)
    assert per_sample.shape == (N,)
    assert loss_fn.logits(x.detach(), y).shape == (N, C)
    assert loss_fn.logits(x.detach()).shape == (N, C)
    assert loss_fn.cosine(x.detach()).shape == (N, C)
    assert loss_fn.weight.shape == (C * loss_fn.sub_centers, D)


@pytest.mark.parametrize("name", ALL)
def test_bf16_autocast_keeps_fp32_math(name: str) -> None:
    loss_fn = make_loss(name, C, D)
    x, y = _batch()
    x.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = torch.nn.functional.linear(x, torch.eye(D))  # a bf16 activation, as a backbone gives
        assert h.dtype == torch.bfloat16
        loss = loss_fn(h, y)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(loss_fn.weight.grad).all()


@pytest.mark.parametrize("name", ALL)
def test_reductions_agree(name: str) -> None:
    x, y = _batch()
    losses = {}
    for reduction in ("none", "sum", "mean"):
        torch.manual_seed(3)  # same ElasticFace draws in each
        fn = make_loss(name, C, D, reduction=reduction)
        losses[reduction] = fn(x, y)
    torch.testing.assert_close(losses["none"].sum(), losses["sum"])
    torch.testing.assert_close(losses["none"].mean(), losses["mean"])


@pytest.mark.parametrize("name", ALL)
def test_state_dict_round_trip(name: str) -> None:
    source = make_loss(name, C, D)
    x, y = _batch()
    for _ in range(3):  # advance any state (t, s, EMA statistics, iteration)
        source(x, y)
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    target = make_loss(name, C, D)
    target.load_state_dict(torch.load(buffer))
    for key, value in source.state_dict().items():
        torch.testing.assert_close(target.state_dict()[key], value, msg=key)
    source.eval(), target.eval()
    torch.testing.assert_close(source(x, y), target(x, y))


STATE_KEYS = {
    "curricularface": ["margin.t"],
    "adacos": ["margin.scale"],
    "adaface": ["margin.batch_mean", "margin.batch_std"],
    "sphereface": ["margin.iteration"],
}


@pytest.mark.parametrize("name", sorted(STATE_KEYS))
def test_stateful_margins_update_in_training_only(name: str) -> None:
    loss_fn = make_loss(name, C, D)
    assert loss_fn.margin.stateful
    keys = STATE_KEYS[name]
    assert set(keys) <= set(loss_fn.state_dict())
    x, y = _batch()
    before = {k: loss_fn.state_dict()[k].clone() for k in keys}
    loss_fn.eval()
    loss_fn(x, y)
    loss_fn.logits(x, y)
    for k in keys:
        torch.testing.assert_close(loss_fn.state_dict()[k], before[k], rtol=0, atol=0)
    loss_fn.train()
    loss_fn(x, y)
    assert any(not torch.equal(loss_fn.state_dict()[k], before[k]) for k in keys)


@pytest.mark.parametrize("name", [n for n in ALL if n not in STATE_KEYS])
def test_stateless_margins_have_no_buffers(name: str) -> None:
    loss_fn = make_loss(name, C, D)
    assert not loss_fn.margin.stateful
    assert list(loss_fn.margin.buffers()) == []


@pytest.mark.parametrize("name", ALL)
def test_forward_does_not_mutate_inputs_or_parameters(name: str) -> None:
    loss_fn = make_loss(name, C, D)
    x, y = _batch()
    x0, y0, w0 = x.clone(), y.clone(), loss_fn.weight.detach().clone()
    loss_fn(x, y).backward()
    assert torch.equal(x, x0) and torch.equal(y, y0)
    assert torch.equal(loss_fn.weight.detach(), w0)


@pytest.mark.parametrize("name", ALL)
def test_device_and_dtype_arguments(name: str) -> None:
    loss_fn = make_loss(name, C, D, device="cpu", dtype=torch.float64)
    assert loss_fn.weight.device.type == "cpu" and loss_fn.weight.dtype == torch.float64
    for buffer in loss_fn.buffers():
        assert buffer.device.type == "cpu"
    assert "num_classes=7" in repr(loss_fn)
