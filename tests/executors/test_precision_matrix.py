"""The precision matrix: the chunked executor against the dense one, and both against a float64
dense reference, for every registered loss, in float32, bfloat16 and float16 and under
``torch.autocast`` (bf16 and fp16), with the PyTorch ops (``kernels="auto"``) and the Triton
kernels (``kernels="triton"``).

The same tests run on the CPU today and on CUDA when there is a GPU; the device picks the shapes:

* CPU: N = 10, D = 8, C = 37, chunks of 16 (C not a multiple of the chunk). ``"auto"`` runs the
  PyTorch ops, ``"triton"`` the kernels under Triton's interpreter (``conftest.py``).
* CUDA: N = 250, D = 136, C = 5003, chunks of 1024, the kernels' default tiles (64 × 64 × 32:
  N, D and C are not multiples of them). ``"auto"`` and ``"triton"`` both take the compiled
  kernels there.

Labels are forced into the first and last class, onto both sides of every chunk boundary and (on
CUDA) of the first class-tile boundary; the sub-center loss has K = 2. Every loss runs at scale
64 where it has a fixed scale (AdaCos and SphereFace's feature-norm scale keep their own). Two
training steps, each on a fresh batch: loss, ``∂x``, ``∂W`` after each, and the margin's buffers
(CurricularFace's ``t``, AdaCos's scale, AdaFace's statistics, SphereFace's iteration) after each.

Inputs: ``float32``/``bfloat16``/``float16`` embeddings and weight; ``autocast-*``: float32
embeddings and weight, and under autocast the embeddings pass through a linear map (the identity),
so the head receives half-precision activations with a float32 weight, as behind a backbone.
The float64 reference takes the values the executors see (half inputs upcast exactly), so it
measures the executors' own arithmetic, not the rounding of their inputs.
"""

from __future__ import annotations

import copy
import inspect
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import marginface
from marginface.executors.chunked import chunked_margin_cross_entropy, triton_available
from marginface.executors.dense import dense_margin_cross_entropy

from ..conftest import make_loss
from ._compare import DEVICE, backward_launcher, relative_error

ALL = marginface.list_losses()


def has_compiled_rule(name: str) -> bool:
    """Whether ``name``'s default margin declares one of the Triton kernels' non-target rules
    (:data:`~marginface.executors.chunk_plan.TRITON_NONTARGET_KERNELS`: every rule of
    :data:`~marginface.margins.base.NONTARGET_KERNELS`, NPCFace's "mv" included, whose per-row
    statistics pass runs in PyTorch before the kernels)."""
    from marginface.executors.chunk_plan import TRITON_NONTARGET_KERNELS

    margin = make_loss(name, 3, 2).margin
    return margin.nontarget_kernel() in TRITON_NONTARGET_KERNELS


CUDA = DEVICE.type == "cuda"
if CUDA:
    N, D, C, CHUNK = 250, 136, 5003, 1024
else:  # the interpreter runs every tile op through numpy: tiny shapes
    N, D, C, CHUNK = 10, 8, 37, 16
TILE = 64
"""The kernels' default class tile (``triton_kernels.Blocks().c``; on CPU it exceeds C)."""
STEPS = 2

PRECISIONS: dict[str, tuple[torch.dtype, torch.dtype | None]] = {
    "float32": (torch.float32, None),
    "bfloat16": (torch.bfloat16, None),
    "float16": (torch.float16, None),
    "autocast-bf16": (torch.float32, torch.bfloat16),
    "autocast-fp16": (torch.float32, torch.float16),
}
"""Precision -> (dtype of the embeddings and the weight, autocast dtype or None)."""


def loss_options(name: str) -> dict:
    """Scale 64 where the loss takes a fixed scale (AdaCos's is adaptive; SphereFace's default
    is the feature norm, the only per-row scale with a gradient, kept for that reason); two
    sub-centers for the sub-center loss (the test's default options are added by make_loss)."""
    options: dict = {"sub_centers": 2} if name == "subcenter-arcface" else {}
    parameters = inspect.signature(type(make_loss(name)).__init__).parameters
    if "scale" in parameters and name != "sphereface":
        options["scale"] = 64.0
    return options


