"""The row-block tiling of the chunk loop (``impl="row_block"``, ``row_block=``) equals the dense
executor: loss, gradients and margin state, for every loss; and ``impl="auto"``'s choice."""

from __future__ import annotations

import pytest
import torch

import marginface
from marginface import head as head_module
from marginface.executors import chunk_loop
from marginface.executors.chunked import chunked_margin_cross_entropy
from marginface.executors.dense import dense_margin_cross_entropy
from marginface.margins import ArcFaceMargin, CurricularFaceMargin

from .test_chunked import (
    ALL,
    ANGLE_LOSSES,
    ARCCOS_TOLERANCE,
    OPTIONS,
    TOLERANCE,
    D,
    N,
    make_batch,
    relative_error,
)

SOFTMAX = [name for name in ALL if marginface.create_loss(name, 3, 2).margin.objective == "softmax"]
"""The losses with a row-block tiling: the softmax ones (a one-vs-all loss has no log-sum-exp to
complete per block; it refuses ``row_block``)."""

# (C, chunk_size, row_block): blocks that do and do not divide N = 24, one row per block, one
# block of all rows, a block larger than the batch; chunks that do and do not divide C, one
# chunk, one class per chunk.
LAYOUTS = [(37, 5, 7), (40, 8, 24), (37, 37, 1), (37, 64, 100), (7, 1, 5)]


def make_pair(name: str, c: int, dtype: torch.dtype, **kwargs):
    """Two copies of a registered loss with the same weight and state: dense and row-block."""
    options = {**OPTIONS.get(name, {}), **kwargs}
    row_block = options.pop("row_block", None)
    dense = marginface.create_loss(name, c, D, dtype=dtype, impl="dense", **options)
    rows = marginface.create_loss(
        name, c, D, dtype=dtype, impl="row_block", row_block=row_block, **options
    )
    rows.load_state_dict(dense.state_dict())
    return dense, rows


def step(loss_fn, x: torch.Tensor, labels: torch.Tensor, seed: torch.Tensor | None):
    """One forward + backward (``seed``: a per-row upstream gradient of a ``"none"``
    reduction, or None for the head's scalar loss); returns (loss, ∂x, ∂W)."""
    x = x.clone().requires_grad_(True)
    loss_fn.weight.grad = None
    loss = loss_fn(x, labels)
    (loss if seed is None else (loss * seed).sum()).backward()
    return loss.detach(), x.grad, loss_fn.weight.grad


def assert_matches(dense, rows, c: int, dtype: torch.dtype, name: str, uniform: bool) -> None:
    """Two training steps: loss, ∂x, ∂W and the margin's buffers agree within the tolerance of
    tests/executors/test_chunked.py."""
    tolerance = (ARCCOS_TOLERANCE if name in ANGLE_LOSSES else TOLERANCE)[dtype]
    for seed in range(2):  # the second step runs on the updated margin state
        x, labels = make_batch(c, dtype, seed)
        upstream = None if uniform else torch.rand(N, dtype=dtype)
        expected = step(dense, x, labels, upstream)
        actual = step(rows, x, labels, upstream)
        for what, a, e in zip(("loss", "∂x", "∂W"), actual, expected, strict=True):
            assert a.dtype == e.dtype
            assert relative_error(a, e) <= tolerance, (what, relative_error(a, e))
        for key, buffer in dense.margin.state_dict().items():
            other = rows.margin.state_dict()[key]
            assert relative_error(other.double(), buffer.double()) <= tolerance, key


@pytest.mark.parametrize("name", SOFTMAX)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("num_classes", "chunk_size", "row_block"), LAYOUTS)
def test_matches_dense_mean(
    name: str, dtype: torch.dtype, num_classes: int, chunk_size: int, row_block: int
) -> None:
    """``reduction="mean"``: the gradients formed in the forward, scaled by the one upstream
    gradient in the backward."""
    dense, rows = make_pair(name, num_classes, dtype, chunk_size=chunk_size, row_block=row_block)
    assert_matches(dense, rows, num_classes, dtype, name, uniform=True)


