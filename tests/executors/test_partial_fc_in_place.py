"""Partial FC read in place: the chunked executor given the whole weight and the sampled classes
equals the materialized formulation (``weight.view(C, K, D)[sampled].reshape(-1, D)``, what the
head passed before) and the dense path on the sampled classes, without the ``S·K×D`` copy."""

from __future__ import annotations

import copy

import pytest
import torch

import marginface
from marginface.executors.chunked import chunked_margin_cross_entropy
from marginface.executors.dense import dense_margin_cross_entropy

C, D, N, S = 53, 12, 20, 23
OPTIONS: dict[str, dict] = {"elasticface": {"seed": 0}}
# Margins on each code path: the custom ops with the identity rule (arcface, cosface,
# sub-centers) and CurricularFace's rule, the autograd Function (AdaFace's cosine clamp,
# inter-class filtering), a scale with a gradient (SphereFace's ‖x‖), AdaCos's extra pass.
NAMES = ["arcface", "cosface", "curricularface", "subcenter-arcface", "adaface", "sphereface"]
NAMES += ["adacos", "magface", "npcface"]


def make_case(name: str, dtype: torch.dtype, seed: int = 0, **options):
    """A margin, K, weight ``[C·K, D]``, a sorted sample of ``S`` classes, embeddings and
    targets (positions in the sample, first and last included) and an upstream gradient."""
    loss = marginface.create_loss(name, C, D, **{**OPTIONS.get(name, {}), **options})
    k = loss.sub_centers
    margin = loss.margin.to(torch.float64) if dtype == torch.float64 else loss.margin
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(C * k, D, generator=generator, dtype=dtype)
    sampled = torch.randperm(C, generator=generator)[:S].sort().values
    x = torch.randn(N, D, generator=generator, dtype=dtype) * 8
    targets = torch.randint(0, S, (N,), generator=generator)
    targets[0], targets[1] = 0, S - 1
    upstream = torch.rand(N, generator=generator, dtype=torch.float64)
    return margin, k, weight, sampled, x, targets, upstream


def run(margin, k, weight, x, targets, upstream, *, sampled=None, materialize=False, **kwargs):
    """``(loss, ∂x, ∂W)`` on copies of the inputs and of the (stateful) margin. ``materialize``:
    the formulation the head used before, the sampled rows copied out of the weight."""
    margin = copy.deepcopy(margin)
    x = x.clone().requires_grad_(True)
    weight = weight.clone().requires_grad_(True)
    if materialize:
        rows = weight.view(-1, k, weight.shape[1])[sampled].reshape(-1, weight.shape[1])
        loss = chunked_margin_cross_entropy(x, rows, targets, margin, sub_centers=k, **kwargs)
    else:
        loss = chunked_margin_cross_entropy(
            x, weight, targets, margin, sub_centers=k, sampled_classes=sampled, **kwargs
        )
    (loss * upstream.to(loss.dtype)).sum().backward()
    return loss.detach(), x.grad, weight.grad


def assert_same(actual, expected, atol: float) -> None:
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=atol)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("chunk_size", [5, 64])  # chunks splitting the sample; one chunk
def test_matches_the_materialized_sample_in_float64(name: str, chunk_size: int) -> None:
    margin, k, weight, sampled, x, targets, upstream = make_case(name, torch.float64)
    expected = run(margin, k, weight, x, targets, upstream, sampled=sampled, materialize=True,
                   chunk_size=chunk_size)  # fmt: skip
    actual = run(margin, k, weight, x, targets, upstream, sampled=sampled, chunk_size=chunk_size)
    assert_same(actual, expected, 1e-12)
    grad = actual[2].view(C, k, D)
    outside = torch.ones(C, dtype=torch.bool)
    outside[sampled] = False
    assert (grad[outside] == 0).all()  # exactly zero, not small
    assert (grad[sampled].abs().sum(dim=(1, 2)) > 0).all()