def forced_labels() -> list[int]:
    """The first and last class, both sides of every chunk boundary and of the first tile
    boundary (those inside ``[0, C)``), in order, at most N."""
    boundaries = [TILE, *range(CHUNK, C, CHUNK)]
    classes = [0, C - 1, *(b - 1 for b in boundaries), *boundaries]
    return sorted({c for c in classes if 0 <= c < C})[:N]


def make_case(name: str, precision: str, seed: int = 0):
    """The loss's margin, K, a weight, and STEPS batches ``(x, labels, upstream)``."""
    dtype, _ = PRECISIONS[precision]
    loss = make_loss(name, C, D, **loss_options(name))
    k = getattr(loss, "sub_centers", 1)
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(C * k, D, generator=generator)
    batches = []
    for _ in range(STEPS):
        x = torch.randn(N, D, generator=generator) * (30.0 / D**0.5)  # norms ~30 (MagFace range)
        labels = torch.randint(0, C, (N,), generator=generator)
        forced = torch.tensor(forced_labels())
        labels[torch.randperm(N, generator=generator)[: len(forced)]] = forced
        upstream = torch.rand(N, generator=generator)
        batches.append((x.to(DEVICE, dtype), labels.to(DEVICE), upstream.to(DEVICE)))
    return loss.margin.to(DEVICE), k, weight.to(DEVICE, dtype), batches


def run(impl: str, margin, k: int, x, weight, labels, upstream, autocast: torch.dtype | None):
    """One step of one executor on copies of the inputs: ``(loss, ∂x, ∂W)``. ``impl``: "dense",
    "reference" (dense in float64, on the values the executors see) or the chunked executor's
    ``kernels``. Under ``autocast`` the embeddings reach the executor through an autocast linear
    map (the identity), in half precision."""
    # a margin's per-class parameters (AdaM-Softmax's margins), as a head would gather them
    values = {name: 0.3 + 0.01 * labels.double() for name in margin.class_parameters()} or None
    if impl == "reference":
        seen = x.to(autocast) if autocast is not None else x
        x = seen.double().requires_grad_(True)
        weight = weight.double().requires_grad_(True)
        loss = dense_margin_cross_entropy(
            x, weight, labels, margin, sub_centers=k, class_values=values
        )
        (loss * upstream.double()).sum().backward()
        return loss.detach(), x.grad, weight.grad
    x = x.clone().requires_grad_(True)
    weight = weight.clone().requires_grad_(True)
    enabled = autocast is not None
    with torch.autocast(DEVICE.type, dtype=autocast or torch.bfloat16, enabled=enabled):
        h = F.linear(x, torch.eye(D, device=DEVICE)) if enabled else x
        assert h.dtype == (autocast or x.dtype)
        if impl == "dense":
            loss = dense_margin_cross_entropy(
                h, weight, labels, margin, sub_centers=k, class_values=values
            )
        else:
            loss = chunked_margin_cross_entropy(
                h, weight, labels, margin, sub_centers=k, chunk_size=CHUNK, kernels=impl,
                class_values=values,
            )  # fmt: skip
    (loss * upstream).sum().backward()
    return loss.detach(), x.grad, weight.grad


WHAT = ("loss", "∂x", "∂W")


