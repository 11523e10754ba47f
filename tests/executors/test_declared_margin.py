"""A margin defined here, outside the package, gets the chunked, compiled and sharded paths by
declaring what the executors need (:meth:`Margin.nontarget_kernel`,
:meth:`Margin.statistics_scale`), without any edit to the executors: chunked equals dense."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import marginface
from marginface.executors.chunked import chunked_margin_cross_entropy
from marginface.executors.dense import dense_margin_cross_entropy
from marginface.executors.fused_op import RULE_CURRICULAR, RULE_IDENTITY, nontarget_rule
from marginface.margins.base import Context, Margin
from marginface.margins.curricularface import curricular_negative

from ..distributed.harness import run_distributed

N, C, D = 9, 23, 6


class HardNegativeCosFace(Margin):
    """CosFace's target ``cos θ_y - m`` with hard negatives re-weighted by a fixed ``t``:
    ``g(cos) = cos (t + cos)`` above ``cos θ_y - m`` (the compiled ``"curricular"`` rule)."""

    def __init__(self, margin: float = 0.2, scale: float = 16.0, t: float = 0.3) -> None:
        super().__init__()
        self.margin, self.scale, self.t = margin, scale, t

    def scale_for(self, norms):
        return self.scale

    def prepare(self, cos_target, labels, norms, cosine=None) -> Context:
        threshold = (cos_target.detach() - self.margin).unsqueeze(1)  # (N, 1)
        t = torch.tensor(self.t, dtype=cos_target.dtype, device=cos_target.device)
        return {"scale": self.scale, "threshold": threshold, "t": t}

    def target_cosine(self, cos_target, norms, context):
        return cos_target - self.margin

    def nontarget_cosine(self, cosine, context):
        return curricular_negative(cosine, context["threshold"].to(cosine.dtype), context["t"])

    def nontarget_kernel(self) -> str:
        return "curricular"

    def nontarget_kernel_parameters(self, context):
        return {"threshold": context["threshold"], "t": context["t"]}


class BatchScaledNormFace(Margin):
    """NormFace whose scale is set from the batch statistic ``log B`` at ``s0`` (a toy AdaCos:
    ``s = 1 + log B / 2``): declared by :meth:`statistics_scale`."""

    def __init__(self, s0: float = 8.0) -> None:
        super().__init__()
        self.s0 = s0

    def scale_for(self, norms):
        return self.s0

    def statistics_scale(self) -> float:
        return self.s0

    def _context(self, log_b: torch.Tensor) -> Context:
        return {"scale": 1.0 + log_b.detach() / 2.0}

    def prepare(self, cos_target, labels, norms, cosine=None) -> Context:
        assert cosine is not None, "the dense executor passes the cosines"
        logits = self.s0 * cosine.detach()  # (N, C)
        logits = logits.scatter(1, labels.unsqueeze(1), float("-inf"))  # drop the targets
        log_b = torch.logsumexp(logits.flatten(), dim=0) - math.log(cosine.shape[0])
        return self._context(log_b)

    def prepare_with_statistics(self, cos_target, labels, norms, log_b) -> Context:
        return self._context(log_b)

    def target_cosine(self, cos_target, norms, context):
        return cos_target


def _data(dtype: torch.dtype = torch.float64):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(N, D, generator=generator, dtype=dtype) * 2
    weight = torch.randn(C, D, generator=generator, dtype=dtype)
    labels = torch.randint(0, C, (N,), generator=generator)
    return x, weight, labels


def _run(executor, margin: Margin, **options):
    x, weight, labels = _data()
    x.requires_grad_(True)
    weight.requires_grad_(True)
    loss = executor(x, weight, labels, copy.deepcopy(margin), **options)
    upstream = torch.linspace(0.5, 1.5, N, dtype=loss.dtype)
    (loss * upstream).sum().backward()
    return loss.detach(), x.grad, weight.grad


def _assert_close(actual, expected, tolerance: float = 1e-10) -> None:
    for a, e in zip(actual, expected, strict=True):
        assert torch.allclose(a, e, rtol=tolerance, atol=tolerance), (a - e).abs().max()


def test_the_declarations_pick_the_compiled_rules() -> None:
    assert nontarget_rule(HardNegativeCosFace()) == RULE_CURRICULAR
    assert nontarget_rule(BatchScaledNormFace()) == RULE_IDENTITY


@pytest.mark.parametrize("margin", [HardNegativeCosFace(), BatchScaledNormFace()], ids=repr)
@pytest.mark.parametrize("chunk_size", [1, 5, C])
def test_a_declared_margin_runs_chunked_as_dense(margin: Margin, chunk_size: int) -> None:
    expected = _run(dense_margin_cross_entropy, margin)
    actual = _run(chunked_margin_cross_entropy, margin, chunk_size=chunk_size, kernels="torch")
    _assert_close(actual, expected)


def test_the_statistics_hook_changes_the_loss() -> None:
    """Not vacuous: the statistic moves the scale away from ``s0``, so the loss differs from
    NormFace's at ``s0``."""
    fixed = BatchScaledNormFace()
    fixed.statistics_scale = lambda: None  # type: ignore[method-assign]
    fixed.prepare = lambda cos_target, labels, norms, cosine=None: {"scale": 8.0}  # type: ignore[method-assign]
    declared = _run(chunked_margin_cross_entropy, BatchScaledNormFace(), chunk_size=5)[0]
    plain = _run(chunked_margin_cross_entropy, fixed, chunk_size=5)[0]
    assert not torch.allclose(declared, plain, rtol=1e-3)


