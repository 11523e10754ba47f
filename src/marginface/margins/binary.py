r"""One-vs-all (binary) margins: every class is its own binary classifier on the same cosines.

A binary margin turns each cosine into a binary logit, the target's pushed up and every other
class's pushed down, with a learned bias ``b`` (one scalar shared by all classes):

.. math::
    z_{iy_i} = s\,f(\cos\theta_{iy_i}) + \beta b, \qquad
    z_{ij} = s\,g(\cos\theta_{ij}) + \beta b \quad (j \ne y_i)

and the executors reduce them (:attr:`~marginface.margins.base.Margin.objective` ``"binary"``)
to the per-sample loss

.. math::
    L_i = w_+\,\mathrm{softplus}(-z_{iy_i}) + w_-\sum_{j\ne y_i}\mathrm{softplus}(z_{ij}),
    \qquad \mathrm{softplus}(z) = \log(1 + e^z)

instead of the softmax cross-entropy: no normalization over the classes, so the sum splits over
any partition of the classes (chunks, ranks) without an online log-sum-exp. SphereFace2
(:mod:`~marginface.margins.sphereface2`) and UniFace (:mod:`~marginface.margins.uniface`) are
binary margins; a subclass gives ``f``, ``g``, ``g'``, ``β`` (:attr:`BinaryMargin.bias_sign`),
the weights ``w_±`` and the bias's initial value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import Tensor, nn

from .._validation import check_device, check_real
from .base import Context, Margin
from .filtering import interclass_filter

__all__ = ["BinaryMargin", "softplus"]


def softplus(z: Tensor) -> Tensor:
    """``log(1 + e^z)``, exact and finite for every finite ``z``:
    ``max(z, 0) + log1p(e^{-|z|})`` (``F.softplus`` returns ``z`` itself above 20, an error
    of ``2e-9`` there). Derivative: ``sigmoid(z)``, ``1/2`` at ``z = 0`` too: ``max(z, 0)``
    and ``-|z|`` are written as selections whose slopes at 0 are those of the ``z <= 0`` side
    (0 and 1; ``clamp_min`` and ``abs`` would give 1 and 0 there, a slope of 1)."""
    positive = z > 0
    upper = torch.where(positive, z, torch.zeros_like(z))  # max(z, 0)
    lower = torch.where(positive, -z, z)  # -|z| <= 0: e^lower never overflows
    return upper + torch.log1p(torch.exp(lower))


class BinaryMargin(Margin):
    r"""Base class of the one-vs-all margins (module docstring for the loss).

    A subclass implements :meth:`target_similarity` (``f``), :meth:`nontarget_similarity`
    (``g``) and :meth:`nontarget_similarity_slope` (``g'``, written out, for the chunked
    executor), sets :attr:`bias_sign` and passes the weights and the bias's initial value here.

    Args:
        scale: ``s > 0``, the logit scale (SphereFace2's ``r``).
        positive_weight: ``w_+ > 0``, the weight of the target's term.
        negative_weight: ``w_- >= 0``, the weight of each non-target term.
        bias: the initial value of the learned bias ``b`` (logit units).
        logit_clamp: ``L > 0`` clamps every logit to ``[-L, L]`` (value and gradient, as
            ``torch.clamp``) before the softplus, or None (default): no clamp.
        gradient: ``"exact"`` (default) or ``"straight_through"``: ``f`` and ``g`` are then
            treated as constant shifts of the cosine, ``∂z/∂cos θ = s`` for every class (the
            margin applied under ``no_grad``, as OpenSphere's SphereFace2-A and -M).
        interclass_filtering_threshold: ``τ`` in [0, 1]; above 0, non-target cosines ``> τ``
            are set to 0 (value and gradient) before ``g``, on every executor (see
            :class:`~marginface.margins.base.Margin`). Default: 0 (off).
        device: where the bias is created.

    Attributes:
        bias: ``Parameter[]`` (0-dim), the learned ``b`` (float32; float64 in a float64 head).
            Replicated, with its full gradient, on every rank of a sharded head.
    """

    objective: ClassVar[str] = "binary"
    bias_sign: ClassVar[float] = 1.0
    """``β``: the logits hold ``+b`` (SphereFace2) or ``-b`` (UniFace's threshold)."""

    def __init__(
        self,
        *,
        scale: float,
        positive_weight: float,
        negative_weight: float,
        bias: float,
        logit_clamp: float | None = None,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.scale = check_real("scale", scale, positive=True)
        self.positive_weight = check_real("positive_weight", positive_weight, positive=True)
        self.negative_weight = check_real("negative_weight", negative_weight, nonnegative=True)
        self.logit_clamp = (
            None if logit_clamp is None else check_real("logit_clamp", logit_clamp, positive=True)
        )
        device = check_device("device", device)
        initial = check_real("bias", bias)
        self.bias = nn.Parameter(torch.tensor(initial, dtype=torch.float32, device=device))

    # ------------------------------------------------------------------ subclass hooks
    def target_similarity(self, cos_target: Tensor) -> Tensor:
        """``f(cos θ_y)``, the target's similarity with its margin, unscaled: ``Tensor[N]``,
        differentiable."""
        raise NotImplementedError

    def nontarget_similarity(self, cosine: Tensor) -> Tensor:
        """``g(cos θ_j)``, elementwise and differentiable (``Tensor[N, c]``)."""
        raise NotImplementedError

    def nontarget_similarity_slope(self, cosine: Tensor) -> Tensor:
        """``g'(cos θ_j)``, elementwise (the chunked executor's backward, without autograd)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the logits
    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def runs_chunked(self) -> bool:
        """True: the chunked, sharded and Partial FC executors reduce the binary logits chunk by
        chunk (:mod:`marginface.executors.binary_loop`)."""
        return True

    def nontarget_kernel(self) -> str | None:
        """None: the softmax reduction's compiled rules do not apply; the binary reduction has
        its own custom operators and Triton kernels, for the rule
        :meth:`binary_kernel_parameters` declares."""
        return None

    def binary_kernel_parameters(self) -> dict[str, float] | None:
        """The non-target rule as the custom operators and the Triton kernels compile it, or
        None (the chunked step then runs on an autograd Function, a graph break under
        ``torch.compile``, and has no Triton kernel):
        ``{"power": t, "offset": μ}`` when ``g(c) = 2((c + 1)/2)^t - 1 + μ`` (UniFace's ``g(c) =
        c`` is ``t = 1``, ``μ = 0``). The kernels add the scale, the bias, the clamp and the
        gradient mode themselves (:mod:`marginface.executors.binary_loop`). Default: None."""
        return None

    def _clamped(self, z: Tensor) -> Tensor:
        return z if self.logit_clamp is None else z.clamp(-self.logit_clamp, self.logit_clamp)

    def target_logit(self, cos_target: Tensor, bias: Tensor) -> Tensor:
        """``z_y = s·f(cos θ_y) + β·b`` (clamped if :attr:`logit_clamp`): ``Tensor[N]``,
        differentiable in ``cos_target`` (``Tensor[N]``, in [-1, 1]) and ``bias`` (0-dim)."""
        similarity = self.target_similarity(cos_target)
        if self.gradient == "straight_through":
            similarity = cos_target + (similarity - cos_target).detach()
        return self._clamped(self.scale * similarity + self.bias_sign * bias.to(cos_target.dtype))

    def nontarget_logit(self, cosine: Tensor, bias: Tensor) -> Tensor:
        """``z_j = s·g(cos θ_j) + β·b`` elementwise (clamped if :attr:`logit_clamp`),
        differentiable: ``Tensor[N, c] -> Tensor[N, c]``."""
        similarity = self.nontarget_similarity(cosine)
        if self.gradient == "straight_through":
            similarity = cosine + (similarity - cosine).detach()
        return self._clamped(self.scale * similarity + self.bias_sign * bias.to(cosine.dtype))

    def nontarget_logit_slopes(
        self, cosine: Tensor, bias: Tensor
    ) -> tuple[Tensor, Tensor, Tensor | float]:
        """``(z, ∂z/∂cos, ∂z/∂b)`` of :meth:`nontarget_logit`, without autograd: two
        ``Tensor[N, c]`` and a float (``β``) or, with a clamp, a ``Tensor[N, c]``."""
        b = bias.detach().to(cosine.dtype)
        z = self.scale * self.nontarget_similarity(cosine) + self.bias_sign * b
        if self.gradient == "straight_through":
            slope = torch.full_like(cosine, self.scale)
        else:
            slope = self.nontarget_similarity_slope(cosine) * self.scale
        if self.logit_clamp is None:
            return z, slope, self.bias_sign
        limit = self.logit_clamp
        inside = (z >= -limit) & (z <= limit)  # torch.clamp passes the gradient at the ends
        zero = torch.zeros_like(slope)
        return (
            z.clamp(-limit, limit),
            torch.where(inside, slope, zero),
            torch.where(inside, torch.full_like(z, self.bias_sign), zero),
        )

    def apply(
        self,
        cosine: Tensor,
        labels: Tensor,
        norms: Tensor | None = None,
        class_values: Mapping[str, Tensor] | None = None,
    ) -> Tensor:
        """The binary logits ``Tensor[N, C]``: ``z_y`` at each row's label, ``z_j`` elsewhere
        (rows labelled ``-1`` hold non-target logits only), after inter-class filtering. The
        executors reduce them with
        :func:`~marginface.executors.margin_loss.binary_cross_entropy`. ``class_values``: as
        :meth:`Margin.apply <marginface.margins.base.Margin.apply>`'s; a one-vs-all margin
        declares no per-class parameters, so it must be None or empty."""
        if class_values:
            raise ValueError(
                f"{type(self).__name__} declares no per-class parameters, got class_values for "
                f"{sorted(class_values)}"
            )
        if self.interclass_filtering_threshold > 0:
            cosine = interclass_filter(cosine, labels, self.interclass_filtering_threshold)
        has_target = labels >= 0  # (N,)
        index = labels.clamp_min(0).unsqueeze(1)  # (N, 1)
        logits = self.nontarget_logit(cosine, self.bias)  # (N, C)
        cos_target = cosine.gather(1, index).squeeze(1).clamp(-1.0, 1.0)  # (N,)
        target = self.target_logit(cos_target, self.bias)  # (N,)
        is_target = torch.zeros_like(cosine, dtype=torch.bool)  # (N, C), one byte per entry
        is_target.scatter_(1, index, has_target.unsqueeze(1))
        return torch.where(is_target, target.unsqueeze(1).to(logits.dtype), logits)

    def prepare(
        self,
        cos_target: Tensor,
        labels: Tensor,
        norms: Tensor | None,
        cosine: Tensor | None = None,
    ) -> Context:
        return {"scale": self.scale}

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        """``f(cos θ_y) + β·b/s``: the target logit divided by the scale (what the margin
        curves plot)."""
        return self.target_logit(cos_target, self.bias) / self.scale

    def extra_repr(self) -> str:
        parts = [f"scale={self.scale}"]
        if self.logit_clamp is not None:
            parts.append(f"logit_clamp={self.logit_clamp}")
        if self.gradient != "exact":
            parts.append(f"gradient={self.gradient!r}")
        return ", ".join(parts) + self._filtering_repr()
