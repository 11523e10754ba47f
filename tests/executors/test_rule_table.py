"""The executors read the non-target rules from their one declaration
(``marginface.margins.rules``, issue 36): an unknown rule is a ``ValueError`` naming it and the
known ones on every path that takes a name (never CurricularFace's formula as a fallback), and
no executor module imports a specific margin's module (only the interface: ``margins.base``,
``margins.rules`` and the one-vs-all family's ``margins.binary``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from marginface.executors.chunk_loop import chunk_rule_for_kernel
from marginface.executors.kernel_options import NonTargetRule
from marginface.executors.triton_dispatch import kernel_rule
from marginface.margins.rules import NONTARGET_RULES

EXECUTORS = Path(__file__).resolve().parents[2] / "src" / "marginface" / "executors"
ALLOWED_MARGIN_MODULES = {"base", "rules", "binary"}

PARAMETERS = {"threshold": torch.zeros(3, 1), "t": torch.tensor(0.5)}


@pytest.mark.parametrize("triton", [False, True])
def test_unknown_rule_is_an_error_not_curricularface(triton: bool) -> None:
    with pytest.raises(ValueError, match=r"unknown non-target rule 'scaled'.*curricular") as error:
        chunk_rule_for_kernel(
            "scaled", PARAMETERS, rows=3, device=torch.device("cpu"), triton=triton
        )
    assert all(name in str(error.value) for name in NONTARGET_RULES)


def test_kernel_rule_and_the_kernels_rule_reject_an_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"unknown non-target rule 'scaled'"):
        kernel_rule("scaled", PARAMETERS, 3, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"NonTargetRule.kind must be one of .*got 'scaled'"):
        NonTargetRule(kind="scaled")


def test_each_rule_reaches_the_kernels_with_what_it_declares() -> None:
    """``kernel_rule`` fills exactly the fields a rule's declaration reads."""
    threshold = torch.tensor([[0.1], [0.2], [0.3]])  # (N, 1)
    for name, declared in NONTARGET_RULES.items():
        t = torch.tensor(0.5) if declared.row_t else torch.tensor([0.5, 2.0])
        rule = kernel_rule(name, {"threshold": threshold, "t": t}, 3, torch.device("cpu"))
        assert rule.name == name
        assert (rule.threshold is not None) == declared.threshold, name
        assert (rule.t is not None) == declared.row_t, name
        assert (rule.constants is not None) == (declared.constants > 0), name
        if declared.threshold:
            torch.testing.assert_close(rule.threshold, torch.tensor([0.1, 0.2, 0.3]))
        if declared.constants:
            assert rule.constants.tolist() == [0.5, 2.0]
        if declared.row_t:
            assert rule.t.tolist() == [0.5, 0.5, 0.5]


def _margin_modules_imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module:
            parts = node.module.split(".")
            if parts[0] == "margins":
                found.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "marginface.margins."
        ):
            found.add(node.module.split(".")[2])
    return found


def test_no_executor_imports_a_specific_margin_module() -> None:
    imported = {
        path.name: _margin_modules_imported(path) - ALLOWED_MARGIN_MODULES
        for path in sorted(EXECUTORS.glob("*.py"))
    }
    assert {name: found for name, found in imported.items() if found} == {}
    assert _margin_modules_imported(EXECUTORS / "chunk_loop.py") >= {"rules"}
