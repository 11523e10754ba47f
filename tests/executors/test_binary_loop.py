"""The one-vs-all reduction on one process: the loss restated from its formula, chunked = dense
(sub-centers, Partial FC), the bias's gradient (float64 gradcheck), the errors, the functional
API and the memory bound."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import marginface
from marginface.executors.binary_loop import ChunkedBinaryLoss
from marginface.executors.chunked import chunked_margin_cross_entropy
from marginface.executors.dense import normalized_cosine
from marginface.executors.margin_loss import binary_cross_entropy
from marginface.functional import margin_cross_entropy
from marginface.margins import SphereFace2Margin, UniFaceMargin
from marginface.margins.binary import softplus
from marginface.margins.sphereface2 import similarity_adjustment

N, C, D = 9, 13, 6
BINARY = ["sphereface2", "sphereface2-a", "sphereface2-m", "uniface", "uniface-a"]


def _data(seed: int = 0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=generator, dtype=dtype) * 3
    labels = torch.randint(0, C, (N,), generator=generator)
    return x, labels


def test_softplus_is_exact_where_f_softplus_is_not():
    z = torch.tensor([-800.0, -30.0, 0.0, 21.0, 800.0], dtype=torch.float64)
    expected = torch.log1p(torch.exp(-z.abs())) + z.clamp_min(0)
    assert torch.equal(softplus(z), expected)
    assert float(softplus(torch.tensor(21.0, dtype=torch.float64)) - 21.0) > 7e-10  # e^-21
    assert float(F.softplus(torch.tensor(21.0, dtype=torch.float64)) - 21.0) == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softplus_slope_is_the_sigmoid_at_zero_too(dtype):
    """``d softplus/dz = sigmoid(z)`` everywhere, ``1/2`` at ``z = 0`` exactly (a float32 logit
    can be exactly 0; ``clamp_min(0) + log1p(e^{-|z|})`` had slope 1 there)."""
    z = torch.tensor([-800.0, -3.0, -1e-30, 0.0, 1e-30, 3.0, 800.0], dtype=dtype)
    z.requires_grad_(True)
    softplus(z).sum().backward()
    assert torch.allclose(z.grad, torch.sigmoid(z.detach()), rtol=0, atol=1e-7)
    assert float(z.grad[3]) == 0.5


@pytest.mark.parametrize("name", ["uniface", "sphereface2-m"])
def test_dense_gradient_at_an_exactly_zero_logit_matches_the_chunked_one(name):
    """A non-target logit exactly 0 in float32 (the bias set to cancel it; on CUDA's precision
    matrix shapes, N = 250, C = 5003, one such entry occurred by chance): the dense path's
    gradients equal the chunked path's (which takes ``sigmoid`` directly) in float32."""
    x, labels = _data(dtype=torch.float32)
    loss = marginface.create_loss(name, C, D)
    margin, weight = loss.margin, loss.weight.detach().float()
    cosine = normalized_cosine(x, weight, 1)
    i, j = 0, int(labels[0] + 1) % C
    with torch.no_grad():
        margin.bias.zero_()
        z0 = margin.nontarget_logit(cosine, margin.bias)[i, j]
        margin.bias.fill_(-float(z0) * margin.bias_sign)
        assert float(margin.nontarget_logit(cosine, margin.bias)[i, j]) == 0.0
    gradients = {}
    for path in ("dense", "chunked"):
        xs, ws = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        if path == "dense":
            out = binary_cross_entropy(margin.apply(normalized_cosine(xs, ws, 1), labels),
                                       labels, margin)  # fmt: skip
        else:
            out = chunked_margin_cross_entropy(xs, ws, labels, margin, chunk_size=5)
        out.sum().backward()
        gradients[path] = (xs.grad, ws.grad)
    for dense, chunked in zip(gradients["dense"], gradients["chunked"], strict=True):
        assert (dense - chunked).abs().max() <= 1e-5 * chunked.abs().max()


