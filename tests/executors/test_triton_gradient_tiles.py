"""The backward as gradient tiles and GEMMs (``executors/triton_gradient_tiles.py`` and
``triton_dispatch.tile_backward``): the tile kernel's ``G = ∂L/∂(x̂·w)`` against autograd, the
projection kernel against the Jacobian of ``w/‖w‖`` restated here, the class tiles' ranges and
their sum, and the errors at the launchers' boundary. On the CPU the kernels run under Triton's
interpreter (conftest.py); the whole losses against dense are in test_triton.py and
test_binary_triton.py (both backwards)."""

from __future__ import annotations

import copy
from types import ModuleType

import pytest
import torch

from ._compare import DEVICE, relative_error
from .test_triton import CHUNK, C, D, make_case, run

pytest.importorskip("triton")


def _reference_tile(x_hat, weight, labels, scale, grad, k):
    """``G`` and the rows' share by autograd: ``L = Σ_i γ_i LSE_i`` over the non-target logits
    ``z_ij = s_i max_k r_jk x̂_i·w_jk`` (identity rule), so that ``∂L/∂z_ij = γ_i p_ij`` with
    ``p_ij = exp(z_ij - LSE_i)`` (the ``lse`` handed to the kernel), and ``∂L/∂s_i`` is the
    share ``Σ_j γ_i p_ij c_ij``."""
    x64, w64 = x_hat.double(), weight.double()
    inv_norms = 1.0 / w64.norm(dim=1).clamp_min(1e-12)
    product = (x64 @ w64.t()).requires_grad_(True)  # (N, C·K)
    s = scale.double().clone().requires_grad_(True)
    cosine = (product * inv_norms).view(x_hat.shape[0], -1, k).amax(dim=2)  # (N, C)
    logits = s[:, None] * cosine
    target = torch.zeros_like(logits, dtype=torch.bool)
    target[torch.arange(len(labels)), labels] = True
    lse = torch.logsumexp(logits.masked_fill(target, float("-inf")), dim=1)
    tile, share = torch.autograd.grad((grad.double() * lse).sum(), [product, s])
    return tile, share, lse.detach()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 2])
def test_the_tile_is_the_gradient_of_the_nontarget_log_sum_exp(
    k: int, dtype: torch.dtype, kernels: ModuleType
) -> None:
    from marginface.executors.kernel_options import NonTargetRule
    from marginface.executors.triton_gradient_tiles import gradient_tile

    generator = torch.Generator().manual_seed(4)
    n, classes, dim = 9, 21, 24
    x_hat = torch.nn.functional.normalize(torch.randn(n, dim, generator=generator), dim=1)
    weight = torch.randn(classes * k, dim, generator=generator)
    labels = torch.randint(0, classes, (n,), generator=generator)
    scale = torch.full((n,), 8.0) + torch.rand(n, generator=generator)
    grad = torch.rand(n, generator=generator)
    x_in, w_in = x_hat.to(dtype), weight.to(dtype)  # the kernel's inputs, rounded
    expected, expected_share, lse = _reference_tile(x_in, w_in, labels, scale, grad, k)
    inv_norms = 1.0 / weight.to(dtype).float().norm(dim=1)
    tile, share = gradient_tile(
        x_in.to(DEVICE), w_in.to(DEVICE), inv_norms.to(DEVICE), labels.to(DEVICE),
        scale.to(DEVICE), NonTargetRule(), lse.float().to(DEVICE), grad.to(DEVICE),
        sub_centers=k,
    )  # fmt: skip
    assert tile.dtype == dtype and tile.shape == (n, classes * k)
    assert share.dtype == torch.float32 and share.shape == (n,)
    assert (tile[torch.arange(n), labels * k] == 0).all()  # the target column
    # bf16: G is rounded to bf16 (8 significant bits) as the fused kernels round it
    tolerance = 1e-5 if dtype == torch.float32 else 8e-3
    assert relative_error(tile.cpu(), expected) <= tolerance
    assert relative_error(share.cpu(), expected_share) <= 1e-5
    if k == 2:  # the sub-center that did not win gets exactly 0
        pairs = tile.cpu().view(n, classes, 2)
        assert ((pairs[..., 0] == 0) | (pairs[..., 1] == 0)).all()


