"""The chunked executor equals the dense one: loss, gradients and margin state, for every loss."""

from __future__ import annotations

import pytest
import torch

import marginface
from marginface.executors import backend as backend_module
from marginface.executors.chunked import check_chunkable, chunked_margin_cross_entropy
from marginface.executors.dense import dense_margin_cross_entropy
from marginface.margins import ArcFaceMargin, Margin

ALL = marginface.list_losses()
D, N = 16, 24
OPTIONS: dict[str, dict] = {"elasticface": {"seed": 0}}
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}
ARCCOS_TOLERANCE = {torch.float32: 1e-2, torch.float64: 2 * torch.finfo(torch.float64).eps ** 0.5}
"""Losses whose non-target logits depend on an angle's value: every logit on ``θ = arccos(cos θ)``
(Li-ArcFace), or every non-target weight on ``cos(θ_y + m) = cos θ_y cos m - sin θ_y sin m``
(ArcNegFace). ``θ`` and ``sin θ = sqrt(1 - cos²θ)`` have infinite slope at ``cos θ = ±1``, so where
a cosine is one ulp from 1 (here: the batch's first rows lie on class centers, drawn from the same
seed as the weight) the two executors' cosines, one ulp apart, give values ``sqrt(2·ulp)`` apart
(float64: ``2·sqrt(eps)``), and derivatives ``1/sin θ`` between ``1/sqrt(2·ulp)`` and the cap
``1/sqrt(SIN2_FLOOR)`` (float32: measured up to 1.9e-3 relative on ∂x; bound 1e-2). Every other
loss keeps :data:`TOLERANCE`."""
ANGLE_LOSSES = {"li-arcface", "arcnegface"}

# (C, chunk_size): not dividing C, dividing C, exactly one chunk, C smaller than one chunk,
# chunks of a single class (a chunk can hold only the target).
LAYOUTS = [(37, 5), (40, 8), (37, 37), (37, 64), (7, 1)]


def make_pair(name: str, c: int, dtype: torch.dtype, **kwargs):
    """Two copies of a registered loss with the same weight and state: dense and chunked."""
    options = {**OPTIONS.get(name, {}), **kwargs}
    dense = marginface.create_loss(name, c, D, dtype=dtype, impl="dense", **options)
    chunked = marginface.create_loss(name, c, D, dtype=dtype, impl="chunked", **options)
    chunked.load_state_dict(dense.state_dict())
    return dense, chunked