def test_sphereface2_c_loss_is_its_formula():
    """``w/r·[λ·softplus(-(r(g(c_y) - m) + b)) + (1 - λ)Σ softplus(r(g(c_j) + m) + b)]``."""
    x, labels = _data()
    loss_fn = marginface.SphereFace2Loss(C, D, dtype=torch.float64, reduction="none")
    cos = F.normalize(x) @ F.normalize(loss_fn.weight.detach()).t()
    b, r, m, lam, w = float(loss_fn.margin.bias), 40.0, 0.4, 0.7, 50.0
    g = 2.0 * ((cos + 1) / 2) ** 3 - 1
    one_hot = F.one_hot(labels, C).bool()
    positive = torch.log1p(torch.exp(-(r * (g - m) + b)))[one_hot]
    negative = torch.where(one_hot, 0.0, torch.log1p(torch.exp(r * (g + m) + b))).sum(dim=1)
    expected = w / r * (lam * positive + (1 - lam) * negative)
    torch.testing.assert_close(loss_fn(x, labels), expected, rtol=1e-12, atol=1e-12)


def test_uniface_loss_is_its_formula():
    x, labels = _data(1)
    loss_fn = marginface.UniFaceLoss(C, D, negative_weight=0.3, dtype=torch.float64)
    cos = F.normalize(x) @ F.normalize(loss_fn.weight.detach()).t()
    b = float(loss_fn.margin.bias)
    assert b == pytest.approx(float(torch.tensor(float(torch.log(torch.tensor(10.0 * C))))))
    one_hot = F.one_hot(labels, C).bool()
    positive = torch.log1p(torch.exp(-(64 * (cos - 0.4) - b)))[one_hot]
    negative = torch.where(one_hot, 0.0, torch.log1p(torch.exp(64 * cos - b))).sum(dim=1)
    expected = (positive + 0.3 * negative).mean()
    torch.testing.assert_close(loss_fn(x, labels), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("policy", ["linear", "clip", "easy", "none"])
def test_uniface_a_loss_is_its_formula(policy):
    """``softplus(b - s·cos(θ_y + m)) + λ·Σ_j softplus(s·cos θ_j - b)``, the target through
    ``θ = arccos`` with ArcFace's ``policy`` where ``θ_y + m >= π`` (rows pointed away from
    their class reach it)."""
    x, labels = _data(1)
    loss_fn = marginface.create_loss(
        "uniface-a", C, D, negative_weight=0.3, policy=policy, dtype=torch.float64
    )
    w = loss_fn.weight.detach()
    x[::3] = -F.normalize(w[labels[::3]], dim=1) * 5.0 + 0.1 * x[::3]  # θ_y near π
    cos = F.normalize(x) @ F.normalize(w).t()
    b, m = float(loss_fn.margin.bias), 0.5
    cos_y = cos.gather(1, labels[:, None]).squeeze(1)
    theta = torch.arccos(cos_y)
    beyond = theta + m >= math.pi
    assert beyond.any() and not beyond.all()
    shifted = torch.cos(theta + m)
    target = {
        "linear": torch.where(beyond, cos_y - math.sin(math.pi - m) * m, shifted),
        "clip": torch.where(beyond, -1.0, shifted),
        "easy": torch.where(cos_y > 0, shifted, cos_y),
        "none": shifted,
    }[policy]
    one_hot = F.one_hot(labels, C).bool()
    positive = torch.log1p(torch.exp(-(64 * target - b)))
    negative = torch.where(one_hot, 0.0, torch.log1p(torch.exp(64 * cos - b))).sum(dim=1)
    expected = (positive + 0.3 * negative).mean()
    torch.testing.assert_close(loss_fn(x, labels), expected, rtol=1e-12, atol=1e-12)


def test_uniface_a_with_no_margin_is_uniface_with_no_margin():
    x, labels = _data(2)
    values = []
    for name in ("uniface", "uniface-a"):
        torch.manual_seed(3)
        loss_fn = marginface.create_loss(name, C, D, margin=0.0, dtype=torch.float64)
        values.append(loss_fn(x, labels))
    torch.testing.assert_close(values[0], values[1], rtol=1e-13, atol=1e-13)


def test_power_one_and_no_margin_is_plain_cosine_for_every_variant():
    """With ``t = 1`` the adjustment is the identity, and with ``m = 0`` (C, A) or ``m = 1``
    (M) the three variants are the same loss (a degenerate identity)."""
    x, labels = _data(2)
    values = []
    for variant, m in (("C", 0.0), ("A", 0.0), ("M", 1.0)):
        loss_fn = marginface.SphereFace2Loss(
            C, D, m, variant=variant, power=1.0, dtype=torch.float64
        )
        torch.manual_seed(3)
        loss_fn.reset_parameters()
        values.append(loss_fn(x, labels))
    torch.testing.assert_close(values[0], values[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(values[0], values[2], rtol=1e-12, atol=1e-12)
    c = torch.linspace(-1, 1, 7, dtype=torch.float64)
    torch.testing.assert_close(similarity_adjustment(c, 1.0), c, rtol=0, atol=1e-15)


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("sub_centers", [1, 3])
def test_chunked_equals_dense_with_sub_centers(name, sub_centers):
    x, labels = _data(4)
    results = []
    for impl in ("dense", "chunked"):
        torch.manual_seed(0)
        loss_fn = marginface.create_loss(
            name, C, D, dtype=torch.float64, impl=impl, chunk_size=4, sub_centers=sub_centers
        )
        xi = x.clone().requires_grad_(True)
        value = loss_fn(xi, labels)
        grads = torch.autograd.grad(value, [xi, loss_fn.weight, loss_fn.margin.bias])
        results.append((value, *grads))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_partial_fc_sums_the_sampled_classes_only_not_reweighted(impl):
    """Partial FC: the one-vs-all loss over the sampled classes (positives always among them),
    the negative terms not scaled by ``C_neg / sampled``; unsampled centers get no gradient."""
    x, labels = _data(5)
    torch.manual_seed(0)
    loss_fn = marginface.create_loss(
        "sphereface2", C, D, dtype=torch.float64, impl=impl, chunk_size=3, sample_rate=0.6
    ).train()
    torch.manual_seed(7)
    targets, sampled = loss_fn._classes_of_step(labels)
    assert sampled is not None and sampled.numel() < C
    torch.manual_seed(7)
    value = loss_fn(x, labels)
    value.backward()
    with torch.no_grad():
        logits = loss_fn.logits(x, labels)[:, sampled]  # (N, S)
        one_hot = F.one_hot(targets, sampled.numel()).bool()
        positive = softplus(-logits[one_hot])
        negative = torch.where(one_hot, 0.0, softplus(logits)).sum(dim=1)
        margin = loss_fn.margin
        expected = (margin.positive_weight * positive + margin.negative_weight * negative).mean()
    torch.testing.assert_close(value.detach(), expected, rtol=1e-12, atol=1e-12)
    unsampled = torch.ones(C, dtype=torch.bool)
    unsampled[sampled] = False
    assert torch.equal(loss_fn.weight.grad[unsampled], torch.zeros_like(loss_fn.weight[unsampled]))
    assert float(loss_fn.margin.bias.grad.abs()) > 0


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize(
    "margin",
    [
        SphereFace2Margin(num_classes=C),
        SphereFace2Margin(0.7, variant="A", num_classes=C),
        SphereFace2Margin(1.6, variant="M", power=2.5, num_classes=C),
        UniFaceMargin(num_classes=C, negative_weight=0.5),
    ],
    ids=["C", "A", "M", "uniface"],
)
def test_gradcheck_in_x_weight_and_bias(margin, impl):
    """float64 gradcheck of the loss in the embeddings, the centers and the bias."""
    margin = margin.double()
    x, labels = _data(6)
    x = x[:5]
    labels = labels[:5]
    weight = torch.randn(C, D, dtype=torch.float64, generator=torch.Generator().manual_seed(9))

    def loss_of(embeddings, centers, bias):
        if impl == "dense":  # the margin with its bias replaced by the input
            cosine = normalized_cosine(embeddings, centers)
            logits = torch.func.functional_call(margin, {"bias": bias}, (cosine, labels))
            return binary_cross_entropy(logits, labels, margin).sum()
        return ChunkedBinaryLoss.apply(
            embeddings, centers, bias, labels, labels, margin, 1, 4, torch.float64, None, None
        ).sum()

    bias = margin.bias.detach().clone().requires_grad_(True)
    inputs = (x.clone().requires_grad_(True), weight.requires_grad_(True), bias)
    assert torch.autograd.gradcheck(loss_of, inputs, eps=1e-6, atol=1e-6)


def test_functional_api_reduces_one_vs_all():
    cosine = torch.tanh(torch.randn(N, C, dtype=torch.float64))
    labels = torch.randint(0, C, (N,))
    margin = UniFaceMargin(num_classes=C).double()
    logits = margin(cosine, labels)
    one_hot = F.one_hot(labels, C).bool()
    expected = (
        softplus(-logits[one_hot]) + torch.where(one_hot, 0.0, softplus(logits)).sum(dim=1)
    ).mean()
    torch.testing.assert_close(margin_cross_entropy(cosine, labels, margin), expected)


def test_kernels_triton_needs_a_declared_rule_naming_the_margin():
    """A binary margin whose non-target rule the kernels do not compile is refused by name
    (the declared ones run: tests/executors/test_binary_triton.py)."""

    class Shifted(UniFaceMargin):
        def nontarget_similarity(self, cosine):
            return cosine * 0.5

    x, labels = _data(7, torch.float32)
    margin = Shifted(num_classes=C)
    assert margin.binary_kernel_parameters() is None
    with pytest.raises(ValueError, match="Shifted's non-target rule has no Triton kernel"):
        chunked_margin_cross_entropy(x, torch.randn(C, D), labels, margin, kernels="triton")


@pytest.mark.parametrize(
    ("options", "error", "text"),
    [
        ({"variant": "B"}, ValueError, r"variant must be one of 'C', 'A', 'M', got 'B'"),
        ({"variant": "M", "margin": 0.5}, ValueError, r"margin must be >= 1 for variant 'M'"),
        ({"variant": "A", "margin": 4.0}, ValueError, r"margin must be < 3.14"),
        ({"margin": -0.1}, ValueError, r"margin must be >= 0"),
        ({"balance": 1.0}, ValueError, r"balance must be < 1"),
        ({"balance": 0.0}, ValueError, r"balance must be > 0"),
        ({"power": 0.5}, ValueError, r"power must be >= 1, got 0.5"),
        ({"loss_weight": 0.0}, ValueError, r"loss_weight must be > 0"),
        ({"scale": -1.0}, ValueError, r"scale must be > 0"),
        ({"balance": "0.7"}, TypeError, r"balance must be a real number"),
    ],
)
def test_sphereface2_bad_options_raise_naming_them(options, error, text):
    with pytest.raises(error, match=text):
        marginface.SphereFace2Loss(C, D, **options)


@pytest.mark.parametrize(
    ("options", "error", "text"),
    [
        ({"negative_weight": -1.0}, ValueError, r"negative_weight must be >= 0"),
        ({"clamp_logits": 1}, TypeError, r"clamp_logits must be a bool, got 1"),
        ({"margin": float("nan")}, ValueError, r"margin must be finite"),
        ({"scale": 0.0}, ValueError, r"scale must be > 0"),
        ({"variant": "M"}, ValueError, r"variant must be one of 'C', 'A', got 'M'"),
        ({"variant": "A", "margin": 3.2}, ValueError, r"margin must be < 3.14"),
        ({"variant": "A", "policy": "wrap"}, ValueError, r"policy must be one of .*'wrap'"),
    ],
)
def test_uniface_bad_options_raise_naming_them(options, error, text):
    with pytest.raises(error, match=text):
        marginface.UniFaceLoss(C, D, **options)


def test_the_bias_is_a_parameter_trained_and_saved():
    loss_fn = marginface.create_loss("sphereface2", C, D)
    assert "margin.bias" in dict(loss_fn.named_parameters())
    state = loss_fn.state_dict()
    assert state["margin.bias"].shape == ()
    other = marginface.create_loss("sphereface2", C, D)
    with torch.no_grad():
        other.margin.bias.fill_(3.0)
    other.load_state_dict(state)
    assert float(other.margin.bias) == float(loss_fn.margin.bias)
    x, labels = _data(8, torch.float32)
    optimizer = torch.optim.SGD(loss_fn.parameters(), lr=0.1)
    before = float(loss_fn.margin.bias)
    loss_fn(x, labels).backward()
    optimizer.step()
    assert float(loss_fn.margin.bias) != before


@pytest.mark.parametrize("name", ["sphereface2", "uniface"])
def test_chunked_step_never_allocates_n_by_c(name):
    """Every tensor a chunked training step allocates is at most one chunk's ``N×c`` (float32)
    or the weight's gradient: nothing of size ``N×C``."""
    from torch.profiler import ProfilerActivity, profile

    n, d, c, chunk = 64, 16, 4096, 256
    head = marginface.create_loss(name, c, d, impl="chunked", chunk_size=chunk)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=generator).requires_grad_(True)
    labels = torch.randint(0, c, (n,), generator=generator)
    head(x, labels).backward()  # warm-up
    head.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        head(x, labels).backward()
    sizes = [
        e.cpu_memory_usage
        for e in prof.events()
        if e.name in ("aten::empty", "aten::empty_strided")
    ]
    weight_bytes = c * d * 4
    others = [s for s in sizes if s != weight_bytes]
    assert weight_bytes in sizes
    assert max(others) <= n * chunk * 4, max(others)
    assert c >= 16 * chunk  # the bound is 16 times below one N×C matrix


@pytest.mark.parametrize(
    "margin",
    [
        SphereFace2Margin(num_classes=C),
        SphereFace2Margin(1.6, variant="M", power=2.5, num_classes=C),
        UniFaceMargin(num_classes=C, scale=8.0, clamp_logits=True),
    ],
    ids=["C", "M", "uniface-clamped"],
)
def test_gradcheck_of_the_custom_op_path(margin):
    """The chunked entry point runs declared rules on the custom ops (executors/fused_op.py):
    float64 gradcheck in the embeddings and the centers there too."""
    margin = margin.double()
    x, labels = _data(11)
    x, labels = x[:5], labels[:5]
    weight = torch.randn(C, D, dtype=torch.float64, generator=torch.Generator().manual_seed(4))

    def loss_of(embeddings, centers):
        return chunked_margin_cross_entropy(embeddings, centers, labels, margin, chunk_size=4).sum()

    inputs = (x.clone().requires_grad_(True), weight.requires_grad_(True))
    assert torch.autograd.gradcheck(loss_of, inputs, eps=1e-6, atol=1e-6)


class _HalfCosine(UniFaceMargin):
    """``g(c) = c/2 + 0.1``: a non-target rule the custom operators and the kernels do not
    compile, so the chunked step runs the PyTorch passes of ``binary_loop``."""

    def nontarget_similarity(self, cosine):
        return 0.5 * cosine + 0.1

    def nontarget_similarity_slope(self, cosine):
        return torch.full_like(cosine, 0.5)


def _step(loss_fn, x, labels, seed=7):
    xi = x.clone().requires_grad_(True)
    torch.manual_seed(seed)  # the same Partial FC sample on both executors
    value = loss_fn(xi, labels)
    return (value, *torch.autograd.grad(value, [xi, loss_fn.weight, loss_fn.margin.bias]))


@pytest.mark.parametrize("chunk_size", [1, 4])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"clamp_logits": True, "scale": 8.0},
        {"interclass_filtering_threshold": 0.3},
        {"sub_centers": 2, "sample_rate": 0.6},
    ],
)
def test_a_margin_without_a_declared_rule_runs_the_pytorch_passes_equal_to_dense(
    options, chunk_size
):
    """The chunked step of a margin whose rule is not declared (``_nontarget_sums``,
    ``_nontarget_gradient``): loss, ∂x, ∂W and ∂b equal the dense step's in float64, with the
    clamp, inter-class filtering, sub-centers and a Partial FC sample."""
    head_options = {k: options[k] for k in ("sub_centers", "sample_rate") if k in options}
    margin_options = {k: v for k, v in options.items() if k not in head_options}
    x, labels = _data(11)
    results = []
    for impl in ("dense", "chunked"):
        torch.manual_seed(0)
        margin = _HalfCosine(num_classes=C, **margin_options)
        assert margin.binary_kernel_parameters() is None
        loss_fn = marginface.MarginSoftmaxLoss(
            C, D, margin, impl=impl, chunk_size=chunk_size, dtype=torch.float64, **head_options
        ).train()
        results.append(_step(loss_fn, x, labels))
    for what, ours, dense in zip(["loss", "∂x", "∂W", "∂b"], *results, strict=True):
        torch.testing.assert_close(ours, dense, rtol=1e-10, atol=1e-12, msg=what)