@pytest.mark.parametrize("name", SOFTMAX)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_dense_any_upstream(name: str, dtype: torch.dtype) -> None:
    """``reduction="none"`` with a different upstream gradient per row: exact too (the
    class-chunked backward runs after the row-block forward)."""
    dense, rows = make_pair(name, 37, dtype, chunk_size=5, row_block=7, reduction="none")
    assert_matches(dense, rows, 37, dtype, name, uniform=False)


def _count_recomputing_backward(monkeypatch) -> list[int]:
    """A list that gets one entry per call of the class-chunked (recomputing) backward."""
    calls: list[int] = []
    original = chunk_loop.nontarget_gradient
    monkeypatch.setattr(
        "marginface.executors.chunked_function.nontarget_gradient",
        lambda *a, **k: calls.append(1) or original(*a, **k),
    )
    return calls


def test_uniform_upstream_skips_the_recomputing_backward(monkeypatch) -> None:
    """With a scalar loss the backward multiplies no chunk again (3 GEMMs per chunk, not 4);
    with per-row upstream gradients it runs the class-chunked backward."""
    calls = _count_recomputing_backward(monkeypatch)
    head = marginface.ArcFaceLoss(37, D, impl="row_block", row_block=7, chunk_size=5)
    x, labels = make_batch(37, torch.float32)
    x.requires_grad_(True)
    head(x, labels).backward()
    assert calls == []
    head.reduction = "none"
    (head(x, labels) * torch.rand(N)).sum().backward()
    assert calls == [1]


def test_a_frozen_weight_keeps_the_one_pass_per_row_block(monkeypatch) -> None:
    """Only ``x`` needs a gradient (a frozen class-center matrix, e.g. fine-tuning the
    backbone): the forward still forms the gradients in its one pass per row block, so the
    scalar loss's backward multiplies no chunk again."""
    calls = _count_recomputing_backward(monkeypatch)
    head = marginface.ArcFaceLoss(37, D, impl="row_block", row_block=7, chunk_size=5)
    head.weight.requires_grad_(False)
    x, labels = make_batch(37, torch.float32)
    x.requires_grad_(True)
    head(x, labels).backward()
    assert calls == [] and x.grad is not None and head.weight.grad is None


def test_products_are_multiplied_once_per_chunk(monkeypatch) -> None:
    """One forward + backward multiplies each (row block, chunk) once for the logits and
    twice for the gradients: 3 GEMMs, the backward reads the forward's kept products."""
    count = {"gemm": 0}

    def counting(original):
        def wrapper(*args, **kwargs):
            count["gemm"] += 1
            return original(*args, **kwargs)

        return wrapper

    head = marginface.ArcFaceLoss(40, D, impl="row_block", row_block=8, chunk_size=10)
    x, labels = make_batch(40, torch.float32)
    x.requires_grad_(True)
    monkeypatch.setattr(torch, "mm", counting(torch.mm))
    monkeypatch.setattr(torch.Tensor, "addmm_", counting(torch.Tensor.addmm_))
    head(x, labels).backward()
    blocks, chunks = N // 8, 40 // 10
    assert count["gemm"] == 3 * blocks * chunks


