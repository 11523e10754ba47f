"""What the Triton kernels take besides tensors: tile sizes and launch options (:class:`Blocks`),
the non-target rule (:class:`NonTargetRule`) and a reduction's per-row inputs
(:class:`RowInputs`). Importable without triton;
:mod:`~marginface.executors.triton_kernels` launches with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..margins.rules import NONTARGET_RULES

__all__ = [
    "TUNED_BLOCKS",
    "TUNED_RULES",
    "Blocks",
    "NonTargetRule",
    "RowInputs",
    "default_blocks",
    "launch_blocks",
]


@dataclass(frozen=True)
class Blocks:
    """Tile sizes and launch options of a kernel.

    ``n``, ``c``, ``d``: rows, classes and embedding dimensions per tile, each a power of two
    ``>= 16`` (``tl.dot``'s minimum). ``warps``: warps per program (a power of two in
    ``[1, 32]``), ``stages``: software-pipelining stages of the loops (``>= 1``). The defaults
    are Triton's own launch defaults (4 warps, 3 stages) with 64×64×32 tiles; no tile size has
    been tuned on a GPU yet (docs/benchmarks.md).
    """

    n: int = 64
    c: int = 64
    d: int = 32
    warps: int = 4
    stages: int = 3

    def __post_init__(self) -> None:
        for name in ("n", "c", "d"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < 16
                or value & (value - 1)
            ):
                raise ValueError(f"Blocks.{name} must be a power of two >= 16, got {value!r}")
        warps = self.warps
        if (
            isinstance(warps, bool)
            or not isinstance(warps, int)
            or not 1 <= warps <= 32
            or (warps & (warps - 1))
        ):
            raise ValueError(f"Blocks.warps must be a power of two in [1, 32], got {warps!r}")
        if isinstance(self.stages, bool) or not isinstance(self.stages, int) or self.stages < 1:
            raise ValueError(f"Blocks.stages must be an integer >= 1, got {self.stages!r}")


def default_blocks(rows: int, classes: int, dim: int) -> Blocks:
    """Tiles no larger than the problem: each side ``next_power_of_2`` of the size, in
    ``[16, 64]`` (``[16, 32]`` for ``d``)."""

    def fit(size: int, top: int) -> int:  # the next power of two of size, within [16, top]
        return max(16, min(top, 1 << (max(size, 1) - 1).bit_length()))

    return Blocks(n=fit(rows, 64), c=fit(classes, 64), d=fit(dim, 32))


TUNED_BLOCKS: dict[str, Blocks] = {
    "statistics": Blocks(n=128, c=256, d=32, warps=8, stages=3),
    "gradient_tile": Blocks(n=128, c=64, d=64, warps=4, stages=3),
}
"""Tiles of the softmax's kernels (``"statistics"``: the forward's reduction;
``"gradient_tile"``: the tiled backward's) for bf16/fp16 inputs on CUDA with the rules of
:data:`TUNED_RULES` and one center per class, where a GPU run measured them faster than
:func:`default_blocks` (docs/benchmarks.md, "On an NVIDIA H200"). Other cases keep the
default: with sub-centers or the other rules these tiles spill registers (checked by
``tests/executors/test_triton_aot.py``)."""

TUNED_RULES = ("identity",)
"""The non-target rules :data:`TUNED_BLOCKS` applies to (those it was measured and compiled
without spills for)."""


def launch_blocks(
    kernel: str, x: Tensor, rows: int, classes: int, dim: int, *, rule: str, sub_centers: int
) -> Blocks:
    """The tiles a launch of ``kernel`` on ``x`` (``Tensor[rows, dim]``) over ``classes``
    takes: :data:`TUNED_BLOCKS` ``[kernel]`` for bf16/fp16 CUDA tensors, a rule of
    :data:`TUNED_RULES` and ``sub_centers == 1``, where listed; else :func:`default_blocks`."""
    tuned = TUNED_BLOCKS.get(kernel)
    if (
        tuned is not None
        and x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16)
        and rule in TUNED_RULES
        and sub_centers == 1
    ):
        return tuned
    return default_blocks(rows, classes, dim)


@dataclass(frozen=True)
class NonTargetRule:
    """The margin's non-target rule ``g_i`` as the Triton kernels take it (no gradient flows
    through any of its tensors).

    Attributes:
        threshold: ``Tensor[N]`` float32, the per-row ``τ_i`` (``"curricular"``, ``"mv"``) or
            ``f_i`` (``"gaussian"``); None for the other rules.
        t: ``Tensor[N]`` float32, CurricularFace's per-row ``t_i``; None otherwise.
        kind: a rule of :data:`~marginface.margins.rules.NONTARGET_RULES`; None (default) means
            ``"curricular"`` when ``threshold`` is given, else ``"identity"``.
        constants: ``Tensor[2]`` float32 on the tensors' device, the rule's scalars (the
            rules declared with ``constants``): read by the kernels from memory, so that no
            value crosses to the host. None for the other rules.

    What each rule computes, its derivative ``g'`` (which the backward multiplies by) and the
    parameters it reads are declared once, in :data:`~marginface.margins.rules.NONTARGET_RULES`
    (its Triton device function in :mod:`~marginface.executors.triton_rules`).
    """

    threshold: Tensor | None = None
    t: Tensor | None = None
    kind: str | None = None
    constants: Tensor | None = None

    def __post_init__(self) -> None:
        name = self.name
        if name not in NONTARGET_RULES:
            raise ValueError(
                f"NonTargetRule.kind must be one of {tuple(NONTARGET_RULES)}, got {name!r}"
            )
        declared = NONTARGET_RULES[name]
        missing = [
            field
            for field, needed in (
                ("threshold", declared.threshold),
                ("t", declared.row_t),
                ("constants", declared.constants > 0),
            )
            if needed and getattr(self, field) is None
        ]
        if missing:
            raise ValueError(f"NonTargetRule of kind {name!r} needs {', '.join(missing)}")

    @property
    def name(self) -> str:
        """The rule's name: :attr:`kind`, or the one implied by the fields when it is None."""
        if self.kind is not None:
            return self.kind
        return "curricular" if self.threshold is not None else "identity"

    @property
    def curricular(self) -> bool:
        """Whether the rule is CurricularFace's."""
        return self.name == "curricular"