def measure(name: str, precision: str, kernels: str, seed: int = 0) -> dict[tuple[str, str], float]:
    """Runs STEPS steps of dense, chunked (``kernels``) and the float64 reference, each with its
    own copy of the margin; returns the largest relative error over the steps per
    ``(comparison, what)``: comparisons "chunked-dense", "chunked-reference",
    "dense-reference"; what: loss, ∂x, ∂W, or "buffer <name>"."""
    margin, k, weight, batches = make_case(name, precision, seed)
    autocast = PRECISIONS[precision][1]
    margins = {
        "dense": margin,
        "chunked": copy.deepcopy(margin),
        "reference": copy.deepcopy(margin).double(),
    }
    errors: dict[tuple[str, str], float] = {}

    def record(key: tuple[str, str], error: float) -> None:
        errors[key] = max(errors.get(key, 0.0), error)

    for x, labels, upstream in batches:
        results = {
            who: run(
                kernels if who == "chunked" else who,
                margins[who],
                k,
                x,
                weight,
                labels,
                upstream,
                autocast,
            )
            for who in ("dense", "chunked", "reference")
        }
        assert results["chunked"][0].dtype == results["dense"][0].dtype == torch.float32
        for who in ("dense", "chunked"):
            for what, value in zip(WHAT, results[who], strict=True):
                assert torch.isfinite(value).all(), (who, what)
        buffers = {who: dict(m.named_buffers()) for who, m in margins.items()}
        for actual, expected in (
            ("chunked", "dense"),
            ("chunked", "reference"),
            ("dense", "reference"),
        ):
            comparison = f"{actual}-{expected}"
            for what, a, e in zip(WHAT, results[actual], results[expected], strict=True):
                record((comparison, what), relative_error(a, e))
            for key, buffer in buffers[expected].items():
                other = buffers[actual][key]
                assert torch.isfinite(other).all(), (actual, key)
                record((comparison, f"buffer {key}"), relative_error(other, buffer))
    return errors


FP32 = 1e-5
"""Float32 agreement (relative): the other executor tests' bound. Measured on the CPU (20 data
seeds): <= 4.8e-6 chunked vs dense and vs float64, <= 2.9e-6 dense vs float64; 7.3e-6 for ∂W
under autocast (CurricularFace, float32 math)."""

SCALE = 64.0
"""The largest scale in the matrix (every fixed-scale loss; SphereFace's ‖x‖ and AdaCos's are
below it)."""