@pytest.mark.parametrize("sub_centers", [1, 3])
def test_gradcheck_float64(sub_centers: int) -> None:
    """``gradcheck`` of the per-row loss (any upstream gradient) and of its sum (one upstream
    gradient: the forward-formed gradients), CurricularFace (a non-identity rule, per-row
    parameters cut per block), sub-centers."""
    generator = torch.Generator().manual_seed(0)
    c = 11
    x = torch.randn(5, 6, generator=generator, dtype=torch.float64, requires_grad=True)
    w = torch.randn(c * sub_centers, 6, generator=generator, dtype=torch.float64)
    w.requires_grad_(True)
    labels = torch.tensor([0, 3, 10, 10, 4])
    margin = CurricularFaceMargin(scale=4.0).double().eval()

    def per_row(x_in: torch.Tensor, w_in: torch.Tensor) -> torch.Tensor:
        return chunked_margin_cross_entropy(
            x_in, w_in, labels, margin, sub_centers=sub_centers, chunk_size=4, row_block=2
        )

    assert torch.autograd.gradcheck(per_row, (x, w))
    # A second backward through the same graph (gradcheck's reentrancy check) no longer has
    # the forward-formed gradients (handed over to the first) and runs the class-chunked
    # backward: equal within float64 rounding, not bit for bit.
    summed = lambda a, b: per_row(a, b).sum()  # noqa: E731
    assert torch.autograd.gradcheck(summed, (x, w), nondet_tol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_partial_fc_matches_chunked(dtype: torch.dtype) -> None:
    """Partial FC (a sample of the classes, read in place): the same loss and gradients as the
    class-chunked executor on the same sample, zero outside it."""
    heads = {}
    for impl in ("chunked", "row_block"):
        heads[impl] = marginface.ArcFaceLoss(
            60, D, impl=impl, chunk_size=7, row_block=5, sample_rate=0.5, dtype=dtype
        )
    heads["row_block"].load_state_dict(heads["chunked"].state_dict())
    x, labels = make_batch(60, dtype)
    results = {}
    for impl, head in heads.items():
        torch.manual_seed(3)  # the same sample
        results[impl] = step(head, x, labels, None)
    tolerance = TOLERANCE[dtype]
    for a, e in zip(results["row_block"], results["chunked"], strict=True):
        assert relative_error(a, e) <= tolerance
    untouched = (results["chunked"][2] == 0).all(dim=1)
    assert untouched.any()
    assert (results["row_block"][2][untouched] == 0).all()


def test_bf16_weight_close_to_dense() -> None:
    """A bf16 weight: the products kept in bf16, within the chunked executor's bf16 bounds
    (docs/fused.md: loss 2u, gradients 64u relative, u = 2^-8)."""
    u = 2.0**-8
    dense, rows = make_pair("arcface", 37, torch.bfloat16, chunk_size=5, row_block=7)
    x, labels = make_batch(37, torch.float32)
    expected = step(dense, x.bfloat16(), labels, None)
    actual = step(rows, x.bfloat16(), labels, None)
    bounds = (2 * u, 64 * u, 64 * u)
    for a, e, bound in zip(actual, expected, bounds, strict=True):
        assert relative_error(a.float(), e.float()) <= bound


def test_frozen_weight_and_no_grad() -> None:
    """A frozen weight gets no gradient; a forward under ``no_grad`` (evaluation) forms none
    and returns the same loss."""
    dense, rows = make_pair("arcface", 37, torch.float32, chunk_size=5, row_block=7)
    x, labels = make_batch(37, torch.float32)
    with torch.no_grad():
        assert relative_error(rows(x, labels), dense(x, labels)) <= 1e-6
    rows.weight.requires_grad_(False)
    x.requires_grad_(True)
    rows(x, labels).backward()
    assert rows.weight.grad is None
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_weight_gradient_is_not_copied() -> None:
    """The weight gradient formed in the forward becomes ``weight.grad`` itself (autograd
    takes the buffer: no second weight-sized copy)."""
    head = marginface.ArcFaceLoss(37, D, impl="row_block", row_block=7, chunk_size=5)
    x, labels = make_batch(37, torch.float32)
    seen = []
    head.weight.register_hook(lambda grad: seen.append(grad.data_ptr()))
    head(x, labels).backward()
    assert seen == [head.weight.grad.data_ptr()]


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("bad", [0, -3])
def test_bad_row_block_value(bad: int) -> None:
    with pytest.raises(ValueError, match="row_block"):
        marginface.ArcFaceLoss(10, D, impl="row_block", row_block=bad)
    x, labels = make_batch(10, torch.float32)
    with pytest.raises(ValueError, match="row_block"):
        chunked_margin_cross_entropy(x, torch.randn(10, D), labels, ArcFaceMargin(), row_block=bad)


@pytest.mark.parametrize("bad", ["8", 2.5, True])
def test_bad_row_block_type(bad) -> None:
    with pytest.raises(TypeError, match="row_block"):
        marginface.ArcFaceLoss(10, D, impl="row_block", row_block=bad)


def test_row_block_refuses_triton_kernels() -> None:
    head = marginface.ArcFaceLoss(10, D, impl="row_block", kernels="triton")
    x, labels = make_batch(10, torch.float32)
    with pytest.raises(ValueError, match="row_block runs on PyTorch ops only"):
        head(x, labels)


def test_unchunkable_margin_refused() -> None:
    class WholeMatrix(ArcFaceMargin):
        def apply(self, cosine, labels, norms=None):
            return super().apply(cosine, labels, norms)

    with pytest.raises(ValueError, match="WholeMatrix"):
        marginface.MarginSoftmaxLoss(10, D, WholeMatrix(), impl="row_block")


def test_functional_row_block_matches_dense() -> None:
    """``chunked_margin_cross_entropy(..., row_block=)`` equals the dense function."""
    x, labels = make_batch(37, torch.float64)
    w = torch.randn(37, D, dtype=torch.float64)
    margin = ArcFaceMargin()
    expected = dense_margin_cross_entropy(x, w, labels, margin)
    actual = chunked_margin_cross_entropy(x, w, labels, margin, chunk_size=5, row_block=7)
    assert relative_error(actual, expected) <= 1e-12


# ---------------------------------------------------------------- impl="auto"
def auto_head(budget: int, *, dim: int = 512, reduction: str = "mean", c: int = 100, **options):
    return marginface.ArcFaceLoss(
        c, dim, impl="auto", memory_budget=budget, reduction=reduction, **options
    )


def test_auto_picks_dense_then_one_row_block_then_chunked() -> None:
    """Given N, C and the budget (C = 100, D = 512: 400 bytes of products a row, 1600 bytes of
    dense matrices): dense while they fit; else one row block of all N <= 1024 rows if its
    store fits; else chunked."""
    assert auto_head(1600 * 64).executor(64) == "dense"
    head = auto_head(1600 * 64 - 1)
    assert head.executor(64) == "row_block" and head.row_block_rows(64) == 64  # one block
    assert auto_head(400 * 1024).executor(1024) == "row_block"  # 409,600 bytes fit
    assert auto_head(400 * 1024 - 1).executor(1024) == "chunked"  # never several blocks
    assert auto_head(1 << 30).executor(1025) == "dense"  # dense fits 1 GiB
    assert auto_head(1600 * 1025 - 1).executor(1025) == "chunked"  # N > ROW_BLOCK_MAX_ROWS
    assert auto_head(0).executor(1) == "chunked"
    assert head_module.ROW_BLOCK_MAX_ROWS == 1024 and head_module.ROW_BLOCK_MIN_DIM == 128


def test_auto_row_block_only_where_measured_faster(monkeypatch) -> None:
    """Not for D < 128, not for a float16/float64 weight (not measured), not for
    reduction="none" (per-row upstream gradients pay the class-chunked backward too), not under
    torch.compile (a graph break); a bf16 weight (2 bytes a product) takes it."""
    budget = 1600 * 64 - 1
    assert auto_head(budget).executor(64) == "row_block"
    assert auto_head(400 * 64, dim=128).executor(64) == "row_block"
    assert auto_head(200 * 64, dim=64).executor(64) == "chunked"
    assert auto_head(200 * 64, dtype=torch.bfloat16).executor(64) == "row_block"
    assert auto_head(200 * 64 - 1, dtype=torch.bfloat16).executor(64) == "chunked"
    assert auto_head(budget, dtype=torch.float16).executor(64) == "chunked"
    assert auto_head(3200 * 64 - 1, dtype=torch.float64).executor(64) == "chunked"
    assert auto_head(budget, reduction="none").executor(64) == "chunked"
    assert auto_head(budget, reduction="sum").executor(64) == "row_block"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert auto_head(budget).executor(64) == "chunked"
    assert auto_head(1 << 20).executor(64) == "dense"


def test_auto_row_block_step_matches_dense() -> None:
    """A step that impl="auto" runs with a row block equals the dense step."""
    dense = marginface.ArcFaceLoss(100, 512, impl="dense")
    auto = marginface.ArcFaceLoss(100, 512, impl="auto", memory_budget=400 * 48)
    auto.load_state_dict(dense.state_dict())
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(48, 512, generator=generator)
    labels = torch.randint(0, 100, (48,), generator=generator)
    assert auto.executor(48) == "row_block" and auto.row_block_rows(48) == 48
    for a, e in zip(step(auto, x, labels, None), step(dense, x, labels, None), strict=True):
        assert relative_error(a, e) <= 1e-5


def test_repr_names_row_block() -> None:
    head = marginface.ArcFaceLoss(10, D, impl="row_block", row_block=4)
    assert "impl='row_block'" in repr(head) and "row_block=4" in repr(head)


def test_store_is_allocated_once_per_step() -> None:
    """The row blocks share one store of products (``B×C`` floats, allocated once per step,
    not once per block), the weight's gradient is allocated once, and nothing else is larger
    than a block's chunk of logits or ``N×D``."""
    from torch.profiler import ProfilerActivity, profile

    n, d, c, chunk, rows = 64, 8, 1000, 100, 16  # 4 blocks of 10 chunks
    head = marginface.ArcFaceLoss(c, d, impl="row_block", row_block=rows, chunk_size=chunk)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=generator).requires_grad_(True)
    labels = torch.randint(0, c, (n,), generator=generator)
    head(x, labels).backward()
    head.zero_grad(set_to_none=True)
    x.grad = None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        head(x, labels).backward()
    leaves = ("aten::empty", "aten::empty_strided")
    sizes = [e.cpu_memory_usage for e in prof.events() if e.name in leaves]
    store, weight_bytes = rows * c * 4, c * d * 4
    assert sizes.count(store) == 1, sizes
    assert sizes.count(weight_bytes) == 1, sizes
    others = [s for s in sizes if s not in (store, weight_bytes)]
    assert max(others) <= max(rows * chunk * 4, n * d * 4)