REDUCTIONS = ("softmax", "softplus", "above_threshold")
"""The kernels' reduction steps (:mod:`~marginface.executors.triton_rules`)."""


@dataclass(frozen=True)
class RowInputs:
    """What the kernels read besides ``x̂``, ``W``, its inverse norms and the labels (every
    kernel takes all of it; what its reduction does not read is a stand-in).

    Attributes:
        reduction: ``"softmax"`` (the non-target logits' ``(max, Σexp)``), ``"softplus"``
            (the one-vs-all ``Σ softplus``) or ``"above_threshold"`` (a row statistics pass).
        scale, threshold, t: ``Tensor[N]`` float32 per-row vectors, or None where the
            reduction does not read them.
        constants: float32 scalars read on the device: the softmax's ``Tensor[2]``, the
            non-target rule's; ``"softplus"``'s ``Tensor[1]``, the bias term ``βb`` (the
            learned bias, so that no step reads it back to the host); None if not read.
        rule: the softmax's non-target rule, a name of
            :data:`~marginface.margins.rules.NONTARGET_RULES` (compile-time).
        binary: the one-vs-all rule's ``(s, t, μ, L)`` (runtime floats).
        clamp, straight_through: the one-vs-all rule's compile-time flags.
    """

    reduction: str
    scale: Tensor | None = None
    threshold: Tensor | None = None
    t: Tensor | None = None
    constants: Tensor | None = None
    rule: str = "identity"
    binary: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    clamp: bool = False
    straight_through: bool = False

    def __post_init__(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise ValueError(
                f"RowInputs.reduction must be one of {REDUCTIONS}, got {self.reduction!r}"
            )
        if self.rule not in NONTARGET_RULES:
            raise ValueError(
                f"RowInputs.rule must be one of {tuple(NONTARGET_RULES)}, got {self.rule!r}"
            )
        if self.reduction == "softplus" and self.constants is None:
            raise ValueError("RowInputs.constants must hold the bias term for 'softplus', got None")

    def pointers(self, stand_in: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``scale_ptr, threshold_ptr, t_ptr, const_ptr`` (float32 ``stand_in`` for None)."""
        given = (self.scale, self.threshold, self.t, self.constants)
        return tuple(stand_in if value is None else value for value in given)  # type: ignore[return-value]

    def arguments(self) -> dict[str, Any]:
        """The kernels' runtime scalars and compile-time arguments of the reduction and rule."""
        scale, power, offset, limit = self.binary
        return {
            "SCALE": scale, "POWER": power, "OFFSET": offset, "LIMIT": limit,
            "REDUCTION": self.reduction, "RULE": self.rule, "CLAMP": self.clamp,
            "ST": self.straight_through,
        }  # fmt: skip
