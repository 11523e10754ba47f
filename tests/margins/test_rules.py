"""The non-target rules' one table (``marginface.margins.rules``, issue 36): an unknown name is
an error naming the known ones; every declared rule has its Triton device function and one
dispatch line in ``executors/triton_rules.py`` (read from the source, without triton); the
written-out slope of each rule whose gradient is not held constant is autograd's of its value
(float64); the margins' formulas are the rules' own functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from marginface.margins import base, curricularface, li_arcface, mv_softmax, npcface, rules
from marginface.margins.rules import (
    NONTARGET_RULES,
    ROW_STATISTICS,
    declared_row_statistics,
    declared_rule,
)

TRITON_RULES = (
    Path(__file__).resolve().parents[2] / "src" / "marginface" / "executors" / "triton_rules.py"
)


def test_unknown_rule_is_an_error_naming_it_and_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown non-target rule 'scaled'") as error:
        declared_rule("scaled")
    for name in NONTARGET_RULES:
        assert name in str(error.value)
    with pytest.raises(ValueError, match=r"unknown non-target rule None"):
        declared_rule(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown row statistics 'below'.*above_threshold"):
        declared_row_statistics("below")


def test_the_margin_interface_names_exactly_the_declared_rules() -> None:
    assert tuple(NONTARGET_RULES) == base.NONTARGET_KERNELS
    assert tuple(ROW_STATISTICS) == base.ROW_STATISTICS_KERNELS
    assert NONTARGET_RULES["identity"].identity
    assert all(not rule.identity for name, rule in NONTARGET_RULES.items() if name != "identity")
    for name, rule in NONTARGET_RULES.items():
        assert rule.name == name and 0 <= rule.constants <= 2


def _nontarget_dispatch() -> tuple[set[str], dict[str, str]]:
    """The device functions defined in triton_rules.py, and ``_nontarget``'s ``RULE == name``
    branches, each with the function it calls."""
    tree = ast.parse(TRITON_RULES.read_text(encoding="utf-8"))
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    (dispatch,) = (
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_nontarget"
    )
    branches: dict[str, str] = {}
    node = dispatch.body[1]  # after the docstring: the if/elif chain
    while isinstance(node, ast.If):
        test = node.test
        assert isinstance(test, ast.Compare) and isinstance(test.comparators[0], ast.Constant)
        call = node.body[0].value  # value, slope = _rule(...)
        branches[test.comparators[0].value] = call.func.id
        node = node.orelse[0] if node.orelse else None
    return functions, branches


def test_every_declared_rule_has_its_device_function_and_a_dispatch_line() -> None:
    functions, branches = _nontarget_dispatch()
    for name, rule in NONTARGET_RULES.items():
        assert rule.device_function in functions, name
        if name != "identity":  # the identity is the chain's checked last branch
            assert branches.get(name) == rule.device_function, name
    assert set(branches) == set(NONTARGET_RULES) - {"identity"}


PARAMETERS = {
    "curricular": {"threshold": torch.tensor([0.1, -0.2, 0.3]), "t": torch.tensor(0.4)},
    "mv": {"threshold": torch.tensor([0.1, -0.2, 0.3]), "t": torch.tensor([1.2, 0.2])},
    "divided_angle": {"t": torch.tensor([1.7, 0.0])},
}


@pytest.mark.parametrize("name", ["curricular", "mv", "linear_angle", "divided_angle"])
def test_written_out_slope_is_the_derivative_of_the_value(name: str) -> None:
    """The rules whose gradient is the true one (no term held constant): ``g'`` as written
    equals autograd's derivative of ``g`` in float64 away from the kinks and the clamps."""
    generator = torch.Generator().manual_seed(0)
    cos = (torch.rand(3, 40, generator=generator, dtype=torch.float64) * 1.8 - 0.9).requires_grad_()
    parameters = {k: v.double() for k, v in PARAMETERS.get(name, {}).items()}
    function, derivative = declared_rule(name).slopes(parameters)
    (slope,) = torch.autograd.grad(function(cos).sum(), cos)
    torch.testing.assert_close(derivative(cos.detach()), slope, rtol=1e-12, atol=1e-12)


def test_the_margins_formulas_are_the_rules_functions() -> None:
    assert curricularface.curricular_negative is rules.curricular_negative
    assert mv_softmax.mv_negative is rules.mv_negative
    assert npcface.mv_negative is rules.mv_negative
    assert npcface.above_threshold_terms is rules.above_threshold_terms
    assert li_arcface.linear_angle is rules.linear_angle