def test_the_tile_writes_into_padded_rows_and_refuses_an_out_it_cannot_write(
    kernels: ModuleType,
) -> None:
    from marginface.executors.kernel_options import NonTargetRule
    from marginface.executors.triton_gradient_tiles import gradient_tile

    generator = torch.Generator().manual_seed(5)
    x_hat = torch.nn.functional.normalize(torch.randn(5, 16, generator=generator), dim=1)
    weight = torch.randn(11, 16, generator=generator)
    labels = torch.tensor([0, 3, 10, 5, 5])
    scale, lse, grad = (
        torch.full((5,), 4.0),
        torch.full((5,), 3.0),
        torch.rand(5, generator=generator),
    )
    inv_norms = 1.0 / weight.norm(dim=1)
    arguments = [t.to(DEVICE) for t in (x_hat, weight, inv_norms, labels, scale)]
    rows = (lse.to(DEVICE), grad.to(DEVICE))

    def tile(out=None):
        return gradient_tile(*arguments, NonTargetRule(), *rows, sub_centers=1, out=out)

    plain, _ = tile()
    padded = torch.full((5, 16), float("nan"), device=DEVICE)[:, :11]  # rows 16 apart
    written, _ = tile(padded)
    assert written.data_ptr() == padded.data_ptr()
    assert torch.equal(written, plain)
    for wrong in (
        torch.empty(5, 11, dtype=torch.float64, device=DEVICE),  # dtype
        torch.empty(5, 12, device=DEVICE),  # shape
        torch.empty(11, 5, device=DEVICE).t(),  # columns not unit-stride
    ):
        with pytest.raises(
            ValueError, match=r"out must be a torch.float32 tensor of shape \(5, 11\)"
        ):
            tile(wrong)


@pytest.mark.parametrize("dim", [200, 1500])
@pytest.mark.parametrize(
    ("weight_dtype", "out_dtype"),
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, None)],
)
def test_the_projection_is_the_jacobian_of_the_normalization(
    weight_dtype: torch.dtype, out_dtype: torch.dtype | None, dim: int, kernels: ModuleType
) -> None:
    """``∂L/∂w = P - r²(w·P)·w`` (restated in float64), a row of norm 0 (``r = 1/eps``) left
    as ``P``; ``out_dtype`` None: in place, into ``P`` itself. D = 200 is read in one block,
    D = 1500 (over ``PROJECTION_WIDTH``) in blocks of 128, twice."""
    from marginface.executors.dense import NORMALIZE_EPS
    from marginface.executors.triton_gradient_tiles import project_weight_gradient

    generator = torch.Generator().manual_seed(6)
    rows = 37  # neither D a multiple of the kernel's block
    weight = torch.randn(rows, dim, generator=generator).to(weight_dtype)
    weight[7] = 0
    partial = torch.randn(rows, dim, generator=generator)
    norms = weight.double().norm(dim=1).clamp_min(NORMALIZE_EPS)
    inv_norms = (1.0 / norms).float()
    w64, p64 = weight.double(), partial.double()
    coefficient = (w64 * p64).sum(dim=1) / norms**2
    coefficient[7] = 0.0
    expected = p64 - coefficient[:, None] * w64
    partial_in = partial.to(DEVICE)
    out = (
        partial_in if out_dtype is None else torch.empty(rows, dim, dtype=out_dtype, device=DEVICE)
    )
    result = project_weight_gradient(partial_in, weight.to(DEVICE), inv_norms.to(DEVICE), out)
    assert result.data_ptr() == out.data_ptr()
    tolerance = 1e-6 if out.dtype == torch.float32 else 8e-3  # bf16's rounding of the output
    assert relative_error(result.cpu(), expected) <= tolerance
    assert relative_error(result[7].cpu(), partial[7]) <= tolerance  # left as P


def test_the_projection_refuses_what_it_cannot_read(kernels: ModuleType) -> None:
    from marginface.executors.triton_gradient_tiles import project_weight_gradient

    weight, norms = torch.randn(4, 8), torch.ones(4)
    with pytest.raises(TypeError, match="partial must be float32, got torch.bfloat16"):
        project_weight_gradient(torch.zeros(4, 8, dtype=torch.bfloat16), weight, norms, weight)
    with pytest.raises(
        ValueError, match=r"weight_rows must be a contiguous tensor of shape \(4, 8\)"
    ):
        project_weight_gradient(torch.zeros(4, 8), weight[:, :4], norms, weight)
    with pytest.raises(ValueError, match=r"out must be a contiguous tensor of shape \(4, 8\)"):
        project_weight_gradient(torch.zeros(4, 8), weight, norms, torch.zeros(8, 4).t())