def test_a_declared_margin_compiles_without_a_graph_break() -> None:
    x, weight, labels = _data(torch.float32)
    margin = HardNegativeCosFace()

    def step(x, weight):
        return chunked_margin_cross_entropy(x, weight, labels, margin, chunk_size=5).sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)  # a break would raise
    value = compiled(x, weight)
    expected = dense_margin_cross_entropy(x, weight, labels, HardNegativeCosFace()).sum()
    assert torch.allclose(value, expected, rtol=1e-5)


def _sharded(rank: int, world: int) -> None:
    group = torch.distributed.group.WORLD
    x, weight, labels = _data()
    rows = torch.arange(N).chunk(world)[rank]
    for margin in (HardNegativeCosFace(), BatchScaledNormFace()):
        dense = marginface.MarginSoftmaxLoss(C, D, copy.deepcopy(margin), reduction="none")
        dense = dense.to(torch.float64)
        dense.load_state_dict({"weight": weight})
        sharded = marginface.MarginSoftmaxLoss(
            C, D, copy.deepcopy(margin), reduction="none", process_group=group, chunk_size=4
        ).to(torch.float64)
        sharded.load_state_dict({"weight": weight})
        x_dense = x.clone().requires_grad_(True)
        expected = dense(x_dense, labels)
        expected.sum().backward()
        x_mine = x[rows].clone().requires_grad_(True)
        actual = sharded(x_mine, labels[rows])
        actual.sum().backward()
        assert torch.allclose(actual, expected.detach(), rtol=1e-10, atol=1e-10)
        # the backbone's gradient is scaled by the world size (DDP averages it back)
        assert torch.allclose(x_mine.grad / world, x_dense.grad[rows], rtol=1e-9, atol=1e-10)
        start, stop = sharded.class_range
        assert torch.allclose(sharded.weight.grad, dense.weight.grad[start:stop], atol=1e-10)


def test_a_declared_margin_runs_on_the_sharded_head() -> None:
    run_distributed(_sharded, 2)


def test_an_unknown_declared_rule_is_named() -> None:
    class _Unknown(HardNegativeCosFace):
        def nontarget_kernel(self) -> str:
            return "quadratic"

    x, weight, labels = _data()
    with pytest.raises(ValueError, match=r"_Unknown's nontarget_kernel\(\) must be .*'quadratic'"):
        chunked_margin_cross_entropy(x, weight, labels, _Unknown())