@pytest.mark.parametrize("name", ["arcface", "subcenter-arcface", "curricularface"])
def test_matches_dense_on_the_sampled_classes(name: str) -> None:
    margin, k, weight, sampled, x, targets, upstream = make_case(name, torch.float64, seed=1)
    actual = run(margin, k, weight, x, targets, upstream, sampled=sampled, chunk_size=7)
    margin = copy.deepcopy(margin)
    x_ref = x.clone().requires_grad_(True)
    rows = weight.view(C, k, D)[sampled].reshape(-1, D).requires_grad_(True)
    loss = dense_margin_cross_entropy(x_ref, rows, targets, margin, sub_centers=k)
    (loss * upstream).sum().backward()
    torch.testing.assert_close(actual[0], loss.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(actual[1], x_ref.grad, rtol=0, atol=1e-12)
    grad = actual[2].view(C, k, D)
    torch.testing.assert_close(grad[sampled].reshape(-1, D), rows.grad, rtol=0, atol=1e-12)


def test_interclass_filtering_matches_the_materialized_sample() -> None:
    margin, k, weight, sampled, x, targets, upstream = make_case(
        "arcface", torch.float64, interclass_filtering_threshold=0.1
    )
    expected = run(margin, k, weight, x, targets, upstream, sampled=sampled, materialize=True,
                   chunk_size=6)  # fmt: skip
    actual = run(margin, k, weight, x, targets, upstream, sampled=sampled, chunk_size=6)
    assert_same(actual, expected, 1e-12)


@pytest.mark.parametrize("name", ["arcface", "subcenter-arcface"])
def test_bfloat16_weight_matches_the_materialized_sample(name: str) -> None:
    """The same bf16 GEMMs on the same rows: identical up to float32 summation order."""
    margin, k, weight, sampled, x, targets, upstream = make_case(name, torch.bfloat16)
    expected = run(margin, k, weight, x, targets, upstream, sampled=sampled, materialize=True,
                   chunk_size=5)  # fmt: skip
    actual = run(margin, k, weight, x, targets, upstream, sampled=sampled, chunk_size=5)
    assert actual[2].dtype == torch.bfloat16 and actual[2].shape == weight.shape
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-6, atol=1e-5)
    for a, e in zip(actual[1:], expected[1:], strict=True):
        torch.testing.assert_close(a.float(), e.float(), rtol=1e-2, atol=1e-4)


def test_float32_weight_with_float64_inputs() -> None:
    """The weight in another dtype than the computation (rows converted per chunk)."""
    margin, k, weight, sampled, x, targets, upstream = make_case("cosface", torch.float64)
    weight = weight.float()
    expected = run(margin, k, weight, x, targets, upstream, sampled=sampled, materialize=True,
                   chunk_size=5)  # fmt: skip
    actual = run(margin, k, weight, x, targets, upstream, sampled=sampled, chunk_size=5)
    assert actual[2].dtype == torch.float32
    assert_same(actual, expected, 1e-6)


def test_keeps_no_copy_of_the_sampled_rows() -> None:
    """Forward saves the weight itself (its storage), nothing of the sample's size ``S·K×D``;
    backward hands autograd one shard-sized gradient."""
    margin, k, weight, sampled, x, targets, upstream = make_case("subcenter-arcface", torch.float32)
    weight.requires_grad_(True)
    x.requires_grad_(True)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss = chunked_margin_cross_entropy(
            x, weight, targets, margin, sub_centers=k, chunk_size=5, sampled_classes=sampled
        )
    assert any(t.data_ptr() == weight.data_ptr() for t in saved)
    large = [t.shape for t in saved if t.dim() == 2 and t.shape[0] > N]
    assert all(shape == weight.shape for shape in large), large
    seen: list[torch.Size] = []
    weight.register_hook(lambda grad: seen.append(grad.shape))
    (loss * upstream.float()).sum().backward()
    assert seen == [weight.shape]