def half_bounds(dtype: torch.dtype) -> dict[str, float]:
    """The chunked path's bounds for bf16/fp16 inputs (against dense and against float64).

    The chunked path multiplies in the inputs' dtype: x̂ is rounded to it, and the PyTorch ops
    also round each GEMM result (the Triton kernels keep theirs in float32), so a cosine is off
    by up to ~u (u: bf16 2^-8, fp16 2^-11), a logit by up to ~s·u, and the softmax turns that into
    a relative change of the probabilities, hence of the gradients, of up to ~s·u. Bounds: loss
    2u, gradients s·u (s = 64: bf16 0.25, fp16 0.031), buffers u/2 (AdaCos's adaptive scale, a
    log-sum-exp of the cosines).

    Measured on the CPU (N = 10, D = 8, C = 37, chunk 16), the largest over every loss but
    CurricularFace, 20 data seeds, two steps, PyTorch ops, against dense (against float64 within
    ~10%): loss bf16 3.8e-3, fp16 5.2e-4 (~1u); gradients bf16 9.6e-2 (SphereFace; 7.8e-2
    ArcFace, CosFace and the others at seed 4; 1.1e-2 at seed 0), fp16 7.5e-3 (~0.3·s·u);
    AdaCos's scale bf16 6.5e-4, fp16 5.7e-5 (~0.15u). The Triton kernels (interpreter, seed 0)
    are about half the PyTorch ops' errors. At the CUDA shapes (N = 250, D = 136, C = 5003,
    simulated on the CPU, seed 0) every chunked error is below 0.65 of these bounds.

    CurricularFace is the exception: its non-target rule is discontinuous at the row's
    threshold τ = cos(θ_y + m) (``cos`` below, ``cos·(t + cos)`` above: a jump of
    ``s·τ(1 - t - τ)`` in the logit), so a half-precision rounding that moves a non-target
    cosine across τ changes that logit by O(s). In 2 of 20 seeds (bf16) this happened to a
    competitive non-target: loss 7e-2, gradients up to 0.93 off. That is the definition's
    sensitivity to any cosine error, not a fault of the chunked path (dense, in float32, has the
    same jump within ~1e-7 of τ). The matrix's data (seed 0, on the CPU and the CUDA shapes)
    has no such entry; ``test_curricular_rule_in_the_kernel_is_strict_at_the_threshold``
    (``test_triton.py``) checks the rule at τ itself."""
    u = unit_roundoff(dtype)
    return {"loss": 2 * u, "gradient": SCALE * u, "buffer": u / 2}


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u = eps / 2``: the largest relative error of one rounding to ``dtype`` (bf16: 2^-8 =
    3.9e-3, fp16: 2^-11 = 4.9e-4)."""
    return torch.finfo(dtype).eps / 2


def tolerance(precision: str, comparison: str, what: str) -> float:
    """The largest relative error (``max|a - e| / max|e|``) allowed for ``comparison``
    ("chunked-dense", "chunked-reference", "dense-reference") of ``what`` (loss, ∂x, ∂W,
    "buffer <name>"):

    * float32: :data:`FP32`.
    * bf16/fp16 inputs, dense vs float64: the dense path upcasts and computes in float32, so
      its loss and buffers are float32-exact (measured <= 2.4e-7) and its gradients are one
      rounding to the inputs' dtype (<= 0.95u: bf16 3.7e-3, fp16 4.7e-4, 20 seeds): u + FP32, a
      bound that holds by construction. The chunked path: :func:`half_bounds`.
    * autocast: the executors get half-precision activations and a float32 weight and compute in
      float32 (autocast is off inside): loss, ∂W and buffers as float32; ∂x passes back
      through the autocast linear map, one rounding to the autocast dtype (20 seeds: against
      float64 <= 0.95u; chunked vs dense <= 1.4u, roundings that went different ways): u + FP32
      (dense), 2u + FP32 (chunked).
    """
    dtype, autocast = PRECISIONS[precision]
    chunked = comparison.startswith("chunked")
    if autocast is not None:
        if what != "∂x":
            return FP32
        return (2 if chunked else 1) * unit_roundoff(autocast) + FP32
    if dtype == torch.float32:
        return FP32
    if not chunked:
        return unit_roundoff(dtype) + FP32 if what in ("∂x", "∂W") else FP32
    bounds = half_bounds(dtype)
    if what.startswith("buffer"):
        return bounds["buffer"]
    return bounds["loss" if what == "loss" else "gradient"]


KERNEL_CHOICES = ("auto", "torch", "triton") if CUDA else ("auto", "triton")
"""On the CPU ``"auto"`` is ``"torch"``; on CUDA it is ``"triton"``, and ``"torch"`` runs the
PyTorch ops on the GPU."""


@pytest.mark.parametrize("choice", KERNEL_CHOICES)
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("name", ALL)
def test_chunked_matches_dense_and_float64(
    name: str, precision: str, choice: str, request: pytest.FixtureRequest
) -> None:
    """``choice``: the chunked executor's ``kernels`` (the name ``kernels`` is conftest's
    fixture). A margin that declares no kernel rule would run the PyTorch chunk loop only
    (``kernels="triton"`` is an error for it; tested in test_triton); every registered softmax
    loss declares one."""
    if choice == "triton" and marginface.create_loss(name, 3, 2).margin.objective == "binary":
        pytest.skip(f"{name} is one-vs-all: its own kernels, in test_binary_triton.py")
    if choice == "triton" and not has_compiled_rule(name):
        pytest.skip(f"{name}'s non-target rule has no Triton kernel")
    # the launch counter needs triton ("triton" skips without it; "auto" runs PyTorch then)
    count = choice == "triton" or triton_available()
    launches: Counter = request.getfixturevalue("launches") if count else Counter()
    errors = measure(name, precision, choice)
    failures = {
        key: f"{error:.2e} > {tolerance(precision, *key):.2e}"
        for key, error in errors.items()
        if not error <= tolerance(precision, *key)
    }
    assert not failures, failures
    assert {comparison for comparison, _ in errors} == {
        "chunked-dense",
        "chunked-reference",
        "dense-reference",
    }
    if choice == "triton" or (choice == "auto" and CUDA and triton_available()):
        binary = marginface.create_loss(name, 3, 2).margin.objective == "binary"
        # the kernels (one-vs-all: their own) did the backward
        assert launches[backward_launcher(binary)] == STEPS
    else:
        assert sum(launches.values()) == 0


def test_forced_labels_cover_the_boundaries() -> None:
    """The layout the matrix relies on: C not a multiple of the chunk, and labels on both sides
    of each chunk boundary and at both ends."""
    assert C % CHUNK and C % TILE
    labels = forced_labels()
    assert {0, C - 1, CHUNK - 1, CHUNK} <= set(labels)
    last = (C - 1) // CHUNK * CHUNK
    assert {last - 1, last} <= set(labels)


@pytest.mark.parametrize("path", ["fused", "function"])
@pytest.mark.parametrize(
    ("name", "norm"), [("arcface", 4e3), ("normface", 4e3), ("magface", 4e3), ("adacos", 2e4)]
)
def test_float16_weight_with_large_norms_stays_finite(name: str, norm: float, path: str) -> None:
    """Regression: with a float16 weight the PyTorch ops multiplied ``(s·x̂) @ Wᵀ`` in float16,
    whose products ``s·x̂·w`` overflow (inf loss, inf/NaN gradients) once a center's norm passes
    65504/s (1023 at s = 64), although every logit is within ±s. Centers of norm 4000 here
    (AdaCos, whose scale is ~5-12: 20000, through its extra pass for the scale); the dense path
    (float32) is the reference. ``path``: the custom operators
    (:func:`chunked_margin_cross_entropy`) or the autograd Function the sharded head uses."""
    from marginface.executors.chunked import gemm_dtype
    from marginface.executors.chunked_function import ChunkedMarginCrossEntropy

    loss = make_loss(name, C, D, **loss_options(name))
    generator = torch.Generator().manual_seed(0)
    weight = F.normalize(torch.randn(C, D, generator=generator), dim=1) * norm
    x = torch.randn(N, D, generator=generator) * (30.0 / D**0.5)
    labels = torch.tensor(forced_labels() + [0] * (N - len(forced_labels())))
    x, weight, labels = (
        x.to(DEVICE, torch.float16),
        weight.to(DEVICE, torch.float16),
        labels.to(DEVICE),
    )
    results = []
    for impl in ("dense", "chunked"):
        margin = copy.deepcopy(loss.margin).to(DEVICE)
        x_in = x.clone().requires_grad_(True)
        w_in = weight.clone().requires_grad_(True)
        if impl == "dense":
            value = dense_margin_cross_entropy(x_in, w_in, labels, margin)
        elif path == "fused":
            value = chunked_margin_cross_entropy(
                x_in, w_in, labels, margin, chunk_size=CHUNK, kernels="torch"
            )
        else:
            gemm = gemm_dtype(x_in, w_in)
            value = ChunkedMarginCrossEntropy.apply(
                x_in.float(), w_in, labels, labels, margin, 1, CHUNK, gemm, False, None, None
            )
            extra = margin.regularizer(x_in.float().norm(dim=1)) if margin.requires_norms else None
            value = value + extra if extra is not None else value
        value.sum().backward()
        results.append((value.detach(), x_in.grad, w_in.grad))
    for what, a, e in zip(WHAT, results[1], results[0], strict=True):
        assert torch.isfinite(a).all(), what
        assert relative_error(a, e) <= tolerance("float16", "chunked-dense", what), what
