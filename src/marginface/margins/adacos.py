"""AdaCos: no margin, an adaptive scale chosen from the batch's statistics."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_device, check_int
from .base import Context, Margin

__all__ = ["MIN_SCALE", "AdaCosMargin", "adacos_dynamic_scale", "adacos_fixed_scale"]

MIN_SCALE = 1.0
"""Floor of AdaCos's scale. The paper's dynamic formula gives ``s <= 0`` when ``B_avg <= 1``
(possible with few classes once the non-target cosines are very negative), which would flip the
logits' order; we never let the scale fall below this."""


def adacos_fixed_scale(num_classes: int) -> float:
    r"""AdaCos's fixed scale :math:`\tilde s = \sqrt{2}\,\log(C - 1)` (Zhang et al., 2019, Eq. 13).

    Args:
        num_classes: ``C >= 2``. For ``C = 2`` the formula gives 0; the scale is floored at
            :data:`MIN_SCALE`.
    """
    return max(math.sqrt(2.0) * math.log(num_classes - 1), MIN_SCALE)


def adacos_dynamic_scale(log_b_avg: Tensor, theta_median: Tensor) -> Tensor:
    r"""AdaCos's dynamic scale :math:`s = \log B_{avg} / \cos(\min(\pi/4, \theta_{med}))`.

    Args:
        log_b_avg: 0-dim, ``log((1/N) Σ_i Σ_{j≠y_i} exp(s_old · cos θ_ij))``.
        theta_median: 0-dim, the median target angle in radians.

    Returns:
        0-dim tensor, the new scale (no gradient), floored at :data:`MIN_SCALE`.
    """
    capped = torch.clamp(theta_median, max=math.pi / 4)
    return (log_b_avg / torch.cos(capped)).clamp_min(MIN_SCALE)


class AdaCosMargin(Margin):
    r"""AdaCos (Zhang et al., 2019): ``logit_j = s·cos θ_j`` with ``s`` fixed or adapted per batch.

    Dynamic mode (training only, before the logits are formed, as in the paper's Algorithm 1):

    .. math::
        B_{avg} = \frac1N\sum_i\sum_{j\ne y_i} e^{s\cos\theta_{ij}},\qquad
        s \leftarrow \frac{\log B_{avg}}{\cos\big(\min(\tfrac{\pi}{4}, \theta_{med})\big)}

    ``s`` starts at the fixed scale ``√2·log(C - 1)`` and is a buffer, saved in ``state_dict``;
    it carries no gradient. ``B_avg`` is computed as a log-sum-exp, so it cannot overflow. With
    ``interclass_filtering_threshold > 0``, ``B_avg`` is taken over the filtered cosines (the
    non-target logits the softmax sees), on every executor.

    Args:
        num_classes: ``C >= 2``, needed for the initial scale.
        dynamic: adapt the scale per batch (default True); False keeps the fixed scale.
        interclass_filtering_threshold: ``τ`` in [0, 1]: non-target cosines above it are set to
            0 (insightface's label-noise filter; see :class:`~marginface.margins.base.Margin`).
            Default: 0 (off).
    """

    stateful = True

    def __init__(
        self,
        num_classes: int,
        *,
        dynamic: bool = True,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.num_classes = check_int("num_classes", num_classes, minimum=2)
        self.dynamic = bool(dynamic)
        initial = adacos_fixed_scale(self.num_classes)
        device = check_device("device", device)
        self.register_buffer("scale", torch.tensor(initial, device=device))

    def scale_for(self, norms: Tensor | None) -> Tensor:
        return self.scale.detach()

    def prepare(
        self,
        cos_target: Tensor,
        labels: Tensor,
        norms: Tensor | None,
        cosine: Tensor | None = None,
    ) -> Context:
        if self.training and self.dynamic:
            if cosine is None:
                raise ValueError(
                    "AdaCos with dynamic=True needs the full cosine matrix; this executor "
                    "must call update_scale() with its own statistics"
                )
            has_target = labels >= 0  # (N,)
            with torch.no_grad():
                logits = self.scale * cosine.detach()  # (N, C)
                index = labels.clamp_min(0).unsqueeze(1)  # (N, 1)
                logits = logits.scatter(
                    1,
                    index,
                    torch.where(  # drop the targets
                        has_target.unsqueeze(1), float("-inf"), logits.gather(1, index)
                    ),
                )
                log_b_avg = torch.logsumexp(logits.flatten(), dim=0) - math.log(cosine.shape[0])
                self.update_scale(log_b_avg, cos_target, valid=has_target)
        return {"scale": self.scale.detach()}

    def statistics_scale(self) -> Tensor | None:
        """The current scale in dynamic training mode (``B_avg`` is taken at the old scale,
        Algorithm 1), else None."""
        return self.scale.detach() if self.training and self.dynamic else None

    def prepare_with_statistics(
        self, cos_target: Tensor, labels: Tensor, norms: Tensor | None, log_b: Tensor
    ) -> Context:
        """:meth:`update_scale` from the executor's ``log B_avg`` (dynamic training mode), then
        the context."""
        if self.training and self.dynamic:
            self.update_scale(log_b, cos_target.detach())
        return {"scale": self.scale_for(norms)}

    def update_scale(
        self, log_b_avg: Tensor, target_cosines: Tensor, valid: Tensor | None = None
    ) -> None:
        """Set the scale from ``log B_avg`` and the batch's target cosines ``Tensor[M]``.

        Exposed so that executors that never hold the full cosine matrix (chunked, sharded) can
        accumulate ``log B_avg`` themselves.

        Args:
            log_b_avg: 0-dim.
            target_cosines: ``Tensor[M]``.
            valid: ``Tensor[M]`` of bool, the entries that count (rows with a target), or None
                for all. The median is ``torch.median``'s (the lower one for an even count);
                with no valid entry the scale is unchanged. Computed without a host sync (no
                boolean indexing), so ``torch.compile`` traces it in one graph.
        """
        if target_cosines.numel() == 0:
            return
        with torch.no_grad():
            theta = torch.arccos(target_cosines.reshape(-1).clamp(-1.0, 1.0))  # (M,)
            if valid is None:
                theta_median = torch.median(theta)
                count = None
            else:  # invalid entries sort last; the lower median of the valid ones
                valid = valid.reshape(-1)
                count = valid.sum()
                ordered = torch.where(valid, theta, torch.full_like(theta, math.inf)).sort().values
                middle = ((count - 1).clamp_min(0) // 2).reshape(1)
                theta_median = ordered.gather(0, middle).reshape(())
            new_scale = adacos_dynamic_scale(log_b_avg, theta_median).to(self.scale)
            if count is not None:
                new_scale = torch.where(count > 0, new_scale, self.scale)
            self.scale.copy_(new_scale)

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return cos_target

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, dynamic={self.dynamic}" + self._filtering_repr()