def make_batch(c: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings with norms ~ 30 (inside MagFace's range) and labels in the first and last
    class (so in the first and last chunk), plus random ones."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=generator, dtype=dtype) * 8
    labels = torch.randint(0, c, (N,), generator=generator)
    labels[0], labels[1], labels[2] = 0, c - 1, c - 1
    return x, labels


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|a - e| / max|e|`` (0 if both are zero)."""
    scale = expected.detach().abs().max()
    difference = (actual.detach() - expected.detach()).abs().max()
    return float(difference / scale) if scale > 0 else float(difference)


def step(loss_fn, x: torch.Tensor, labels: torch.Tensor, seed: torch.Tensor):
    """One forward + backward with a random upstream gradient; returns (loss, ∂x, ∂W)."""
    x = x.clone().requires_grad_(True)
    loss_fn.weight.grad = None
    loss = loss_fn(x, labels)
    (loss * seed).sum().backward()
    return loss.detach(), x.grad, loss_fn.weight.grad


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("num_classes", "chunk_size"), LAYOUTS)
def test_matches_dense(name: str, dtype: torch.dtype, num_classes: int, chunk_size: int) -> None:
    dense, chunked = make_pair(name, num_classes, dtype, reduction="none", chunk_size=chunk_size)
    tolerance = (ARCCOS_TOLERANCE if name in ANGLE_LOSSES else TOLERANCE)[dtype]
    for seed in range(2):  # two training steps: the second runs on the updated margin state
        x, labels = make_batch(num_classes, dtype, seed)
        upstream = torch.rand(N, dtype=dtype)
        expected = step(dense, x, labels, upstream)
        actual = step(chunked, x, labels, upstream)
        for what, a, e in zip(("loss", "∂x", "∂W"), actual, expected, strict=True):
            assert a.dtype == e.dtype
            assert relative_error(a, e) <= tolerance, (what, relative_error(a, e))
        for key, buffer in dense.margin.state_dict().items():
            other = chunked.margin.state_dict()[key]
            assert relative_error(other.double(), buffer.double()) <= tolerance, key


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("signs", ["mixed", "negative"])
def test_upstream_gradient_of_either_sign_matches_dense(name: str, signs: str) -> None:
    """An upstream gradient ``γ_i`` below zero for some rows (a loss subtracted, a weighting
    of either sign) or for all: the folded backward writes ``γ_i s_i e^{s_i c_ij - lse_i}`` as
    ``sign(γ_i s_i)·e^{... - log|γ_i s_i|}``, so a lost sign shows in ∂x and ∂W."""
    dense, chunked = make_pair(name, 37, torch.float64, reduction="none", chunk_size=5)
    x, labels = make_batch(37, torch.float64)
    upstream = torch.rand(N, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    upstream = -(upstream + 0.1)
    if signs == "mixed":
        upstream[::2] *= -1.0
    tolerance = (ARCCOS_TOLERANCE if name in ANGLE_LOSSES else TOLERANCE)[torch.float64]
    expected = step(dense, x, labels, upstream)
    actual = step(chunked, x, labels, upstream)
    for what, a, e in zip(("loss", "∂x", "∂W"), actual, expected, strict=True):
        assert relative_error(a, e) <= tolerance, (what, relative_error(a, e))


@pytest.mark.parametrize("name", ["adacos", "elasticface", "curricularface", "sphereface"])
def test_eval_mode_matches_dense(name: str) -> None:
    dense, chunked = make_pair(name, 37, torch.float64, chunk_size=6)
    dense.eval()
    chunked.eval()
    x, labels = make_batch(37, torch.float64)
    upstream = torch.ones((), dtype=torch.float64)
    for a, e in zip(
        step(chunked, x, labels, upstream), step(dense, x, labels, upstream), strict=True
    ):
        assert relative_error(a, e) <= 1e-12


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("sub_centers", [1, 3])
def test_reductions_and_sub_centers(reduction: str, sub_centers: int) -> None:
    dense, chunked = make_pair(
        "subcenter-arcface", 23, torch.float64, sub_centers=sub_centers, reduction=reduction,
        chunk_size=4,
    )  # fmt: skip
    assert chunked.weight.shape == (23 * sub_centers, D)
    x, labels = make_batch(23, torch.float64)
    upstream = torch.rand(N if reduction == "none" else (), dtype=torch.float64)
    for a, e in zip(
        step(chunked, x, labels, upstream), step(dense, x, labels, upstream), strict=True
    ):
        assert relative_error(a, e) <= 1e-12


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gradient": "straight_through"},
        {"policy": "easy"},
        {"policy": "clip"},
        {"policy": "none"},
    ],
)
def test_arcface_variants_match_dense(kwargs: dict) -> None:
    dense, chunked = make_pair("arcface", 19, torch.float64, chunk_size=4, **kwargs)
    x, labels = make_batch(19, torch.float64)
    upstream = torch.ones((), dtype=torch.float64)
    for a, e in zip(
        step(chunked, x, labels, upstream), step(dense, x, labels, upstream), strict=True
    ):
        assert relative_error(a, e) <= 1e-12


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("sphereface", {"scale": 30.0}),
        ("elasticface", {"plus": True, "kind": "cos"}),
        ("adacos", {"dynamic": False}),
        ("cosface", {"conditional": True}),
    ],
)
def test_margin_options_match_dense(name: str, kwargs: dict) -> None:
    dense, chunked = make_pair(name, 19, torch.float64, chunk_size=4, **kwargs)
    x, labels = make_batch(19, torch.float64)
    upstream = torch.ones((), dtype=torch.float64)
    for a, e in zip(
        step(chunked, x, labels, upstream), step(dense, x, labels, upstream), strict=True
    ):
        assert relative_error(a, e) <= 1e-12


def test_zero_embedding_and_zero_center_match_dense() -> None:
    dense, chunked = make_pair("cosface", 11, torch.float64, chunk_size=3)
    with torch.no_grad():
        dense.weight[4].zero_()
        chunked.weight[4].zero_()
    x, labels = make_batch(11, torch.float64)
    x[5] = 0.0
    labels[6] = 4  # a target whose center is zero
    upstream = torch.ones((), dtype=torch.float64)
    for a, e in zip(
        step(chunked, x, labels, upstream), step(dense, x, labels, upstream), strict=True
    ):
        assert torch.isfinite(a).all()
        assert relative_error(a, e) <= 1e-12


def test_gradcheck_float64() -> None:
    margin = ArcFaceMargin(0.3, 8.0)
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 8, 3, 3, 5])

    def loss(x_: torch.Tensor, w_: torch.Tensor) -> torch.Tensor:
        return chunked_margin_cross_entropy(x_, w_, labels, margin, chunk_size=4)

    assert torch.autograd.gradcheck(loss, (x, w))


def test_frozen_weight_gets_no_gradient() -> None:
    _, chunked = make_pair("arcface", 13, torch.float32, chunk_size=5)
    chunked.weight.requires_grad_(False)
    x, labels = make_batch(13, torch.float32)
    x.requires_grad_(True)
    chunked(x, labels).backward()
    assert chunked.weight.grad is None and x.grad is not None and x.grad.abs().sum() > 0


def test_never_saves_the_logit_matrix() -> None:
    c, n = 4000, 64
    loss_fn = marginface.ArcFaceLoss(c, D, impl="chunked", chunk_size=256)
    x = torch.randn(n, D, requires_grad=True)
    labels = torch.randint(0, c, (n,))
    sizes: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(x, labels)
    loss.backward()
    assert sizes, "the hook saw no saved tensor"
    assert max(sizes) <= c * D < n * c  # the weight is the largest thing kept


def test_bfloat16_weight_and_inputs_accumulate_in_float32() -> None:
    dense, chunked = make_pair("arcface", 300, torch.bfloat16, chunk_size=64)
    x, labels = make_batch(300, torch.float32)
    x = x.to(torch.bfloat16)
    upstream = torch.ones((), dtype=torch.float32)
    expected = step(dense, x, labels, upstream)
    actual = step(chunked, x, labels, upstream)
    assert actual[0].dtype == torch.float32  # the loss is accumulated in fp32
    assert actual[1].dtype == actual[2].dtype == torch.bfloat16
    # bf16 GEMMs: cosines to ~3 significant digits, times s = 64.
    assert relative_error(actual[0], expected[0]) <= 2e-2
    for a, e in zip(actual[1:], expected[1:], strict=True):
        assert torch.isfinite(a.float()).all()
        assert relative_error(a.float(), e.float()) <= 0.1


class _WholeMatrixMargin(Margin):
    """A margin that overrides ``apply`` (needs the full cosine matrix)."""

    def scale_for(self, norms):
        return 1.0

    def target_cosine(self, cos_target, norms, context):
        return cos_target

    def apply(self, cosine, labels, norms=None):
        return cosine - cosine.mean(dim=1, keepdim=True)


def test_unchunkable_margin_raises_for_chunked() -> None:
    with pytest.raises(ValueError, match=r"_WholeMatrixMargin overrides Margin\.apply.*dense"):
        marginface.MarginSoftmaxLoss(5, 3, _WholeMatrixMargin(), impl="chunked")
    with pytest.raises(ValueError, match=r"overrides Margin\.apply"):
        chunked_margin_cross_entropy(
            torch.randn(2, 3), torch.randn(5, 3), torch.tensor([0, 1]), _WholeMatrixMargin()
        )
    with pytest.raises(TypeError, match="margin must be a marginface Margin"):
        check_chunkable(object())  # type: ignore[arg-type]


def test_invalid_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="impl must be one of 'dense', 'chunked', 'auto'"):
        marginface.ArcFaceLoss(10, D, impl="fused")
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        marginface.ArcFaceLoss(10, D, impl="chunked", chunk_size=0)
    with pytest.raises(TypeError, match="chunk_size must be an integer"):
        marginface.ArcFaceLoss(10, D, impl="chunked", chunk_size=8.5)
    margin = ArcFaceMargin()
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got -3"):
        chunked_margin_cross_entropy(
            torch.randn(2, 3), torch.randn(6, 3), torch.tensor([0, 1]), margin, chunk_size=-3
        )
    with pytest.raises(ValueError, match=r"weight must have shape \(C·K, D\) with K = .* 4"):
        chunked_margin_cross_entropy(
            torch.randn(2, 3), torch.randn(6, 3), torch.tensor([0, 1]), margin, sub_centers=4
        )


def test_invalid_kernels_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    args = (torch.randn(2, 3), torch.randn(6, 3), torch.tensor([0, 1]), ArcFaceMargin())
    with pytest.raises(ValueError, match="kernels must be one of 'auto', 'torch', 'triton'"):
        chunked_margin_cross_entropy(*args, kernels="fast")
    monkeypatch.setenv("MARGINFACE_KERNELS", "fast")
    with pytest.raises(ValueError, match=r"MARGINFACE_KERNELS must be one of .*got 'fast'"):
        chunked_margin_cross_entropy(*args)
    monkeypatch.setenv("MARGINFACE_KERNELS", "torch")
    assert torch.isfinite(chunked_margin_cross_entropy(*args)).all()
    monkeypatch.setattr(backend_module, "triton_available", lambda: False)
    with pytest.raises(ValueError, match="kernels='triton' needs triton installed"):
        chunked_margin_cross_entropy(*args, kernels="triton")


def test_the_head_and_create_loss_take_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kernels=`` is an argument of the head (and of ``create_loss`` through it), checked at
    construction; None reads MARGINFACE_KERNELS at each step's entry."""
    with pytest.raises(
        ValueError, match=r"kernels must be one of 'auto', 'torch', 'triton'.*'fast'"
    ):
        marginface.ArcFaceLoss(10, D, impl="chunked", kernels="fast")
    with pytest.raises(ValueError, match=r"kernels must be one of .*got 'fast'"):
        marginface.create_loss("cosface", 10, D, impl="chunked", kernels="fast")
    x, labels = torch.randn(4, D), torch.tensor([0, 1, 2, 3])
    torch_loss = marginface.create_loss("cosface", 10, D, impl="chunked", kernels="torch")
    assert torch_loss.kernels == "torch" and "kernels='torch'" in repr(torch_loss)
    monkeypatch.setenv("MARGINFACE_KERNELS", "fast")  # not read: kernels was given
    assert torch.isfinite(torch_loss(x, labels))
    from_env = marginface.create_loss("cosface", 10, D, impl="chunked")
    with pytest.raises(ValueError, match=r"MARGINFACE_KERNELS must be one of .*got 'fast'"):
        from_env(x, labels)
    monkeypatch.setattr(backend_module, "triton_available", lambda: False)
    triton_loss = marginface.create_loss("cosface", 10, D, impl="chunked", kernels="triton")
    with pytest.raises(ValueError, match="kernels='triton' needs triton installed"):
        triton_loss(x, labels)


def test_repr_names_the_executor() -> None:
    assert "impl='chunked', chunk_size=128" in repr(
        marginface.ArcFaceLoss(10, D, impl="chunked", chunk_size=128)
    )


def test_dense_function_is_the_reference() -> None:
    """Sanity check of the reference itself against a hand-written ArcFace cross-entropy."""
    x = torch.randn(6, 4, dtype=torch.float64)
    w = torch.randn(9, 4, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3, 8, 8])
    cos = torch.nn.functional.normalize(x, dim=1) @ torch.nn.functional.normalize(w, dim=1).t()
    theta = torch.arccos(cos.gather(1, labels[:, None]).clamp(-1, 1))
    logits = 64.0 * cos.scatter(1, labels[:, None], torch.cos(theta + 0.5))
    expected = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    margin = ArcFaceMargin(0.5, 64.0, policy="none")
    actual = chunked_margin_cross_entropy(x, w, labels, margin, chunk_size=2)
    assert relative_error(actual, expected) <= 1e-12
    assert relative_error(dense_margin_cross_entropy(x, w, labels, margin), expected) <= 1e-12


class _OwnRuleCurricularFace(marginface.margins.CurricularFaceMargin):
    """CurricularFace's rule written as another margin's own ``nontarget_cosine``: the custom
    ops do not know it, so the chunked executor runs its autograd Function (the path the
    sharded head takes too)."""

    def nontarget_cosine(self, cosine, context):
        return super().nontarget_cosine(cosine, context)


def test_a_rule_the_ops_do_not_know_runs_the_function_path_and_matches_dense() -> None:
    from marginface.executors.fused_op import nontarget_rule

    assert nontarget_rule(_OwnRuleCurricularFace()) is None
    dense = marginface.MarginSoftmaxLoss(37, D, _OwnRuleCurricularFace(), reduction="none")
    chunked = marginface.MarginSoftmaxLoss(
        37, D, _OwnRuleCurricularFace(), reduction="none", impl="chunked", chunk_size=5
    )
    chunked.load_state_dict(dense.state_dict())
    for seed in range(2):
        x, labels = make_batch(37, torch.float32, seed)
        upstream = torch.rand(N)
        expected = step(dense, x, labels, upstream)
        actual = step(chunked, x, labels, upstream)
        for a, e in zip(actual, expected, strict=True):
            assert relative_error(a, e) <= 1e-5
        assert relative_error(chunked.margin.t, dense.margin.t) <= 1e-6
