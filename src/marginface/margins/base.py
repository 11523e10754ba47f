"""The margin interface: a small object that turns cosines into logits.

A margin never owns class centers. It sees the cosines between normalized embeddings and
normalized class centers, the labels, and (for the losses that need them) the embeddings' norms,
and returns the scaled logits that go into softmax cross-entropy. That is what lets one margin
drive a dense head, a chunked/fused executor and a class-sharded head alike.

Every margin is written through three hooks, each a page of the paper at most:

* :meth:`Margin.prepare` -- per-row context (the scale, thresholds, sampled margins) from the
  target cosines and norms; updates the margin's running state, in training mode only.
* :meth:`Margin.target_cosine` -- the margin-adjusted target cosine ``f(cos θ_y)``, unscaled.
* :meth:`Margin.nontarget_cosine` -- the non-target cosines, elementwise given the row context
  (identity for every loss except CurricularFace).

and the logits are ``scale · f(cos θ_y)`` at the target and ``scale · g(cos θ_j)`` elsewhere.

Executors that never hold the whole cosine matrix (chunked, sharded, Partial FC) learn what they
need from declarations on the margin, never from its type:

* :meth:`Margin.runs_chunked` -- whether the margin is written through the hooks only.
* :meth:`Margin.nontarget_kernel` and :meth:`Margin.nontarget_kernel_parameters` -- which of the
  executors' compiled non-target rules (:data:`NONTARGET_KERNELS`) ``nontarget_cosine`` equals,
  and its per-row parameters, so that the rule runs in the custom operators and Triton kernels.
* :meth:`Margin.statistics_scale` and :meth:`Margin.prepare_with_statistics` -- a batch
  statistic over the non-target logits that ``prepare`` needs (AdaCos's ``B_avg``), which such
  an executor computes in one extra pass over the classes.
* :attr:`Margin.objective` -- the reduction: softmax cross-entropy (``"softmax"``) or the
  one-vs-all sum of softplus terms (``"binary"``, :mod:`marginface.margins.binary`).
* :meth:`Margin.row_statistics_size`, :meth:`Margin.row_statistics_terms` and
  :meth:`Margin.prepare_with_row_statistics` -- per-row sums over the non-target classes that
  ``prepare`` needs (NPCFace's count and sum of hard-negative cosines), which such an executor
  accumulates in one extra pass over the classes (summed across ranks when sharded);
  :meth:`Margin.row_statistics_kernel` names the compiled statistics
  (:data:`ROW_STATISTICS_KERNELS`) they equal, so that the pass runs as a custom operator.
* :meth:`Margin.class_parameters` and :meth:`Margin.class_regularizer` -- learnable values, one
  per class (AdaM-Softmax's margins), that the *head* creates and shards with the class centers;
  the executors hand the margin each row's target-class value in its context (with gradient),
  and the regularizer reads only their sums over all classes (one all-reduce when sharded).

A new margin gets the chunked, sharded and Partial FC paths by declaring these (docs/fused.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from .._validation import check_choice, check_labels
from .filtering import check_filtering_threshold, interclass_filter
from .rules import NONTARGET_RULES, ROW_STATISTICS

__all__ = [
    "GRADIENT_MODES",
    "NONTARGET_KERNELS",
    "ROW_STATISTICS_KERNELS",
    "ClassParameter",
    "Context",
    "Margin",
]

Context = dict[str, "Tensor | float"]
"""Per-row quantities computed once per batch by :meth:`Margin.prepare`.

