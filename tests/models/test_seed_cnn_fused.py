"""The seed CNN's fast path (fused first block, bit-mask dropout) against the plain layers."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from marginface.models import SeedCNN
from marginface.models.conv_pool import conv3x3_maxpool2_relu
from marginface.models.dropout import fast_dropout


def reference_block(images, weight, bias, padding):
    return F.max_pool2d(F.conv2d(images, weight, bias, padding=padding), 2).relu()


@pytest.mark.parametrize(
    ("dtype", "channels", "size", "padding"),
    [
        (torch.float64, 1, (28, 28), 3),
        (torch.float64, 3, (9, 12), 1),  # odd side: the last row is dropped as by max_pool2d
        (torch.float32, 1, (28, 28), 3),
        (torch.float32, 2, (8, 8), 0),
    ],
)
def test_fused_block_equals_conv_pool_relu_with_gradients(dtype, channels, size, padding):
    torch.manual_seed(0)
    images = torch.rand(5, channels, *size, dtype=dtype)
    images[0] = 0  # blank image: all four candidates tie (= bias), first one wins
    weight = torch.randn(7, channels, 3, 3, dtype=dtype, requires_grad=True)
    bias = torch.randn(7, dtype=dtype, requires_grad=True)
    expected = reference_block(images, weight, bias, padding)
    got = conv3x3_maxpool2_relu(images, weight, bias, padding)
    assert got.shape == expected.shape
    assert got.is_contiguous(memory_format=torch.channels_last)
    tolerance = {"atol": 1e-12, "rtol": 1e-12} if dtype == torch.float64 else {}
    torch.testing.assert_close(got, expected, **tolerance)
    upstream = torch.randn_like(expected)
    want = torch.autograd.grad(expected, (weight, bias), upstream)
    have = torch.autograd.grad(got, (weight, bias), upstream)
    for a, b in zip(have, want, strict=True):
        torch.testing.assert_close(a, b, **tolerance)


def test_fused_block_spans_several_chunks(monkeypatch):
    from marginface.models import conv_pool

    monkeypatch.setattr(conv_pool, "_CHUNK_ROWS", 100)  # 3·8·8 = 192 rows → 2 chunks
    torch.manual_seed(1)
    images = torch.rand(3, 1, 12, 12, dtype=torch.float64)
    weight = torch.randn(4, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    expected = reference_block(images, weight, bias, 3)
    got = conv3x3_maxpool2_relu(images, weight, bias, 3)
    torch.testing.assert_close(got, expected)
    gradient = torch.autograd.grad(got.sum(), weight)[0]
    torch.testing.assert_close(gradient, torch.autograd.grad(expected.sum(), weight)[0])


def test_fused_block_errors():
    weight, bias = torch.randn(4, 1, 3, 3), torch.randn(4)
    with pytest.raises(ValueError, match="must not require grad"):
        conv3x3_maxpool2_relu(torch.rand(1, 1, 8, 8, requires_grad=True), weight, bias, 1)
    with pytest.raises(ValueError, match=r"weight must be \[O, 2, 3, 3\]"):
        conv3x3_maxpool2_relu(torch.rand(1, 2, 8, 8), weight, bias, 1)


@pytest.mark.parametrize("hidden", [None, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_seed_cnn_equals_the_plain_layers(dtype, hidden):
    torch.manual_seed(0)
    plain = SeedCNN(3, fused=False, dropout=0.0, hidden=hidden, dtype=dtype)
    fused = SeedCNN(3, fused=True, dropout=0.0, hidden=hidden, dtype=dtype)
    fused.load_state_dict(plain.state_dict())  # same keys
    assert list(fused.state_dict()) == list(plain.state_dict())
    images = torch.rand(6, 1, 28, 28, dtype=dtype)
    tolerance = {"atol": 1e-10, "rtol": 1e-10} if dtype == torch.float64 else {}
    out_plain, out_fused = plain(images), fused(images)
    assert out_fused.shape == (6, 3)
    torch.testing.assert_close(out_fused, out_plain, **tolerance)
    upstream = torch.randn_like(out_plain)
    grads_plain = torch.autograd.grad(out_plain, list(plain.parameters()), upstream)
    grads_fused = torch.autograd.grad(out_fused, list(fused.parameters()), upstream)
    for a, b in zip(grads_fused, grads_plain, strict=True):
        torch.testing.assert_close(a, b, **tolerance)


def test_fused_seed_cnn_channels_last_and_eval_dropout():
    torch.manual_seed(0)
    plain = SeedCNN(3, fused=False).eval()
    fused = SeedCNN(3).eval().to(memory_format=torch.channels_last)
    fused.load_state_dict(plain.state_dict())
    images = torch.rand(4, 1, 28, 28)
    torch.testing.assert_close(
        fused(images.contiguous(memory_format=torch.channels_last)), plain(images)
    )


def test_fused_seed_cnn_falls_back_when_images_need_grad():
    torch.manual_seed(0)
    model = SeedCNN(3, dropout=0.0)
    images = torch.rand(2, 1, 28, 28, requires_grad=True)
    model(images).sum().backward()
    assert images.grad is not None and images.grad.shape == images.shape
    assert not SeedCNN(3, batch_norm=True).fused


def test_fast_dropout_at_one_half_matches_dropout_statistics():
    torch.manual_seed(0)
    x = torch.ones(512, 1000, dtype=torch.float64, requires_grad=True)
    y = fast_dropout(x, 0.5, True)
    assert set(torch.unique(y).tolist()) == {0.0, 2.0}
    kept = (y > 0).double()
    assert abs(kept.mean().item() - 0.5) < 0.005  # 512k fair coins: sd 0.0007
    assert (
        abs(kept[:, :-1].flatten().dot(kept[:, 1:].flatten()).item() / kept[:, 1:].numel() - 0.25)
        < 0.005
    )  # neighbours independent
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, y.detach())  # gradient = the same mask
    odd = torch.ones(3, 5)
    assert fast_dropout(odd, 0.5, True).shape == (3, 5)
    assert fast_dropout(odd, 0.5, False) is odd
    assert fast_dropout(odd, 0.0, True) is odd
    assert set(
        torch.unique(fast_dropout(torch.ones(1000, dtype=torch.float64), 0.25, True)).tolist()
    ) == {0.0, 4 / 3}


def test_fused_block_under_bf16_autocast_is_as_accurate_as_the_autocast_reference():
    torch.manual_seed(0)
    images = torch.rand(4, 1, 28, 28)
    weight = torch.randn(8, 1, 3, 3, requires_grad=True)
    bias = torch.randn(8, requires_grad=True)
    exact = reference_block(images, weight, bias, 3)  # fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference_block(images, weight, bias, 3)
        got = conv3x3_maxpool2_relu(images, weight, bias, 3)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), exact, atol=0.05, rtol=0.01)
    upstream = torch.randn_like(exact)
    truth = torch.autograd.grad(exact, (weight, bias), upstream)
    want = torch.autograd.grad(expected, (weight, bias), upstream.bfloat16())
    have = torch.autograd.grad(got, (weight, bias), upstream.bfloat16())
    for ours, theirs, true in zip(have, want, truth, strict=True):
        assert ours.dtype == torch.float32
        # bf16 rounding moves some pooling winners: compare errors against the fp32 gradient
        assert (ours - true).norm() <= 1.5 * (theirs - true).norm() + 1e-3 * true.norm()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fused_seed_cnn_traces_and_scripts_through_the_plain_layers():
    torch.manual_seed(0)
    model = SeedCNN(3).eval()
    images = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        expected = model(images)
        traced = torch.jit.trace(model, (images,), check_trace=False)
        scripted = torch.jit.script(model)
        other = torch.rand(5, 1, 28, 28)  # another batch size: no frozen Python loop
        torch.testing.assert_close(traced(images), expected)
        torch.testing.assert_close(traced(other), model(other))
        torch.testing.assert_close(scripted(images), expected)