def test_float32_product_accumulates_half_inputs_in_float32() -> None:
    from marginface.executors.triton_gradient_tiles import float32_product

    generator = torch.Generator().manual_seed(7)
    a = torch.randn(6, 300, generator=generator).to(torch.bfloat16)
    b = torch.randn(300, 5, generator=generator).to(torch.bfloat16)
    product = float32_product(a, b)
    assert product.dtype == torch.float32
    assert torch.equal(product, a.float() @ b.float())  # half products are exact in float32
    bf16_product = (a @ b).float()  # rounded to bf16 at the end: not what is returned
    assert not torch.equal(product, bf16_product)
    x, y = a.float(), b.float()
    assert torch.equal(float32_product(x, y), x @ y)


@pytest.mark.parametrize("name", ["arcface", "sphereface2"])
def test_the_class_tiles_cover_whole_multiples_within_their_bound(
    name: str, kernels: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a sample the classes go in tiles of a multiple of ``TILE_CLASS_MULTIPLE`` (8
    here) within ``GRADIENT_TILE_BYTES``: room for 2.5 multiples makes 37 classes tiles of 16,
    16 and 5; room for less than one, tiles of 8; the loss and gradients equal those of one
    tile (float32 sums in another order: within 1e-6)."""
    import marginface.executors.triton_binary as binary
    import marginface.executors.triton_dispatch as dispatch
    from marginface.executors import triton_gradient_tiles as tiles

    monkeypatch.setattr(dispatch, "TRITON_BACKWARD", "tiles")
    monkeypatch.setattr(dispatch, "TILE_CLASS_MULTIPLE", 8)
    widths: list[int] = []
    launcher = tiles.kernel_gradient_tile

    def counted(x_hat, weight, *args, **kwargs):
        widths.append(weight.shape[0] // kwargs["sub_centers"])
        return launcher(x_hat, weight, *args, **kwargs)

    monkeypatch.setattr(tiles, "kernel_gradient_tile", counted)
    monkeypatch.setattr(binary, "kernel_gradient_tile", counted)  # its own reference
    margin, k, x, weight, labels, upstream = make_case(name, torch.float32)
    per_class = k * (x.shape[0] * 4 + 4 * D)  # float32 G and P
    results = {}
    for room in (40, 2.5, 0.5):  # multiples of 8 classes' worth of workspace
        monkeypatch.setattr(dispatch, "GRADIENT_TILE_BYTES", int(room * 8 * per_class))
        widths.clear()
        results[room] = run("triton", copy.deepcopy(margin), k, x, weight, labels, upstream)
        assert widths == {40: [C], 2.5: [16, 16, 5], 0.5: [8, 8, 8, 8, 5]}[room]
    for room in (2.5, 0.5):
        for a, e in zip(results[room], results[40], strict=True):
            assert relative_error(a, e) <= 1e-6


def test_an_unknown_backward_is_refused(kernels: ModuleType, monkeypatch: pytest.MonkeyPatch):
    import marginface.executors.triton_dispatch as dispatch

    monkeypatch.setattr(dispatch, "TRITON_BACKWARD", "split")
    margin, k, x, weight, labels, upstream = make_case("cosface", torch.float32)
    with pytest.raises(
        ValueError, match=r"TRITON_BACKWARD must be one of \('tiles', 'fused'\), got 'split'"
    ):
        run("triton", margin, k, x, weight, labels, upstream, CHUNK)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("indexed", [False, True])
def test_the_inverse_norms_kernel_reads_the_rows_in_place(
    dtype: torch.dtype, indexed: bool, kernels: ModuleType
) -> None:
    """``1 / max(‖w‖, eps)`` in float32 from rows of any dtype, every row or those of an index
    (a Partial FC sample's), as ``vector_norm`` of the float32 rows gives; a zero row ``1/eps``."""
    from marginface.executors.dense import NORMALIZE_EPS
    from marginface.executors.triton_weight_norms import inverse_norms

    generator = torch.Generator().manual_seed(8)
    weight = (torch.randn(45, 300, generator=generator) * 3).to(dtype)
    weight[5] = 0
    index = torch.tensor([44, 0, 5, 17, 17, 3]) if indexed else None
    rows = weight if index is None else weight[index]
    expected = 1.0 / torch.linalg.vector_norm(rows.float(), dim=1).clamp_min(NORMALIZE_EPS)
    on_device = None if index is None else index.to(DEVICE)
    actual = inverse_norms(weight.to(DEVICE), NORMALIZE_EPS, on_device)
    assert actual.dtype == torch.float32 and actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-6, atol=0.0)
    with pytest.raises(ValueError, match=r"weight must be a 2-D tensor with unit stride along D"):
        inverse_norms(weight.t(), NORMALIZE_EPS)


def test_tuned_tiles_apply_to_half_cuda_launches_of_their_rules_with_one_center() -> None:
    """``launch_blocks`` takes ``TUNED_BLOCKS[kernel]`` only for bf16/fp16 CUDA tensors, a rule
    of ``TUNED_RULES`` and K = 1 (where they were measured and compile without spills); every
    other launch keeps ``default_blocks``. It reads only the tensor's device and dtype."""
    from types import SimpleNamespace

    from marginface.executors.kernel_options import (
        TUNED_BLOCKS,
        TUNED_RULES,
        default_blocks,
        launch_blocks,
    )

    assert set(TUNED_BLOCKS) == {"statistics", "gradient_tile"} and TUNED_RULES == ("identity",)
    default = default_blocks(512, 5461, 512)
    for kernel, tuned in TUNED_BLOCKS.items():
        for dtype in (torch.bfloat16, torch.float16):
            cuda = SimpleNamespace(is_cuda=True, dtype=dtype)
            assert (
                launch_blocks(kernel, cuda, 512, 5461, 512, rule="identity", sub_centers=1) == tuned
            )
            for rule, k in (("curricular", 1), ("identity", 2)):
                assert (
                    launch_blocks(kernel, cuda, 512, 5461, 512, rule=rule, sub_centers=k) == default
                )
        for x in (
            SimpleNamespace(is_cuda=True, dtype=torch.float32),
            SimpleNamespace(is_cuda=False, dtype=torch.bfloat16),
        ):
            assert (
                launch_blocks(kernel, x, 512, 5461, 512, rule="identity", sub_centers=1) == default
            )
    bf16 = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)
    assert (
        launch_blocks("binary_gradient_tile", bf16, 512, 5461, 512, rule="identity", sub_centers=1)
        == default
    )