@pytest.mark.parametrize("name", ["arcface", "curricularface", "adacos"])
def test_interclass_filtering_and_eval_mode(name: str) -> None:
    """Inter-class filtering (cosines above τ count as 0, value and gradient) in training, and
    eval mode (margins with state read it, do not update it)."""
    dense, rows = make_pair(
        name, 37, torch.float64, chunk_size=5, row_block=7, interclass_filtering_threshold=0.1
    )
    assert_matches(dense, rows, 37, torch.float64, name, uniform=True)
    dense.eval(), rows.eval()
    assert_matches(dense, rows, 37, torch.float64, name, uniform=True)


def test_auto_keeps_the_graph_whole_under_compile() -> None:
    """A batch that eager ``impl="auto"`` runs with row blocks runs chunked (the custom ops)
    under ``torch.compile``: no graph break; ``impl="row_block"`` itself breaks it."""
    auto = marginface.ArcFaceLoss(100, 512, impl="auto", memory_budget=1600 * 64 - 1)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 512, generator=generator, requires_grad=True)
    labels = torch.randint(0, 100, (64,), generator=generator)
    assert auto.executor(64) == "row_block"
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(auto)(x, labels)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    rows = marginface.ArcFaceLoss(100, 512, impl="row_block")
    torch._dynamo.reset()
    assert torch._dynamo.explain(rows)(x, labels).graph_break_count >= 1
    torch._dynamo.reset()


def test_bad_impl_names_the_choices() -> None:
    with pytest.raises(ValueError, match="impl must be one of .*'row_block'.*got 'rows'"):
        marginface.ArcFaceLoss(10, D, impl="rows")


@pytest.mark.parametrize("name", ["sphereface2", "uniface"])
def test_one_vs_all_losses_refuse_row_blocks_and_auto_keeps_them_chunked(name: str) -> None:
    loss = marginface.create_loss(name, 100, 512, impl="row_block")
    x, labels = torch.randn(8, 512), torch.randint(0, 100, (8,))
    with pytest.raises(ValueError, match=r"row_block tiles the softmax reduction.*row_block=8"):
        loss(x, labels)
    auto = marginface.create_loss(name, 100, 512, impl="auto", memory_budget=1600 * 64 - 1)
    assert auto.executor(64) == "chunked"  # an ArcFace head picks "row_block" here