def test_head_with_sample_rate_reads_in_place_and_matches_the_materialized_step() -> None:
    """The unsharded head's Partial FC step (the chunked executor) against the formulation it
    used before, the sample drawn by hand from the same random state."""
    torch.manual_seed(5)
    head = marginface.create_loss(
        "subcenter-arcface", C, D, impl="chunked", chunk_size=4, sample_rate=0.6,
        dtype=torch.float64,
    )  # fmt: skip
    k = head.sub_centers
    x = torch.randn(N, D, dtype=torch.float64)
    labels = torch.randint(0, C, (N,))
    reference = copy.deepcopy(head.margin)
    state = torch.get_rng_state()
    x_head = x.clone().requires_grad_(True)
    head(x_head, labels).backward()
    torch.set_rng_state(state)  # the head's draw, again, as the head did it before
    positive = torch.zeros(C, dtype=torch.bool)
    positive[labels] = True
    keep = int(0.6 * C)
    assert int(positive.sum()) < keep  # negatives are drawn too
    score = torch.rand(C, dtype=torch.float32)
    score[positive] = 2.0
    selected = score.topk(keep).indices.sort().values
    targets = torch.searchsorted(selected, labels)
    weight = head.weight.detach().clone().requires_grad_(True)
    x_ref = x.clone().requires_grad_(True)
    rows = weight.view(C, k, D)[selected].reshape(-1, D)
    loss = chunked_margin_cross_entropy(
        x_ref, rows, targets, reference, sub_centers=k, chunk_size=4
    ).mean()
    loss.backward()
    torch.testing.assert_close(head.weight.grad, weight.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(x_head.grad, x_ref.grad, rtol=0, atol=1e-12)
    assert int((head.weight.grad.view(C, -1).abs().sum(dim=1) > 0).sum()) == keep


def test_dense_head_with_sample_rate_matches_chunked() -> None:
    torch.manual_seed(2)
    dense = marginface.create_loss("cosface", C, D, sample_rate=0.4, dtype=torch.float64)
    chunked = marginface.create_loss(
        "cosface", C, D, sample_rate=0.4, impl="chunked", chunk_size=6, dtype=torch.float64
    )
    chunked.load_state_dict(dense.state_dict())
    x = torch.randn(N, D, dtype=torch.float64)
    labels = torch.randint(0, C, (N,))
    state = torch.get_rng_state()
    dense(x, labels).backward()
    torch.set_rng_state(state)
    chunked(x, labels).backward()
    torch.testing.assert_close(chunked.weight.grad, dense.weight.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("sampled", "error", "pattern"),
    [
        ([0, 1], TypeError, "sampled_classes must be an int64 tensor, got list"),
        (torch.tensor([0.0, 1.0]), TypeError, "int64 tensor, got a tensor of dtype torch.float32"),
        (
            torch.tensor([[0, 1]]),
            ValueError,
            r"sampled_classes must have shape \(S,\), got \(1, 2\)",
        ),
        (torch.tensor([0, 1], device="meta"), ValueError, "on the weight's device cpu, got meta"),
    ],
)
def test_bad_sampled_classes_are_named(sampled, error: type, pattern: str) -> None:
    margin, _, weight, _, x, targets, _ = make_case("arcface", torch.float32)
    with pytest.raises(error, match=pattern):
        chunked_margin_cross_entropy(x, weight, targets, margin, sampled_classes=sampled)


@pytest.mark.parametrize("name", ["arcface", "curricularface", "npcface"])
def test_the_custom_ops_take_the_sample_under_compile(name: str) -> None:
    """``torch.compile`` (Dynamo + AOTAutograd) traces the custom ops with the sample as an
    input, without a graph break, and gives eager's loss and gradients."""
    margin, k, weight, sampled, x, targets, upstream = make_case(name, torch.float32)
    margin.eval()  # no state update between the calls

    def loss(x_in: torch.Tensor, w_in: torch.Tensor) -> torch.Tensor:
        return chunked_margin_cross_entropy(
            x_in, w_in, targets, margin, sub_centers=k, chunk_size=5, sampled_classes=sampled
        )

    def step(function):
        x_in = x.clone().requires_grad_(True)
        w_in = weight.clone().requires_grad_(True)
        out = function(x_in, w_in)
        (out * upstream.float()).sum().backward()
        return out.detach(), x_in.grad, w_in.grad

    expected = step(loss)
    torch._dynamo.reset()
    try:
        actual = step(torch.compile(loss, backend="aot_eager", fullgraph=True))
    finally:
        torch._dynamo.reset()
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)