def test_a_label_offset_equals_shifted_labels_and_the_share_can_be_left_out(
    kernels: ModuleType,
) -> None:
    """A class tile of a larger weight: the labels unshifted with ``label_offset = start`` give
    the tile of the labels shifted by ``start`` (rows whose target lies outside the tile have no
    target column there); ``share=False`` leaves the share out (None) and ``G`` unchanged."""
    from marginface.executors.kernel_options import NonTargetRule
    from marginface.executors.triton_gradient_tiles import gradient_tile

    generator = torch.Generator().manual_seed(9)
    n, classes, dim, start, stop = 7, 40, 16, 13, 29
    x_hat = torch.nn.functional.normalize(torch.randn(n, dim, generator=generator), dim=1)
    weight = torch.randn(classes, dim, generator=generator)
    labels = torch.tensor([0, 13, 14, 20, 28, 29, 39])  # outside, first, inside, last, outside
    scale, lse = torch.full((n,), 6.0), torch.full((n,), 4.0)
    grad = torch.rand(n, generator=generator)
    inv_norms = 1.0 / weight.norm(dim=1)
    on = [t.to(DEVICE) for t in (x_hat, weight[start:stop], inv_norms[start:stop])]
    rows = (scale.to(DEVICE), NonTargetRule(), lse.to(DEVICE), grad.to(DEVICE))
    shifted, shifted_share = gradient_tile(*on, (labels - start).to(DEVICE), *rows, sub_centers=1)
    offset, offset_share = gradient_tile(
        *on, labels.to(DEVICE), *rows, sub_centers=1, label_offset=start
    )
    assert torch.equal(offset, shifted) and torch.equal(offset_share, shifted_share)
    inside = (labels >= start) & (labels < stop)
    targets = offset.cpu()[inside.nonzero().squeeze(1), labels[inside] - start]
    assert (targets == 0).all() and (offset.cpu()[~inside] != 0).all()
    alone, none = gradient_tile(
        *on, labels.to(DEVICE), *rows, sub_centers=1, label_offset=start, share=False
    )
    assert none is None and torch.equal(alone, offset)


def test_add_float32_product_adds_in_float32() -> None:
    from marginface.executors.triton_gradient_tiles import add_float32_product

    generator = torch.Generator().manual_seed(10)
    a = torch.randn(5, 70, generator=generator).to(torch.bfloat16)
    b = torch.randn(70, 3, generator=generator).to(torch.bfloat16)
    total = torch.randn(5, 3, generator=generator)
    expected = total + a.float() @ b.float()
    first = add_float32_product(None, a, b)
    assert first.dtype == torch.float32 and torch.equal(first, a.float() @ b.float())
    added = add_float32_product(total.clone(), a, b)
    torch.testing.assert_close(added, expected, rtol=1e-6, atol=1e-6)
    x, y = a.float(), b.float()
    in_place = total.clone()
    assert add_float32_product(in_place, x, y) is in_place  # float32 adds in place
    torch.testing.assert_close(in_place, expected, rtol=1e-6, atol=1e-6)