def test_each_margin_takes_its_pass(monkeypatch):
    """A declared rule without filtering runs on the custom operators; with filtering, on the
    autograd Function with the rule's in-place passes; an undeclared rule on the PyTorch
    passes (the choice changes memory and compilation, not values)."""
    from marginface.executors import binary_loop

    calls: list[str] = []

    def spy(name):
        original = getattr(binary_loop, name)

        def wrapper(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        monkeypatch.setattr(binary_loop, name, wrapper)

    for name in (
        "fused_binary_loss", "rule_sums", "rule_gradient", "_nontarget_sums", "_nontarget_gradient"
    ):  # fmt: skip
        spy(name)
    x, labels = _data(12, torch.float32)
    cases = [
        (UniFaceMargin(num_classes=C), ["fused_binary_loss"]),
        (
            UniFaceMargin(num_classes=C, interclass_filtering_threshold=0.3),
            ["rule_sums", "rule_gradient"],
        ),
        (_HalfCosine(num_classes=C), ["_nontarget_sums", "_nontarget_gradient"]),
    ]
    for margin, expected in cases:
        calls.clear()
        loss_fn = marginface.MarginSoftmaxLoss(C, D, margin, impl="chunked", chunk_size=4)
        loss_fn(x.clone().requires_grad_(True), labels).backward()
        assert calls == expected, (margin, calls)


@pytest.mark.parametrize("scale", [0.5, 1.0])
def test_a_clamp_at_or_below_one_is_applied_on_the_custom_operators(scale):
    """UniFace's clamp ``L = s`` with ``s <= 1``: the chunked step (custom operators) clamps as
    the dense one does (most non-target logits ``s·c - b`` are below ``-s`` here)."""
    x, labels = _data(13)
    results = []
    for impl in ("dense", "chunked"):
        torch.manual_seed(0)
        loss_fn = marginface.create_loss(
            "uniface", C, D, scale=scale, clamp_logits=True, impl=impl, chunk_size=4,
            dtype=torch.float64,
        )  # fmt: skip
        results.append(_step(loss_fn, x, labels))
    for what, ours, dense in zip(["loss", "∂x", "∂W", "∂b"], *results, strict=True):
        torch.testing.assert_close(ours, dense, rtol=1e-10, atol=1e-12, msg=what)
