"""The one-vs-all reduction on its Triton kernels (``executors/triton_binary.py``; compiled on
CUDA, Triton's interpreter on the CPU, see conftest.py) against the PyTorch chunk loop: loss,
∂x, ∂W and ∂b, float32 and bf16 weights, sub-centers, the straight-through gradient and
UniFace's clamp (reached by the inputs)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

import marginface

from ._compare import BINARY_KERNEL_LAUNCHERS, DEVICE, backward_launcher, relative_error

N, C, D, CHUNK = 20, 37, 24, 16
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 5e-2)}
"""Relative error (loss, gradients), as test_triton.py's: bf16 GEMMs round their output to bf16
on the PyTorch path (~3 significant digits) where the kernels accumulate in float32."""
CASES = [
    ("sphereface2", {}),
    ("sphereface2", {"sub_centers": 2, "power": 2.5}),
    ("sphereface2-a", {"gradient": "straight_through"}),
    ("sphereface2-m", {}),
    ("uniface", {"clamp_logits": True, "scale": 10.0}),
    ("uniface", {"margin": 0.0, "negative_weight": 0.5}),
    ("uniface-a", {}),
]


def _run(name, options, kernels, dtype, x, labels, upstream):
    torch.manual_seed(1)
    loss_fn = marginface.create_loss(
        name, C, D, impl="chunked", chunk_size=CHUNK, kernels=kernels, reduction="none",
        device=DEVICE, dtype=dtype, **options,
    )  # fmt: skip
    xi = x.clone().requires_grad_(True)
    value = loss_fn(xi, labels)
    grads = torch.autograd.grad((value * upstream).sum(), [xi, loss_fn.weight, loss_fn.margin.bias])
    return (value.detach(), *grads), loss_fn


@pytest.mark.parametrize("backward", ["tiles", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_kernels_match_the_pytorch_chunk_loop(
    name: str, options: dict, dtype: torch.dtype, backward: str, kernels: ModuleType, monkeypatch
) -> None:
    """Both backwards on the kernels (gradient tiles and GEMMs; the fused kernels) give the
    PyTorch chunk loop's loss and gradients."""
    import marginface.executors.triton_binary as binary_kernels
    import marginface.executors.triton_dispatch as dispatch

    monkeypatch.setattr(dispatch, "TRITON_BACKWARD", backward)

    launched = []
    for launcher in BINARY_KERNEL_LAUNCHERS:
        original = getattr(binary_kernels, launcher)

        def counted(*args, _original=original, _name=launcher, **kwargs):
            launched.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(binary_kernels, launcher, counted)
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(N, D, generator=generator) * 3).to(DEVICE)
    labels = torch.randint(0, C, (N,), generator=generator).to(DEVICE)
    labels[0], labels[1] = 0, C - 1  # the first and the last chunk
    upstream = torch.rand(N, generator=generator).to(DEVICE)
    expected, reference = _run(name, options, "torch", dtype, x, labels, upstream)
    actual, _ = _run(name, options, "triton", dtype, x, labels, upstream)
    backward = backward_launcher(binary=True)
    assert set(launched) == {"binary_sums", backward} | (
        {"binary_weight_gradient"} if backward == "binary_embedding_gradient" else set()
    )
    loss_tolerance, gradient_tolerance = TOLERANCE[dtype]
    for what, a, e in zip(("loss", "∂x", "∂W", "∂b"), actual, expected, strict=True):
        assert torch.isfinite(a).all(), what
        tolerance = loss_tolerance if what == "loss" else gradient_tolerance
        assert relative_error(a, e) <= tolerance, (what, relative_error(a, e))
    if options.get("clamp_logits"):  # the inputs reach the clamp (logits held at ±s)
        with torch.no_grad():
            logits = reference.logits(x, labels)
        assert int((logits.abs() == options["scale"]).sum()) >= 3


