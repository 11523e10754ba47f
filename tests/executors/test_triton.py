"""The Triton kernels of the chunked executor equal the dense path (loss, ∂x, ∂W).

Without a GPU the kernels run on the CPU under Triton's interpreter: ``TRITON_INTERPRET=1`` must
be in the environment before triton is imported (its language library and our kernels are
decorated then); ``conftest.py`` sets it. With CUDA, the same tests run the compiled kernels on
the GPU. Skipped when triton is not installed.
Shapes are tiny: the interpreter runs every tile op through numpy. The fixtures ``kernels`` and
``launches`` are in ``conftest.py``.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from types import ModuleType

import pytest
import torch

import marginface
from marginface.executors.chunked import KERNELS_ENV, chunked_margin_cross_entropy
from marginface.executors.dense import dense_margin_cross_entropy
from marginface.margins import ArcFaceMargin, CosFaceMargin, Margin

from ._compare import DEVICE, backward_launcher, relative_error

pytest.importorskip("triton")

N, D, C, CHUNK = 6, 8, 37, 16
OPTIONS: dict[str, dict] = {"elasticface": {"seed": 0}}
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 5e-2)}
"""Relative error ``max|a - e| / max|e|`` (loss, gradients) against the dense path, which
multiplies in float32. bf16: the chunk GEMMs see bf16-rounded x̂ and W (~3 significant digits),
and with sub-centers a rounding can flip the winning sub-center, which moves a whole gradient
row (observed: loss ~1e-3, gradients up to 2.7e-2 for Sub-center ArcFace; the PyTorch chunked
path is 5.4e-2 off on the same case)."""


def make_case(name: str, dtype: torch.dtype, seed: int = 0, **options):
    """A registered loss's margin, sub-centers, a weight in ``dtype``, a batch and labels in the
    first and last chunk."""
    loss = marginface.create_loss(name, C, D, **{**OPTIONS.get(name, {}), **options})
    k = getattr(loss, "sub_centers", 1)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=generator) * 8
    weight = torch.randn(C * k, D, generator=generator)
    labels = torch.randint(0, C, (N,), generator=generator)
    labels[0], labels[1] = 0, C - 1
    upstream = torch.rand(N, generator=generator)
    to = {"device": DEVICE}
    return (
        loss.margin.to(DEVICE),
        k,
        x.to(dtype=dtype, **to),
        weight.to(dtype=dtype, **to),
        labels.to(**to),
        upstream.to(**to),
    )


def run(impl: str, margin: Margin, k: int, x, weight, labels, upstream, chunk_size: int = CHUNK):
    """Loss and gradients ``(loss, ∂x, ∂W)`` of one executor on copies of the inputs."""
    x = x.clone().requires_grad_(True)
    weight = weight.clone().requires_grad_(True)
    # a margin's per-class parameters (AdaM-Softmax's margins), as a head would gather them
    values = {name: 0.3 + 0.01 * labels.to(x.dtype) for name in margin.class_parameters()} or None
    if impl == "dense":
        loss = dense_margin_cross_entropy(
            x, weight, labels, margin, sub_centers=k, class_values=values
        )
    else:
        loss = chunked_margin_cross_entropy(
            x, weight, labels, margin, sub_centers=k, chunk_size=chunk_size, kernels=impl,
            class_values=values,
        )  # fmt: skip
    (loss * upstream).sum().backward()
    return loss.detach(), x.grad, weight.grad


@pytest.mark.parametrize("backward", ["tiles", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["arcface", "cosface", "curricularface", "subcenter-arcface"])
def test_matches_dense(
    name: str, dtype: torch.dtype, backward: str, launches: Counter, monkeypatch
) -> None:
    """Both backwards (gradient tiles and GEMMs; the fused kernels) give dense's loss and
    gradients, over two steps (CurricularFace's buffer updated by the first)."""
    import marginface.executors.triton_dispatch as dispatch

    monkeypatch.setattr(dispatch, "TRITON_BACKWARD", backward)
    options = {"sub_centers": 2} if name == "subcenter-arcface" else {}
    margin, k, x, weight, labels, upstream = make_case(name, dtype, **options)
    dense_margin, triton_margin = margin, copy.deepcopy(margin)
    for step in range(2):  # CurricularFace: the second step runs on the updated t
        expected = run("dense", dense_margin, k, x, weight, labels, upstream)
        actual = run("triton", triton_margin, k, x, weight, labels, upstream)
        assert actual[0].dtype == torch.float32
        assert actual[1].dtype == actual[2].dtype == dtype
        for what, a, e in zip(("loss", "∂x", "∂W"), actual, expected, strict=True):
            assert torch.isfinite(a).all(), what
            error = relative_error(a, e)
            assert error <= TOLERANCE[dtype][what != "loss"], (step, what, error)
        for key, buffer in dense_margin.state_dict().items():
            other = triton_margin.state_dict()[key]
            assert relative_error(other, buffer) <= 1e-5, key
    # per step one launch each: the 3 chunks fit one launch's (one class tile's) workspace
    if backward == "tiles":
        assert launches == {"nontarget_statistics": 2, "gradient_tile": 2}
    else:
        assert launches == {
            "nontarget_statistics": 2, "embedding_gradient": 2, "weight_gradient": 2
        }  # fmt: skip


@pytest.mark.parametrize("name", ["arcface", "sphereface2"])
def test_the_weight_gradient_launches_whole_chunks_within_its_bound(
    name: str, kernels: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a sample the weight gradient is launched over as many whole chunks as fit
    ``WEIGHT_GRADIENT_WORKSPACE_BYTES``: room for two chunks' float32 partial ``∂W`` makes 37
    classes in chunks of 16 two launches (32 classes, then 5), room for less than one makes
    three (one per chunk), and the loss and gradients equal those of one launch."""
    import marginface.executors.triton_dispatch as dispatch

    monkeypatch.setattr(dispatch, "TRITON_BACKWARD", "fused")
    kernel = kernels._weight_gradient_kernel
    spans: list[int] = []

    class Counted:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                spans.append(args[13] - args[12])  # the launch's stop - start
                return kernel[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(kernels, "_weight_gradient_kernel", Counted())
    margin, k, x, weight, labels, upstream = make_case(name, torch.bfloat16)
    results = {}
    for room in (3, 2, 0.5):  # chunks' worth of float32 partial ∂W
        monkeypatch.setattr(dispatch, "WEIGHT_GRADIENT_WORKSPACE_BYTES", int(room * CHUNK * D * 4))
        spans.clear()
        results[room] = run("triton", copy.deepcopy(margin), k, x, weight, labels, upstream)
        assert spans == {3: [37], 2: [32, 5], 0.5: [16, 16, 5]}[room]
    for room in (2, 0.5):
        for a, e in zip(results[room], results[3], strict=True):
            assert torch.equal(a, e)


@pytest.mark.parametrize(
    "name", sorted(set(marginface.list_losses()) - {"arcface", "cosface", "curricularface"})
)
def test_every_loss_matches_dense_fp32(name: str, launches: Counter) -> None:
    """Per-row scales with a gradient (SphereFace's feature-norm scale), AdaCos's extra pass,
    norm-dependent targets (MagFace, AdaFace), NPCFace's per-row statistics pass: all in
    PyTorch around the same kernels; the non-target rules of MV-Softmax and NPCFace ("mv"),
    ArcNegFace ("gaussian"), circle loss ("circle") and Li-ArcFace ("linear_angle") in the
    kernels. A loss whose margin declares no kernel rule would have no Triton path (none of the
    registered ones: the one-vs-all losses have their own kernels)."""
    from marginface.executors.chunk_plan import TRITON_NONTARGET_KERNELS

    margin_of_name = marginface.create_loss(name, 3, 2).margin
    if margin_of_name.objective == "binary":
        pytest.skip(f"{name} is one-vs-all: its own kernels, in test_binary_triton.py")
    assert margin_of_name.nontarget_kernel() in TRITON_NONTARGET_KERNELS
    margin, k, x, weight, labels, upstream = make_case(name, torch.float32)
    dense_margin, triton_margin = margin, copy.deepcopy(margin)
    expected = run("dense", dense_margin, k, x, weight, labels, upstream)
    actual = run("triton", triton_margin, k, x, weight, labels, upstream)
    for what, a, e in zip(("loss", "∂x", "∂W"), actual, expected, strict=True):
        assert relative_error(a, e) <= 1e-5, (what, relative_error(a, e))
    assert launches[backward_launcher()] == 1


ISSUE_25 = ["mv-am-softmax", "mv-arc-softmax", "npcface", "arcnegface", "circle", "li-arcface"]
"""The losses whose non-target rules got Triton kernels in issue 25 ("mv", "gaussian", "circle",
"linear_angle")."""


@pytest.mark.parametrize("name", ISSUE_25)
def test_issue_25_rules_match_the_torch_chunk_loop(name: str, launches: Counter) -> None:
    """The kernels against the PyTorch chunk loop (``kernels="torch"``: the compiled rules of
    ``margins/rules.py``) on the same chunks: loss, ∂x, ∂W in float32."""
    margin, k, x, weight, labels, upstream = make_case(name, torch.float32)
    expected = run("torch", copy.deepcopy(margin), k, x, weight, labels, upstream)
    assert sum(launches.values()) == 0
    actual = run("triton", copy.deepcopy(margin), k, x, weight, labels, upstream)
    for what, a, e in zip(("loss", "∂x", "∂W"), actual, expected, strict=True):
        assert relative_error(a, e) <= 1e-5, (what, relative_error(a, e))
    assert launches[backward_launcher()] == 1


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("mv-am-softmax", {"mode": "fixed"}),
        ("mv-arc-softmax", {"mode": "fixed", "t": 1.5}),
        ("mv-arc-softmax", {"t": 0.3}),
        ("arcnegface", {"alpha": 1.5, "sigma": 0.5}),
        ("circle", {"margin": 0.4, "scale": 64.0}),
        ("li-arcface", {"margin": 0.3}),
        ("npcface", {"t": 1.3, "a": 0.1}),
        ("sphereface-r", {"kind": "v2"}),
        ("sphereface-r", {"kind": "v2", "gradient": "exact", "margin": 1.7}),
        # the stepped margin: m = 1.5, then 2.0 at the second step (the kernels read it)
        ("sphereface-r", {"kind": "v2", "margin_steps": [1], "margin_increment": 0.5}),
    ],
)
def test_issue_25_rule_options_match_dense(name: str, options: dict, launches: Counter) -> None:
    """The kernels' rules with other parameters than the defaults (MV-Softmax's fixed mode and
    other ``t``, ArcNegFace's α and σ, circle loss's ``m``, NPCFace's ``t`` and ``a``), two
    training steps, against the dense path."""
    margin, k, x, weight, labels, upstream = make_case(name, torch.float32, **options)
    dense_margin, triton_margin = margin, copy.deepcopy(margin)
    for step in range(2):
        expected = run("dense", dense_margin, k, x, weight, labels, upstream)
        actual = run("triton", triton_margin, k, x, weight, labels, upstream)
        for what, a, e in zip(("loss", "∂x", "∂W"), actual, expected, strict=True):
            assert relative_error(a, e) <= 1e-5, (step, what, relative_error(a, e))
        x = x - 0.5 * actual[1]  # the second step on moved embeddings
    assert launches[backward_launcher()] == 2


def test_kernels_over_several_tiles_match_reference(kernels: ModuleType) -> None:
    """The launchers directly, with 16-wide tiles over 2 row blocks, 2 chunks of 2 class tiles
    and 3 blocks of D, sub-centers and CurricularFace's rule, against autograd on the dense
    formula."""
    n, dim, classes, k, chunk = 20, 40, 37, 2, 20
    blocks = kernels.Blocks(n=16, c=16, d=16)
    generator = torch.Generator().manual_seed(1)
    x_hat = torch.nn.functional.normalize(torch.randn(n, dim, generator=generator), dim=1)
    weight = torch.randn(classes * k, dim, generator=generator)
    inv_norms = 1.0 / weight.norm(dim=1)
    labels = torch.randint(0, classes, (n,), generator=generator)
    scale = 10.0 + 20.0 * torch.rand(n, generator=generator)
    threshold = 0.3 * torch.rand(n, generator=generator)
    t = torch.full((n,), 0.25)
    grad = torch.rand(n, generator=generator)
    x_hat, weight, inv_norms, labels, scale, threshold, t, grad = (
        v.to(DEVICE) for v in (x_hat, weight, inv_norms, labels, scale, threshold, t, grad)
    )
    rule = kernels.NonTargetRule(threshold=threshold, t=t)

    # Reference: the non-target log-sum-exp, and its gradients by autograd.
    x_leaf = x_hat.clone().requires_grad_(True)
    w_leaf = weight.clone().requires_grad_(True)
    s_leaf = scale.clone().requires_grad_(True)
    cos = (x_leaf @ (w_leaf * inv_norms.unsqueeze(1)).t()).view(n, classes, k).amax(dim=2)
    hard = cos > threshold.unsqueeze(1)
    logits = torch.where(hard, cos * (t.unsqueeze(1) + cos), cos) * s_leaf.unsqueeze(1)
    logits = logits.masked_fill(torch.nn.functional.one_hot(labels, classes).bool(), -torch.inf)
    lse = torch.logsumexp(logits, dim=1)
    (lse * grad).sum().backward()

    common = {"sub_centers": k, "blocks": blocks}
    row_max, exp_sum = kernels.nontarget_statistics(
        x_hat, weight, inv_norms, labels, scale, rule, chunk_size=chunk, **common
    )
    assert relative_error(row_max + torch.log(exp_sum), lse) <= 1e-6
    detached = lse.detach()
    grad_x, grad_scale = kernels.embedding_gradient(
        x_hat, weight, inv_norms, labels, scale, rule, detached, grad, chunk_size=chunk, **common
    )
    assert relative_error(grad_x, x_leaf.grad) <= 1e-5
    assert relative_error(grad_scale, s_leaf.grad) <= 1e-5
    # a workspace of 1 or 2 chunk slices: the classes go in groups of launches (2 of 1 chunk;
    # 8-class chunks: 2 + 2 + 1), each with its labels shifted; the same sums
    slice_bytes = n * dim * 4
    for chunk_size, workspace in ((chunk, slice_bytes), (8, 2 * slice_bytes + 1)):
        grouped_x, grouped_scale = kernels.embedding_gradient(
            x_hat, weight, inv_norms, labels, scale, rule, detached, grad,
            chunk_size=chunk_size, workspace_bytes=workspace, **common,
        )  # fmt: skip
        assert relative_error(grouped_x, x_leaf.grad) <= 1e-5, chunk_size
        assert relative_error(grouped_scale, s_leaf.grad) <= 1e-5, chunk_size
    # ∂W: the kernel gives r·Σ_i G_ij x̂_i; autograd's ∂/∂w at fixed r is exactly that.
    parts = [
        kernels.weight_gradient(
            x_hat,
            weight,
            inv_norms,
            labels,
            scale,
            rule,
            detached,
            grad,
            start=start,
            stop=min(start + chunk, classes),
            **common,
        )
        for start in range(0, classes, chunk)
    ]
    assert relative_error(torch.cat(parts), w_leaf.grad) <= 1e-5


def test_auto_runs_torch_on_cpu_and_triton_on_cuda(launches: Counter) -> None:
    margin, k, x, weight, labels, upstream = make_case("arcface", torch.float32)
    run("auto", margin, k, x, weight, labels, upstream)
    assert launches["nontarget_statistics"] == (1 if DEVICE.type == "cuda" else 0)


def test_environment_variable_forces_the_kernels(
    launches: Counter, monkeypatch: pytest.MonkeyPatch
) -> None:
    margin, k, x, weight, labels, upstream = make_case("cosface", torch.float32)
    monkeypatch.setenv(KERNELS_ENV, "triton")
    run(None, margin, k, x, weight, labels, upstream)
    assert launches["nontarget_statistics"] == 1
    monkeypatch.setenv(KERNELS_ENV, "torch")
    run(None, margin, k, x, weight, labels, upstream)
    assert launches["nontarget_statistics"] == 1
    monkeypatch.setenv(KERNELS_ENV, "fast")
    with pytest.raises(ValueError, match=r"MARGINFACE_KERNELS must be one of .*'fast'"):
        run(None, margin, k, x, weight, labels, upstream)


class _ShiftedNegatives(CosFaceMargin):
    """A margin with its own non-target rule, which the kernels do not know."""

    def nontarget_cosine(self, cosine, context):
        return cosine - 0.1


def test_unknown_nontarget_rule_raises_for_triton_and_falls_back_for_auto(
    launches: Counter,
) -> None:
    _, k, x, weight, labels, upstream = make_case("cosface", torch.float32)
    margin = _ShiftedNegatives().to(DEVICE)
    with pytest.raises(ValueError, match=r"_ShiftedNegatives's nontarget_cosine has no Triton"):
        run("triton", margin, k, x, weight, labels, upstream)
    expected = run("dense", margin, k, x, weight, labels, upstream)
    actual = run("auto", margin, k, x, weight, labels, upstream)
    assert relative_error(actual[0], expected[0]) <= 1e-5
    assert launches[backward_launcher()] == 0


def test_interclass_filtering_raises_for_triton_and_runs_torch_for_auto(
    kernels: ModuleType, launches: Counter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels have no inter-class filter compiled in: asking for them is an error, and
    "auto" (or MARGINFACE_KERNELS=auto) runs the PyTorch path, which equals dense."""
    _, k, x, weight, labels, upstream = make_case("arcface", torch.float32)
    margin = ArcFaceMargin(interclass_filtering_threshold=0.2).to(DEVICE)
    with pytest.raises(ValueError, match=r"interclass_filtering_threshold > 0 has no Triton"):
        run("triton", margin, k, x, weight, labels, upstream)
    monkeypatch.setenv(KERNELS_ENV, "triton")
    with pytest.raises(ValueError, match=r"interclass_filtering_threshold > 0 has no Triton"):
        run(None, margin, k, x, weight, labels, upstream)
    monkeypatch.delenv(KERNELS_ENV)
    expected = run("dense", margin, k, x, weight, labels, upstream)
    actual = run("auto", margin, k, x, weight, labels, upstream)
    for a, e in zip(actual, expected, strict=True):
        assert relative_error(a, e) <= 1e-5
    assert sum(launches.values()) == 0


def test_float64_raises_for_triton(kernels: ModuleType) -> None:
    margin, k, x, weight, labels, upstream = make_case("arcface", torch.float64)
    with pytest.raises(ValueError, match=r"kernels='triton' supports GEMM dtypes"):
        run("triton", margin, k, x, weight, labels, upstream)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="the interpreter check is for CPU tensors")
def test_cpu_without_interpreter_raises(kernels: ModuleType, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    _, k, x, weight, labels, upstream = make_case("arcface", torch.float32)
    with pytest.raises(ValueError, match=r"TRITON_INTERPRET=1"):
        run("triton", ArcFaceMargin(), k, x, weight, labels, upstream)


def test_blocks_are_validated(kernels: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"Blocks.c must be a power of two >= 16, got 24"):
        kernels.Blocks(n=16, c=24, d=16)
    with pytest.raises(ValueError, match=r"Blocks.n must be a power of two >= 16, got 8"):
        kernels.Blocks(n=8)
    with pytest.raises(ValueError, match=r"Blocks.d must be a power of two >= 16, got True"):
        kernels.Blocks(d=True)
    with pytest.raises(
        ValueError, match=r"Blocks.warps must be a power of two in \[1, 32\], got 3"
    ):
        kernels.Blocks(warps=3)
    with pytest.raises(
        ValueError, match=r"Blocks.warps must be a power of two in \[1, 32\], got 64"
    ):
        kernels.Blocks(warps=64)
    with pytest.raises(ValueError, match=r"Blocks.stages must be an integer >= 1, got 0"):
        kernels.Blocks(stages=0)
    assert kernels.Blocks(warps=8, stages=2).warps == 8


def test_row_inputs_are_validated(kernels: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"RowInputs.reduction must be one of .* got 'logsumexp'"):
        kernels.RowInputs("logsumexp")
    with pytest.raises(ValueError, match=r"RowInputs.rule must be one of .* got 'acos'"):
        kernels.RowInputs("softmax", rule="acos")
    with pytest.raises(ValueError, match=r"RowInputs.constants must hold the bias term .* None"):
        kernels.RowInputs("softplus")
    bias = torch.zeros(1)
    assert kernels.RowInputs("softplus", constants=bias).arguments()["REDUCTION"] == "softplus"
    assert "BIAS" not in kernels.RowInputs("softplus", constants=bias).arguments()


def test_kernel_entry_points_check_their_inputs(kernels: ModuleType) -> None:
    """Each entry point validates dtypes, strides and the sub-center count before launching."""
    x_hat = torch.randn(4, 16, device=DEVICE)
    weight = torch.randn(6, 16, device=DEVICE)
    inv_norms = torch.ones(6, device=DEVICE)
    labels = torch.zeros(4, dtype=torch.long, device=DEVICE)
    scale = torch.ones(4, device=DEVICE)
    lse, grad = torch.zeros(4, device=DEVICE), torch.ones(4, device=DEVICE)
    rule = kernels.NonTargetRule()
    calls = {
        "nontarget_statistics": lambda x, w, k: kernels.nontarget_statistics(
            x, w, inv_norms, labels, scale, rule, sub_centers=k, chunk_size=16
        ),
        "embedding_gradient": lambda x, w, k: kernels.embedding_gradient(
            x, w, inv_norms, labels, scale, rule, lse, grad, sub_centers=k, chunk_size=16
        ),
        "weight_gradient": lambda x, w, k: kernels.weight_gradient(
            x, w, inv_norms, labels, scale, rule, lse, grad, start=0, stop=1, sub_centers=k
        ),
    }
    for call in calls.values():
        with pytest.raises(TypeError, match="the Triton kernels need x_hat and weight in one"):
            call(x_hat.double(), weight.double(), 1)
        with pytest.raises(ValueError, match="unit stride along D"):
            call(x_hat, weight.t().contiguous().t(), 1)
        with pytest.raises(ValueError, match=r"weight rows 6 not a multiple of K = 4"):
            call(x_hat, weight, 4)


def test_curricular_rule_in_the_kernel_is_strict_at_the_threshold(kernels: ModuleType) -> None:
    """A non-target cosine equal to ``τ = cos(θ_y + m)`` is not hard (the PyTorch rule's
    ``>``): with exactly representable cosines the kernel must agree to the last bit."""
    dim = 16
    x_hat = torch.zeros(1, dim)
    x_hat[0, 0] = 1.0
    weight = torch.zeros(3, dim)
    weight[0, 1], weight[1, 0], weight[2, 0] = 1.0, 0.25, 0.5  # cosines 0 (target), 0.25, 0.5
    inv_norms = torch.ones(3)
    labels = torch.tensor([0])
    scale = torch.ones(1)
    rule = kernels.NonTargetRule(
        threshold=torch.tensor([0.25], device=DEVICE), t=torch.tensor([0.5], device=DEVICE)
    )
    inputs = (v.to(DEVICE) for v in (x_hat, weight, inv_norms, labels, scale))
    row_max, exp_sum = kernels.nontarget_statistics(*inputs, rule, sub_centers=1, chunk_size=16)
    # 0.25 stays 0.25 (not hard); 0.5 is hard: 0.5·(t + 0.5) = 0.5
    expected = math.log(math.exp(0.25) + math.exp(0.5))
    assert float((row_max + torch.log(exp_sum)).cpu()) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    "name",
    [
        "arcface",
        "curricularface",
        "subcenter-arcface",
        "mv-am-softmax",
        "arcnegface",
        "circle",
        "li-arcface",
    ],
)
def test_compiled_triton_path_matches_eager(name: str, launches: Counter) -> None:
    """Under ``torch.compile`` the custom operators call the same kernels (here under the
    interpreter; on CUDA compiled), with no graph break, and give eager's loss and gradients."""
    margin, k, x, weight, labels, upstream = make_case(name, torch.float32)

    def step(function):
        x_in = x.clone().requires_grad_(True)
        w_in = weight.clone().requires_grad_(True)
        (function(x_in, w_in) * upstream).sum().backward()
        return function(x_in, w_in).detach(), x_in.grad, w_in.grad

    def loss(x_in, w_in):
        return chunked_margin_cross_entropy(
            x_in, w_in, labels, margin, sub_centers=k, chunk_size=CHUNK, kernels="triton"
        )

    margin.eval()  # no buffer update between the calls below
    expected = step(loss)
    eager_launches = dict(launches)
    torch._dynamo.reset()
    try:
        actual = step(torch.compile(loss, backend="aot_eager", fullgraph=True))
    finally:
        torch._dynamo.reset()
    assert launches["nontarget_statistics"] == 2 * eager_launches["nontarget_statistics"]
    assert launches[backward_launcher()] == 2 * eager_launches[backward_launcher()] > 0
    for a, e in zip(actual, expected, strict=True):
        assert relative_error(a, e) <= 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "name", ["arcface", "curricularface", "subcenter-arcface", "sphereface", "arcnegface"]
)
def test_partial_fc_sample_read_in_place_matches_the_materialized_sample(
    name: str, dtype: torch.dtype, launches: Counter
) -> None:
    """Partial FC's sample read in place (one launch per chunk of gathered rows) gives the loss
    and gradients of the kernels on the sampled rows copied out of the weight."""
    options = {"sub_centers": 2} if name == "subcenter-arcface" else {}
    margin, k, x, weight, _, upstream = make_case(name, dtype, **options)
    sampled = torch.tensor([0, 3, 4, 9, 10, 11, 20, 25, 26, 30, 36], device=DEVICE)
    targets = torch.arange(N, device=DEVICE) % sampled.shape[0]
    materialized = weight.view(C, k, D)[sampled].reshape(-1, D)
    expected = run("triton", copy.deepcopy(margin), k, x, materialized, targets, upstream, 4)
    launched = dict(launches)
    x_in = x.clone().requires_grad_(True)
    w_in = weight.clone().requires_grad_(True)
    loss = chunked_margin_cross_entropy(
        x_in, w_in, targets, copy.deepcopy(margin), sub_centers=k, chunk_size=4,
        kernels="triton", sampled_classes=sampled,
    )  # fmt: skip
    (loss * upstream).sum().backward()
    assert launches[backward_launcher()] - launched[backward_launcher()] == 3  # 3 chunks
    grad = w_in.grad.view(C, k, D)
    outside = torch.ones(C, dtype=torch.bool, device=DEVICE)
    outside[sampled] = False
    assert (grad[outside] == 0).all()
    # float32: 5e-6, as on CUDA the sampled rows' norms come from the inverse-norms kernel (read
    # through the sample's index) and the materialized rows' from vector_norm: float32 sums in
    # another order (1.24e-6 seen on an H200 for Sub-center ArcFace)
    tolerance = 5e-6 if dtype == torch.float32 else 1e-2
    for what, a, e in zip(
        ("loss", "∂x", "∂W"), (loss.detach(), x_in.grad, grad[sampled].reshape(-1, D)), expected,
        strict=True,
    ):  # fmt: skip
        assert relative_error(a, e) <= tolerance, (what, relative_error(a, e))