Always holds ``"scale"``: a float, a 0-dim tensor or a ``Tensor[N, 1]``. Margins add their own
keys (CurricularFace's ``"threshold"``, MagFace's ``"margin"``, ...), each a float or a tensor with
one row per sample.
"""

GRADIENT_MODES = ("exact", "straight_through")


@dataclass(frozen=True)
class ClassParameter:
    """A learnable value per class that a margin reads at each row's target class, declared by
    the margin (:meth:`Margin.class_parameters`) and owned by the head.

    The head (:class:`~marginface.head.MarginSoftmaxLoss`) creates it as a ``Parameter[c]`` for
    the ``c`` classes it holds (all ``C``, or its block on a class-sharded head, where it is
    sharded with the centers), draws it from ``U(init_low, init_high)``, and at each step hands
    the margin ``value[y_i]`` for every row (``Tensor[N]``, with gradient; on Partial FC the
    sampled classes' values, as the centers) in the context under the parameter's name.

    Attributes:
        init_low, init_high: the initial values are drawn from ``U(init_low, init_high)``.
        low, high: the values the margin sees are clamped to ``[low, high]`` (None: no bound)
            with the gradient passed through unchanged (a straight-through clamp); the stored
            parameter is never modified in ``forward``.
        doc: what the value is, with its units.
    """

    init_low: float
    init_high: float
    low: float | None = None
    high: float | None = None
    doc: str = ""

    def bounded(self, value: Tensor) -> Tensor:
        """``value`` clamped to ``[low, high]``, gradient passed through unchanged (any shape)."""
        if self.low is None and self.high is None:
            return value
        return value + (value.clamp(self.low, self.high) - value).detach()


NONTARGET_KERNELS = tuple(NONTARGET_RULES)
"""The names of the non-target rules ``g`` the chunked executor runs compiled (its custom
operators and Triton kernels, the derivatives written out), one of which a margin may name in
:meth:`Margin.nontarget_kernel`. Each is declared once, with its parameters, its PyTorch value
and slope and its Triton device function, in :data:`~marginface.margins.rules.NONTARGET_RULES`
(the table of what each computes: docs/fused.md)."""

ROW_STATISTICS_KERNELS = tuple(ROW_STATISTICS)
"""The names of the per-row statistics (:meth:`Margin.row_statistics_terms`) the chunked
executor's custom operators have compiled in (:meth:`Margin.row_statistics_kernel`), each
declared in :data:`~marginface.margins.rules.ROW_STATISTICS`: ``"above_threshold"``, the sums
``Σ_j [c_ij > τ_i]·c_ij`` and ``Σ_j [c_ij > τ_i]`` with a per-row threshold ``τ_i``
(NPCFace's hard negatives, :func:`~marginface.margins.rules.above_threshold_terms`).
"""


class Margin(nn.Module):
    """Base class of the margins: ``(cosine[N, C], labels[N], norms[N] | None) -> logits[N, C]``.

    Args:
        gradient: ``"exact"`` (default): gradients are the true derivatives of the formula,
            finite everywhere (see :mod:`marginface.margins._angles`). ``"straight_through"``:
            the target's margin is treated as a constant shift, so ``∂logit_y/∂cos θ_y = scale``
            as for plain NormFace (insightface's behaviour, where the margin is applied in place
            under ``no_grad``). Non-target logits always get their exact gradient.
        interclass_filtering_threshold: ``τ`` in [0, 1]. Default: 0 (off). Above 0, every
            non-target cosine ``> τ`` is set to 0 before the margin (value and gradient), as
            insightface's ``interclass_filtering_threshold``
            (:mod:`~marginface.margins.filtering`). Runs on every executor.

    Labels of ``-1`` mark rows whose class is not among these ``C`` columns (a class-sharded
    executor's convention): such rows get no margin at all.
    """

    requires_norms: bool = False
    """Whether :meth:`forward` needs the embeddings' L2 norms ``norms[N]``."""

    stateful: ClassVar[bool] = False
    """Whether the margin updates buffers in training mode (CurricularFace's t, AdaCos's s...)."""

    feature_norm_is_quality: ClassVar[bool] = False
    """Whether the embeddings' L2 norm ``‖x‖`` this margin trains is a quality score of the
    sample (MagFace's magnitude-aware margin): the pipeline then reports the verification
    accuracy as the lowest-quality pairs are rejected (the error-versus-reject curve,
    ``erc_accuracy@reject=...``) and draws it. Read by the pipeline instead of the class."""

    objective: ClassVar[str] = "softmax"
    """How the executors reduce this margin's logits: ``"softmax"`` (softmax cross-entropy over
    the classes, a log-sum-exp) or ``"binary"`` (one-vs-all: a sum of per-class softplus terms;
    :class:`~marginface.margins.binary.BinaryMargin`, SphereFace2 and UniFace)."""

    def __init__(
        self, *, gradient: str = "exact", interclass_filtering_threshold: float = 0.0
    ) -> None:
        super().__init__()
        self.gradient = check_choice("gradient", gradient, GRADIENT_MODES)
        self.interclass_filtering_threshold = check_filtering_threshold(
            interclass_filtering_threshold
        )

    # ------------------------------------------------------------------ hooks
    def scale_for(self, norms: Tensor | None) -> Tensor | float:
        """The logit scale ``s``: a float, a 0-dim tensor, or ``Tensor[N, 1]`` (per row)."""
        raise NotImplementedError

    def prepare(
        self,
        cos_target: Tensor,
        labels: Tensor,
        norms: Tensor | None,
        cosine: Tensor | None = None,
    ) -> Context:
        """Per-row context for this batch; may update buffers (training mode only).

        Args:
            cos_target: ``Tensor[N]``, ``cos θ_y`` clamped to [-1, 1] (any value where the
                label is -1).
            labels: ``Tensor[N]`` of int64 class indices into these C columns, -1 for none.
            norms: ``Tensor[N]`` embedding norms, or None.
            cosine: the full ``Tensor[N, C]`` where the executor has it, else None.
        """
        return {"scale": self.scale_for(norms)}

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        """The margin-adjusted target cosine ``f(cos θ_y)``: ``Tensor[N] -> Tensor[N]``."""
        raise NotImplementedError

    def nontarget_cosine(self, cosine: Tensor, context: Context) -> Tensor:
        """Non-target cosines ``g(cos θ_j)``, elementwise given the row context. Default: identity.

        Args:
            cosine: ``Tensor[N, c]`` (all classes, or one chunk of them).
        """
        return cosine

    def nontarget_is_identity(self) -> bool:
        """Whether :meth:`nontarget_cosine` returns its input unchanged for this instance.

        True exactly when the class does not override :meth:`nontarget_cosine`; a margin whose
        override is the identity for some settings (AdaFace without ``cosine_clamp``) says so, so
        that executors keep their identity fast paths.
        """
        return type(self).nontarget_cosine is Margin.nontarget_cosine

    def runs_chunked(self) -> bool:
        """Whether executors that see one chunk of classes at a time can run this margin: it is
        written through the hooks (:meth:`prepare`, :meth:`target_cosine`,
        :meth:`nontarget_cosine`). Default: True unless the class overrides :meth:`apply` or
        :meth:`forward`, which need the whole cosine matrix."""
        return not any(
            getattr(type(self), name) is not getattr(Margin, name) for name in ("apply", "forward")
        )

    def nontarget_kernel(self) -> str | None:
        """The compiled rule (one of :data:`NONTARGET_KERNELS`) that :meth:`nontarget_cosine`
        equals for this instance, or None: executors then evaluate :meth:`nontarget_cosine`
        chunk by chunk in PyTorch (correct, but a graph break under ``torch.compile`` and no
        Triton kernel). Default: ``"identity"`` when :meth:`nontarget_is_identity`, else None.

        Inter-class filtering (``interclass_filtering_threshold > 0``) is applied by the
        executors before the rule, whatever this returns.
        """
        return "identity" if self.nontarget_is_identity() else None

    def nontarget_kernel_parameters(self, context: Context) -> dict[str, Tensor]:
        """The per-row parameters of :meth:`nontarget_kernel`'s rule from this batch's
        ``context``, no gradient: ``{}`` for ``"identity"``; ``{"threshold": Tensor[N] or
        Tensor[N, 1], "t": 0-dim or Tensor[N]}`` for ``"curricular"``; what each rule reads is
        its :class:`~marginface.margins.rules.RuleDeclaration`. Default: ``{}``."""
        return {}

    def statistics_scale(self) -> Tensor | float | None:
        """The scale ``s`` at which :meth:`prepare` needs the batch statistic

        .. math:: \\log B = \\log\\Big(\\frac1N\\sum_i\\sum_{j\\ne y_i} e^{s\\cos\\theta_{ij}}\\Big)

        (over the inter-class-filtered cosines), or None (default) when it needs none. An
        executor without the whole cosine matrix computes ``log B`` in one extra pass over the
        classes and calls :meth:`prepare_with_statistics` instead of :meth:`prepare`.
        """
        return None

    def prepare_with_statistics(
        self, cos_target: Tensor, labels: Tensor, norms: Tensor | None, log_b: Tensor
    ) -> Context:
        """:meth:`prepare` given ``log_b`` (0-dim), the statistic of :meth:`statistics_scale`,
        for executors that never hold the whole cosine matrix. Default: :meth:`prepare`."""
        return self.prepare(cos_target, labels, norms)

    def row_statistics_size(self) -> int:
        """How many per-row sums over the non-target classes :meth:`prepare` needs (``k``), 0
        (default) for none. A margin that declares ``k > 0`` writes the summands in
        :meth:`row_statistics_terms` and the context from the sums in
        :meth:`prepare_with_row_statistics`; executors without the whole cosine matrix
        accumulate the sums chunk by chunk (and across ranks) before the margin's hooks run."""
        return 0

    def row_statistics_terms(self, cosine: Tensor, cos_target: Tensor) -> tuple[Tensor, ...]:
        r"""The ``k`` summands of the per-row statistics, elementwise given the row's target:

        .. math:: S_{i,q} = \sum_{j \ne y_i} t_q(\cos\theta_{ij}, \cos\theta_{iy_i})

        Args:
            cosine: ``Tensor[N, c]``, the (inter-class-filtered) cosines of all classes or one
                chunk of them; the executor drops the target column's terms.
            cos_target: ``Tensor[N]``, ``cos θ_y`` clamped to [-1, 1] (no gradient).

        Returns:
            ``k`` tensors ``Tensor[N, c]`` (no gradient is taken through them).
        """
        raise NotImplementedError

    def row_statistics_kernel(self) -> str | None:
        """The compiled per-row statistics (one of :data:`ROW_STATISTICS_KERNELS`) that
        :meth:`row_statistics_terms` equals for this instance, or None (default): executors
        then call :meth:`row_statistics_terms` chunk by chunk on the autograd Function (a graph
        break under ``torch.compile``). A margin declaring one runs its statistics pass as a
        custom operator (:mod:`~marginface.executors.fused_op`)."""
        return None

    def row_statistics_kernel_parameters(self, cos_target: Tensor) -> dict[str, Tensor]:
        """The per-row parameters of :meth:`row_statistics_kernel` given ``cos_target``
        (``Tensor[N]``, clamped to [-1, 1], no gradient): ``{"threshold": Tensor[N] or
        Tensor[N, 1]}`` for ``"above_threshold"``. Default: ``{}``."""
        return {}

    def prepare_with_row_statistics(
        self, cos_target: Tensor, labels: Tensor, norms: Tensor | None, sums: Tensor
    ) -> Context:
        """:meth:`prepare` given ``sums`` (``Tensor[k, N]``, no gradient), the per-row
        statistics of :meth:`row_statistics_terms` over every non-target class. Default:
        :meth:`prepare`."""
        return self.prepare(cos_target, labels, norms)

    def dense_row_statistics(self, cosine: Tensor, cos_target: Tensor, labels: Tensor) -> Tensor:
        """The per-row statistics from the whole cosine matrix (``Tensor[N, C]``; the target
        column, where ``labels >= 0``, excluded): ``Tensor[k, N]``, without gradient. A margin
        that declares row statistics calls it from :meth:`prepare`, which the dense path runs."""
        with torch.no_grad():
            columns = torch.arange(cosine.shape[1], device=cosine.device)  # (C,)
            is_target = labels.unsqueeze(1) == columns  # (N, C); a label of -1 matches none
            terms = self.row_statistics_terms(cosine, cos_target)
            return torch.stack([term.masked_fill(is_target, 0.0).sum(dim=1) for term in terms])

    def regularizer(self, norms: Tensor | None) -> Tensor | None:
        """Per-sample term added to the cross-entropy (MagFace's ``λ_g·g(a)``), or None."""
        return None

    def class_parameters(self) -> Mapping[str, ClassParameter]:
        """The learnable per-class values this margin reads (:class:`ClassParameter`), by name.
        Default: none. The head creates, initializes and shards them; every executor puts each
        row's target-class value (``Tensor[N]``, bounded, with gradient) into the context under
        the same name before :meth:`target_cosine` (:meth:`with_class_values`)."""
        return {}

    def class_regularizer(self, sums: Mapping[str, Tensor], num_classes: int) -> Tensor | None:
        """A term added to every sample's loss from the per-class parameters, or None (default).

        Args:
            sums: ``{name: Σ_c value_c}`` (0-dim, with gradient) over *all* ``num_classes``
                classes of each declared parameter, bounded as the margin sees them. A
                class-sharded head sums its block and all-reduces the value, so a regularizer
                written through these sums is exact on every executor.
            num_classes: ``C``.
        """
        return None

    def with_class_values(
        self, context: Context, class_values: Mapping[str, Tensor] | None
    ) -> Context:
        """``context`` with each declared per-class parameter's row values (``Tensor[N]``)
        added under its name.

        Raises:
            ValueError: the margin declares per-class parameters and ``class_values`` lacks one.
        """
        declared = self.class_parameters()
        if not declared:
            return context
        missing = sorted(set(declared) - set(class_values or {}))
        if missing:
            raise ValueError(
                f"{type(self).__name__} learns per-class parameters {missing}: call it with "
                "class_values={name: Tensor[N]} (the values at each row's target class), or "
                "use a head (marginface.create_loss), which owns them"
            )
        assert class_values is not None
        return {**context, **{name: class_values[name] for name in declared}}

    # ------------------------------------------------------------ composition
    def adjusted_target_cosine(
        self, cos_target: Tensor, norms: Tensor | None, context: Context
    ) -> Tensor:
        """:meth:`target_cosine` with this margin's gradient mode applied: ``Tensor[N]``."""
        adjusted = self.target_cosine(cos_target, norms, context)
        if self.gradient == "straight_through":
            adjusted = cos_target + (adjusted - cos_target).detach()
        return adjusted

    def apply(
        self,
        cosine: Tensor,
        labels: Tensor,
        norms: Tensor | None = None,
        class_values: Mapping[str, Tensor] | None = None,
    ) -> Tensor:
        """:meth:`forward` without argument checks (for executors that checked already).

        The target logit is written as a correction added at the label's column
        (``scatter_add_``), whose backward passes the gradient through unchanged instead of
        copying the ``N×C`` matrix as an overwrite would. With inter-class filtering on, the
        filtered cosines are what every hook (``prepare`` included) sees.
        """
        if self.interclass_filtering_threshold > 0:
            cosine = interclass_filter(cosine, labels, self.interclass_filtering_threshold)
        has_target = labels >= 0  # (N,)
        index = labels.clamp_min(0).unsqueeze(1)  # (N, 1)
        raw_target = cosine.gather(1, index)  # (N, 1), unclamped
        cos_target = raw_target.squeeze(1).clamp(-1.0, 1.0)  # (N,)
        context = self.prepare(cos_target, labels, norms, cosine)
        context = self.with_class_values(context, class_values)
        target = self.adjusted_target_cosine(cos_target, norms, context)  # (N,)
        scale = context["scale"]
        logits = self.nontarget_cosine(cosine, context) * scale  # (N, C), a fresh tensor
        # what the non-target rule put at the label's column (elementwise, so computable alone)
        placed = self.nontarget_cosine(raw_target, context).squeeze(1)  # (N,)
        row_scale = scale.reshape(-1) if isinstance(scale, Tensor) and scale.dim() == 2 else scale
        correction = torch.where(has_target, (target - placed) * row_scale, 0.0)  # (N,)
        logits.scatter_add_(1, index, correction.unsqueeze(1).to(logits.dtype))
        return logits

    def forward(
        self,
        cosine: Tensor,
        labels: Tensor,
        norms: Tensor | None = None,
        class_values: Mapping[str, Tensor] | None = None,
    ) -> Tensor:
        """Margin-adjusted, scaled logits.

        Args:
            cosine: ``Tensor[N, C]``, cosines between normalized embeddings and class centers.
            labels: ``Tensor[N]`` of int64 in ``[0, C)``, or -1 for "no target among these C".
            norms: ``Tensor[N]``, the embeddings' L2 norms (required when
                :attr:`requires_norms`).
            class_values: ``{name: Tensor[N]}``, each declared per-class parameter's value at
                each row's target class (required when :meth:`class_parameters` declares any).

        Returns:
            ``Tensor[N, C]`` logits for softmax cross-entropy.
        """
        check_cosine(cosine)
        labels = check_labels(labels, cosine.shape[0], cosine.shape[1], allow_missing=True)
        check_norms(norms, cosine.shape[0], required=self.requires_norms)
        check_class_values(class_values, cosine.shape[0])
        return self.apply(cosine, labels, norms, class_values)

    def extra_repr(self) -> str:
        return f"gradient={self.gradient!r}" if self.gradient != "exact" else ""

    def _filtering_repr(self) -> str:
        """``", interclass_filtering_threshold=τ"`` when the filter is on, else ``""``."""
        threshold = self.interclass_filtering_threshold
        return f", interclass_filtering_threshold={threshold}" if threshold > 0 else ""


def check_cosine(cosine: object) -> Tensor:
    """Check a cosine matrix: a finite floating ``Tensor[N, C]`` with ``N >= 1``."""
    if not isinstance(cosine, Tensor):
        raise TypeError(f"cosine must be a torch.Tensor, got {type(cosine).__name__}")
    if not cosine.is_floating_point():
        raise TypeError(f"cosine must have a floating dtype, got {cosine.dtype}")
    if cosine.dim() != 2:
        raise ValueError(f"cosine must have shape (N, C), got {tuple(cosine.shape)}")
    if cosine.shape[0] == 0:
        raise ValueError("cosine is an empty batch (N = 0)")
    if not bool(torch.isfinite(cosine).all()):
        raise ValueError("cosine contains non-finite values (NaN or inf)")
    return cosine


def check_norms(norms: object, batch_size: int, *, required: bool) -> Tensor | None:
    """Check embedding norms: None (if not required) or a floating ``Tensor[N]``."""
    if norms is None:
        if required:
            raise ValueError("norms is required by this margin (it depends on the feature norm)")
        return None
    if not isinstance(norms, Tensor) or not norms.is_floating_point():
        raise TypeError(f"norms must be a floating torch.Tensor of shape (N,), got {norms!r}")
    if tuple(norms.shape) != (batch_size,):
        raise ValueError(f"norms must have shape ({batch_size},), got {tuple(norms.shape)}")
    return norms


def check_class_values(class_values: object, batch_size: int) -> Mapping[str, Tensor] | None:
    """Check per-row class values: None or a mapping of names to floating ``Tensor[N]``."""
    if class_values is None:
        return None
    if not isinstance(class_values, Mapping):
        raise TypeError(
            "class_values must be a mapping of names to Tensor[N], got "
            f"{type(class_values).__name__}"
        )
    for name, value in class_values.items():
        if not isinstance(value, Tensor) or not value.is_floating_point():
            raise TypeError(
                f"class_values[{name!r}] must be a floating torch.Tensor, got {value!r}"
            )
        if tuple(value.shape) != (batch_size,):
            raise ValueError(
                f"class_values[{name!r}] must have shape ({batch_size},), got {tuple(value.shape)}"
            )
    return class_values