@pytest.mark.parametrize(
    ("name", "options"),
    [("sphereface2", {"sub_centers": 2}), ("uniface", {"clamp_logits": True, "scale": 10.0})],
)
def test_partial_fc_sample_on_the_kernels_matches_the_pytorch_chunk_loop(
    name: str, options: dict, kernels: ModuleType, monkeypatch
) -> None:
    """A Partial FC sample (half the classes, three chunks of gathered rows): the kernels
    launched once per chunk, loss and every gradient equal to the PyTorch loop's on the same
    sample (unsampled rows of ∂W exactly 0 on both)."""
    import marginface.executors.triton_binary as binary_kernels

    launched = []
    for launcher in BINARY_KERNEL_LAUNCHERS:
        original = getattr(binary_kernels, launcher)

        def counted(*args, _original=original, _name=launcher, **kwargs):
            launched.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(binary_kernels, launcher, counted)
    generator = torch.Generator().manual_seed(3)
    x = (torch.randn(N, D, generator=generator) * 3).to(DEVICE)
    labels = torch.randint(0, C, (N,), generator=generator).to(DEVICE)
    upstream = torch.rand(N, generator=generator).to(DEVICE)
    options = {**options, "sample_rate": 0.9}
    expected, _ = _run(name, options, "torch", torch.float32, x, labels, upstream)
    actual, _ = _run(name, options, "triton", torch.float32, x, labels, upstream)
    sampled_rows = expected[2].abs().sum(dim=1) > 0  # (C·K,)
    assert 0 < int(sampled_rows.sum()) < expected[2].shape[0]  # some classes left out
    assert torch.equal(actual[2].abs().sum(dim=1) > 0, sampled_rows)
    chunks = launched.count("binary_sums")
    assert chunks >= 2 and launched.count(backward_launcher(binary=True)) == chunks
    for what, a, e in zip(("loss", "∂x", "∂W", "∂b"), actual, expected, strict=True):
        assert relative_error(a, e) <= 1e-5, (what, relative_error(a, e))


def test_kernels_refuse_filtering_naming_the_margin(kernels: ModuleType) -> None:
    x = torch.randn(6, D).to(DEVICE)
    labels = torch.randint(0, C, (6,)).to(DEVICE)
    filtered = marginface.create_loss(
        "uniface", C, D, impl="chunked", kernels="triton", interclass_filtering_threshold=0.3,
        device=DEVICE,
    )  # fmt: skip
    with pytest.raises(ValueError, match="UniFaceMargin: interclass_filtering_threshold"):
        filtered(x, labels)


def test_a_chunk_wider_than_one_class_tile_matches_the_pytorch_chunk_loop(
    kernels: ModuleType,
) -> None:
    """150 classes in one chunk: three 64-class tiles per launch (``pid > 0``), loss and every
    gradient equal to the PyTorch loop's."""
    generator = torch.Generator().manual_seed(4)
    classes = 150
    x = (torch.randn(N, D, generator=generator) * 3).to(DEVICE)
    labels = torch.randint(0, classes, (N,), generator=generator).to(DEVICE)
    upstream = torch.rand(N, generator=generator).to(DEVICE)
    results = []
    for choice in ("torch", "triton"):
        torch.manual_seed(1)
        loss_fn = marginface.create_loss(
            "sphereface2", classes, D, impl="chunked", chunk_size=classes, kernels=choice,
            reduction="none", device=DEVICE,
        )  # fmt: skip
        xi = x.clone().requires_grad_(True)
        value = loss_fn(xi, labels)
        grads = torch.autograd.grad(
            (value * upstream).sum(), [xi, loss_fn.weight, loss_fn.margin.bias]
        )
        results.append((value.detach(), *grads))
    for what, a, e in zip(("loss", "∂x", "∂W", "∂b"), results[1], results[0], strict=True):
        assert relative_error(a, e) <= 1e-5, (what, relative_error(a, e))


def test_the_autograd_function_on_the_kernels_matches_the_pytorch_passes(
    kernels: ModuleType,
) -> None:
    """``ChunkedBinaryLoss`` (the sharded head's step) with ``triton=True`` against
    ``triton=False``: the kernels there see the margin's own negative weight (SphereFace2's
    ``w(1 - λ)/r``, not 1 as in the custom operators)."""
    from marginface.executors.binary_loop import ChunkedBinaryLoss

    generator = torch.Generator().manual_seed(5)
    x = (torch.randn(N, D, generator=generator) * 3).to(DEVICE)
    labels = torch.randint(0, C, (N,), generator=generator).to(DEVICE)
    upstream = torch.rand(N, generator=generator).to(DEVICE)
    loss_fn = marginface.create_loss("sphereface2", C, D, device=DEVICE)
    margin = loss_fn.margin
    assert margin.negative_weight != 1.0
    results = []
    for triton in (False, True):
        xi = x.clone().requires_grad_(True)
        value = ChunkedBinaryLoss.apply(
            xi, loss_fn.weight, margin.bias, labels, labels, margin, 1, CHUNK, torch.float32,
            None, None, triton,
        )  # fmt: skip
        grads = torch.autograd.grad((value * upstream).sum(), [xi, loss_fn.weight, margin.bias])
        results.append((value.detach(), *grads))
    for what, a, e in zip(("loss", "∂x", "∂W", "∂b"), results[1], results[0], strict=True):
        assert relative_error(a, e) <= 1e-5, (what, relative_error(a, e))


