"""executors/backend.py: the chunked executor's backend, chosen in one place, once per call.

The decision table (each condition -> autograd path and kernels), pinned row by row on CPU: a
CUDA batch is a stand-in carrying only what the choice reads (device, dtype), and triton's
presence is monkeypatched, so every row is checked on any machine. Then the entry points are
spied on: one choice per call, and what it chose is what runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import marginface
from marginface.executors import backend as backend_module
from marginface.executors import binary_loop as binary_loop_module
from marginface.executors import chunked as chunked_module
from marginface.executors.backend import AUTOGRAD_PATHS, Backend, choose_backend
from marginface.executors.chunked_function import ChunkedLoss
from marginface.margins import ArcFaceMargin, CosFaceMargin, UniFaceMargin

C, D, N = 12, 8, 5


@dataclass
class _Batch:
    """What :func:`choose_backend` reads of the embeddings: their device and dtype."""

    device: torch.device
    dtype: torch.dtype


CPU = torch.zeros(N, D)
CUDA = _Batch(torch.device("cuda"), torch.float32)
CUDA64 = _Batch(torch.device("cuda"), torch.float64)
WEIGHT = torch.zeros(C, D)


class _ShiftedNegatives(CosFaceMargin):
    """A softmax margin with its own non-target rule: no compiled rule, no kernel."""

    def nontarget_cosine(self, cosine, context):
        return cosine - 0.1


class _HalfCosine(UniFaceMargin):
    """A one-vs-all margin whose non-target rule is not declared as numbers."""

    def nontarget_similarity(self, cosine):
        return 0.5 * cosine + 0.1

    def nontarget_similarity_slope(self, cosine):
        return torch.full_like(cosine, 0.5)


def _margin(name: str):
    if name == "arcface-filtering":
        return ArcFaceMargin(interclass_filtering_threshold=0.2)
    if name == "uniface-filtering":
        return UniFaceMargin(num_classes=C, interclass_filtering_threshold=0.3)
    if name == "shifted":
        return _ShiftedNegatives()
    if name == "half-cosine":
        return _HalfCosine(num_classes=C)
    return marginface.create_loss(name, C, D).margin


SHARD = object()  # the choice reads only whether there is a shard

# (margin, embeddings, kernels, shard, row_block, compiling) -> (autograd, triton)
TABLE = [
    # softmax, a compiled-in rule: the custom operators, eager twin or compiled
    (("arcface", CPU, "torch", None, None, False), ("eager_op", False)),
    (("arcface", CPU, "auto", None, None, False), ("eager_op", False)),
    (("arcface", CUDA, "auto", None, None, False), ("eager_op", True)),
    (("arcface", CUDA, "torch", None, None, False), ("eager_op", False)),
    (("arcface", CUDA64, "auto", None, None, False), ("eager_op", False)),
    (("arcface", CPU, "triton", None, None, False), ("eager_op", True)),
    (("arcface", CPU, "torch", None, None, True), ("compiled_op", False)),
    (("arcface", CUDA, "auto", None, None, True), ("compiled_op", True)),
    (("curricularface", CUDA, "auto", None, None, False), ("eager_op", True)),
    (("npcface", CUDA, "auto", None, None, False), ("eager_op", True)),
    # softmax on the autograd Function: a shard, row blocks, another rule, filtering
    (("arcface", CUDA, "auto", SHARD, None, False), ("function", True)),
    (("arcface", CPU, "torch", SHARD, None, True), ("function", False)),
    (("arcface", CUDA, "auto", None, 4, False), ("function", False)),
    (("arcface", CPU, "torch", None, 4, True), ("function", False)),
    (("shifted", CPU, "torch", None, None, False), ("function", False)),
    (("shifted", CUDA, "auto", None, None, False), ("function", False)),
    (("arcface-filtering", CUDA, "auto", None, None, False), ("function", False)),
    # one-vs-all: a declared rule on the custom operators, else the Function
    (("sphereface2", CPU, "torch", None, None, False), ("eager_op", False)),
    (("sphereface2", CUDA, "auto", None, None, False), ("eager_op", True)),
    (("uniface", CPU, "triton", None, None, False), ("eager_op", True)),
    (("uniface", CPU, "auto", None, None, True), ("compiled_op", False)),
    (("sphereface2", CUDA, "auto", SHARD, None, False), ("function", True)),
    (("uniface-filtering", CUDA, "auto", None, None, False), ("function", False)),
    (("half-cosine", CUDA, "auto", None, None, False), ("function", False)),
    (("half-cosine", CPU, "torch", None, None, True), ("function", False)),
]


@pytest.fixture
def triton_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton 'installed' and its CPU interpreter on, whatever this machine has."""
    monkeypatch.setattr(backend_module, "triton_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _row_id(row) -> str:
    (name, batch, kernels, shard, row_block, compiling), (autograd, triton) = row
    device = {id(CPU): "cpu", id(CUDA): "cuda", id(CUDA64): "cuda-float64"}[id(batch)]
    condition = [name, device, kernels]
    condition += ["shard"] * (shard is not None) + [f"row_block={row_block}"] * bool(row_block)
    condition += ["compiling"] * compiling
    return "-".join(condition) + f"->{autograd}-{'triton' if triton else 'torch'}"


@pytest.mark.parametrize(("condition", "expected"), TABLE, ids=[_row_id(r) for r in TABLE])
def test_the_decision_table(
    condition, expected, triton_importable, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, embeddings, kernels, shard, row_block, compiling = condition
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    backend = choose_backend(
        _margin(name), embeddings, WEIGHT, kernels=kernels, shard=shard, row_block=row_block
    )
    assert (backend.autograd, backend.triton) == expected
    assert backend.custom_ops == (expected[0] != "function")
    assert backend.compiled == (expected[0] == "compiled_op")
    assert backend.kernels == ("triton" if expected[1] else "torch")


def test_auto_without_triton_runs_torch_and_triton_without_it_raises(monkeypatch) -> None:
    monkeypatch.setattr(backend_module, "triton_available", lambda: False)
    for name in ("arcface", "sphereface2"):
        backend = choose_backend(_margin(name), CUDA, WEIGHT, kernels="auto")
        assert backend == Backend("eager_op", False)
        with pytest.raises(ValueError, match="kernels='triton' needs triton installed"):
            choose_backend(_margin(name), CPU, WEIGHT, kernels="triton")


@pytest.mark.parametrize(
    ("name", "row_block", "message"),
    [
        ("arcface", 4, "row_block runs on PyTorch ops only"),
        ("shifted", None, "_ShiftedNegatives's nontarget_cosine has no Triton kernel"),
        ("arcface-filtering", None, "interclass_filtering_threshold > 0 has no Triton"),
        ("uniface-filtering", None, "interclass_filtering_threshold > 0 has no Triton"),
        ("half-cosine", None, "_HalfCosine's non-target rule has no Triton kernel"),
    ],
)
def test_triton_where_it_cannot_run_is_named(name, row_block, message, triton_importable):
    with pytest.raises(ValueError, match=message):
        choose_backend(_margin(name), CPU, WEIGHT, kernels="triton", row_block=row_block)


def test_the_environment_is_read_once_by_the_choice(triton_importable, monkeypatch) -> None:
    monkeypatch.setenv("MARGINFACE_KERNELS", "torch")
    assert choose_backend(_margin("arcface"), CUDA, WEIGHT) == Backend("eager_op", False)
    monkeypatch.setenv("MARGINFACE_KERNELS", "triton")
    assert choose_backend(_margin("arcface"), CPU, WEIGHT) == Backend("eager_op", True)
    monkeypatch.setenv("MARGINFACE_KERNELS", "fast")
    with pytest.raises(ValueError, match=r"MARGINFACE_KERNELS must be one of .*'fast'"):
        choose_backend(_margin("arcface"), CPU, WEIGHT)
    with pytest.raises(ValueError, match=r"kernels must be one of .*'fast'"):
        choose_backend(_margin("arcface"), CPU, WEIGHT, kernels="fast")


def test_a_backend_names_a_bad_field() -> None:
    assert AUTOGRAD_PATHS == ("compiled_op", "eager_op", "function")
    with pytest.raises(ValueError, match=r"autograd must be one of .*'operator'"):
        Backend("operator", False)
    with pytest.raises(TypeError, match="triton must be a bool, got 'torch'"):
        Backend("function", "torch")


# ----------------------------------------------------------------- once per call, passed down
class _Spy:
    """Counts :func:`choose_backend`'s calls (and the environment reads inside it); returns
    ``forced`` instead of its answer when given one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, forced: Backend | None = None) -> None:
        self.choices: list[Backend] = []
        self.reads = 0
        self.forced = forced
        real_choose, real_read = choose_backend, backend_module.requested_kernels

        def choose(*args, **kwargs):
            backend = real_choose(*args, **kwargs)
            backend = self.forced if self.forced is not None else backend
            self.choices.append(backend)
            return backend

        def read(kernels):
            self.reads += 1
            return real_read(kernels)

        monkeypatch.setattr(chunked_module, "choose_backend", choose)
        monkeypatch.setattr(backend_module, "requested_kernels", read)


def _step(loss_fn, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=generator, requires_grad=True)
    labels = torch.randint(0, C, (N,), generator=generator)
    value = loss_fn(x, labels)
    value.backward()
    return [value.detach(), x.grad, loss_fn.weight.grad]


STEPS = [  # (loss, head options, the path it takes)
    ("arcface", {}, "eager_op"),
    ("arcface", {"impl": "row_block", "row_block": 2}, "function"),
    ("npcface", {}, "eager_op"),
    ("adacos", {}, "eager_op"),
    ("sphereface2", {}, "eager_op"),
    ("uniface", {"interclass_filtering_threshold": 0.3}, "function"),
]


@pytest.mark.parametrize(("name", "options", "path"), STEPS)
def test_one_choice_per_call(name, options, path, monkeypatch) -> None:
    """A training step (forward and backward) chooses once and reads the environment once;
    a second step chooses again (the environment may have changed)."""
    spy = _Spy(monkeypatch)
    loss_fn = _loss(name, **options)
    _step(loss_fn)
    assert [b.autograd for b in spy.choices] == [path] and spy.reads == 1
    loss_fn.weight.grad = None
    _step(loss_fn, seed=1)
    assert len(spy.choices) == 2 and spy.reads == 2


def _loss(name: str, **options):
    torch.manual_seed(0)  # the same centers (and SphereFace2's bias) for every head built here
    return marginface.create_loss(name, C, D, **{"impl": "chunked", **options})


@pytest.mark.parametrize("name", ["arcface", "sphereface2"])
def test_the_choice_is_what_runs(name, monkeypatch) -> None:
    """Forcing the autograd Function on a margin that would take the custom operators: the
    Function runs (nothing below re-decides), with the same values and gradients."""
    natural = _step(_loss(name))
    applied, fused = [], []
    real_apply = ChunkedLoss.apply

    def apply(*args):
        applied.append(type(args[5]).__name__)  # the Reduction
        return real_apply(*args)

    monkeypatch.setattr(ChunkedLoss, "apply", apply)
    for module, function in (
        (chunked_module, "_fused_cross_entropy"),
        (binary_loop_module, "fused_binary_loss"),
    ):
        real = getattr(module, function)

        def counted(*args, _real=real, _name=function, **kwargs):
            fused.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, function, counted)
    _step(_loss(name))
    assert len(fused) == 1 and not applied  # the custom operators when not forced
    fused.clear()
    spy = _Spy(monkeypatch, forced=Backend("function", False))
    forced = _step(_loss(name))
    assert len(spy.choices) == 1 and len(applied) == 1 and not fused
    for a, e in zip(forced, natural, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["arcface", "sphereface2"])
def test_the_sharded_entry_chooses_once_and_passes_it_down(name, monkeypatch) -> None:
    """``sharded_margin_cross_entropy`` asks once, with its shard, and hands the answer to the
    loss it runs (stubbed here: no process group is needed to see what it receives)."""
    spy = _Spy(monkeypatch)
    received = []

    def stub(*args, **kwargs):
        received.append(next(a for a in (*args, *kwargs.values()) if isinstance(a, Backend)))
        return torch.zeros(N)

    monkeypatch.setattr(chunked_module, "_function_loss", stub)
    monkeypatch.setattr(chunked_module, "binary_loss", stub)
    margin = _margin(name)
    x, labels = torch.randn(N, D), torch.zeros(N, dtype=torch.long)
    chunked_module.sharded_margin_cross_entropy(x, WEIGHT, labels, labels, margin, SHARD)
    assert spy.choices == received == [Backend("function", False)] and spy.reads == 1