def test_the_weight_gradient_refuses_an_out_it_cannot_write(kernels: ModuleType) -> None:
    from marginface.executors.binary_rule import binary_rule_of
    from marginface.executors.triton_binary import binary_weight_gradient

    loss_fn = marginface.create_loss("uniface", C, D, device=DEVICE)
    x_hat = torch.nn.functional.normalize(torch.randn(N, D), dim=1).to(DEVICE)
    weight = loss_fn.weight.detach()
    inv_norms = weight.norm(dim=1).reciprocal()
    labels = torch.randint(0, C, (N,)).to(DEVICE)
    rule = binary_rule_of(loss_fn.margin, loss_fn.margin.bias.detach())
    grad = torch.ones(N, device=DEVICE)
    for bad in (
        torch.zeros(C, D, dtype=torch.float64, device=DEVICE),  # the dtype
        torch.zeros(D, C, device=DEVICE).t(),  # not contiguous
        torch.zeros(C - 1, D, device=DEVICE),  # the shape
    ):
        with pytest.raises(
            ValueError, match=rf"out must be a contiguous float32 tensor of shape \({C}, {D}\)"
        ):
            binary_weight_gradient(
                x_hat, weight, inv_norms, labels, rule, grad, sub_centers=1, start=0, stop=C,
                out=bad,
            )  # fmt: skip


def test_the_embedding_gradient_launches_in_groups_within_the_shared_bound(
    kernels: ModuleType, monkeypatch
) -> None:
    """The one-vs-all ∂x̂ uses the kernels' one workspace bound: with room for exactly two
    chunks' partial sums, 37 classes in chunks of 16 take two launches (2 chunks, then 1),
    and the result equals one launch over all three chunks."""
    import marginface.executors.triton_kernels as kernel_module
    from marginface.executors.binary_rule import binary_rule_of
    from marginface.executors.triton_binary import binary_embedding_gradient

    loss_fn = marginface.create_loss("sphereface2", C, D, device=DEVICE)
    generator = torch.Generator().manual_seed(3)
    x_hat = torch.nn.functional.normalize(torch.randn(N, D, generator=generator), dim=1)
    x_hat = x_hat.to(DEVICE)
    weight = loss_fn.weight.detach()
    inv_norms = weight.norm(dim=1).reciprocal()
    labels = torch.randint(0, C, (N,), generator=generator).to(DEVICE)
    rule = binary_rule_of(loss_fn.margin, loss_fn.margin.bias.detach())
    grad = torch.rand(N, generator=generator).to(DEVICE)

    def run() -> tuple[list[int], tuple[torch.Tensor, torch.Tensor]]:
        kernel = kernel_module._embedding_gradient_kernel
        grids: list[int] = []

        class Counted:
            def __getitem__(self, grid):
                grids.append(grid[1])
                return kernel[grid]

        monkeypatch.setattr(kernel_module, "_embedding_gradient_kernel", Counted())
        result = binary_embedding_gradient(
            x_hat, weight, inv_norms, labels, rule, grad, sub_centers=1, chunk_size=CHUNK
        )
        monkeypatch.setattr(kernel_module, "_embedding_gradient_kernel", kernel)
        return grids, result

    whole_grids, whole = run()
    assert whole_grids == [3]
    monkeypatch.setattr(kernel_module, "EMBEDDING_GRADIENT_WORKSPACE_BYTES", 2 * N * D * 4)
    grouped_grids, grouped = run()
    assert grouped_grids == [2, 1]
    for mine, reference in zip(grouped, whole, strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-6)
