"""Target logit against the angle for each margin (the ArcFace paper's Figure: "target logit
curves"), computed through the margins' public forward only."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from .._validation import check_int, check_real
from ..margins.base import Margin
from ..registry import create_loss, list_losses
from ._figure import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["DEFAULT_NORM", "default_margins", "margin_curve", "plot_margin_curves"]

DEFAULT_NORM = 30.0
"""Feature norm ``‖x‖`` given to margins that depend on it (SphereFace's original variant,
MagFace, AdaFace): the training pipeline's scale
(``marginface.train.config.PIPELINE_SCALE``), inside MagFace's [10, 110]."""

Y_FLOOR = -2.0
"""Lowest target logit / scale shown: curves that fall further (SphereFace's ψ reaches
``-2m + 1``) leave the axes there, keeping the region of ``cos θ`` readable."""

# Options that turn a registered loss's default margin into one whose curve shows its shape:
# SphereFace anneals from λ = 1000 (≈ plain softmax) to λ_min = 5; λ = 0 is its target ψ(θ).
_CURVE_OPTIONS: dict[str, tuple[dict, str]] = {
    "sphereface": ({"lambda_base": 0.0, "lambda_min": 0.0}, "λ = 0"),
}


def default_margins(num_classes: int = 10) -> dict[str, Margin]:
    """Every registered loss's default margin, by loss name (built with ``create_loss``).

    SphereFace is built with ``lambda_base = lambda_min = 0`` (the end of its annealing, its
    ψ(θ)); its label says so. ``num_classes`` matters only for AdaCos's scale. Default: 10.
    """
    margins = {}
    for name in list_losses():
        options, note = _CURVE_OPTIONS.get(name, ({}, ""))
        loss = create_loss(name, num_classes=num_classes, embedding_dim=2, **options)
        margins[f"{name} ({note})" if note else name] = loss.margin
    return margins


def margin_curve(margin: Margin, theta: np.ndarray, norm: float = DEFAULT_NORM) -> np.ndarray:
    r"""The margin's target logit divided by its scale, :math:`f(\cos\theta)`, at each angle.

    Calls ``margin(cosine, labels, norms)`` in eval mode under ``no_grad`` on a ``(T, 2)`` cosine
    matrix whose column 0 is ``cos θ`` (the target, label 0) and column 1 is 0, then divides the
    target logit by ``margin.scale_for(norms)``. The margin's mode is restored afterwards and
    its state is not advanced. A margin's learnable per-class values (AdaM-Softmax's margins) are
    taken at the middle of their declared initial range.

    Args:
        margin: any :class:`~marginface.margins.Margin`.
        theta: ``float[T]`` angles in radians, in [0, π].
        norm: the feature norm passed as ``norms`` to every row (used only by margins with
            ``requires_norms``). Default: :data:`DEFAULT_NORM`.

    Returns:
        ``float64[T]``.
    """
    if not isinstance(margin, Margin):
        raise TypeError(f"margin must be a marginface Margin, got {type(margin).__name__}")
    tensors = itertools.chain(margin.parameters(), margin.buffers())
    device = next((t.device for t in tensors), torch.device("cpu"))
    angles = torch.as_tensor(theta, dtype=torch.float64).to(device)
    cosine = torch.stack([torch.cos(angles), torch.zeros_like(angles)], dim=1).float()  # (T, 2)
    labels = torch.zeros(angles.shape[0], dtype=torch.long, device=device)  # (T,)
    norms = torch.full((angles.shape[0],), float(norm), device=device)  # (T,)
    was_training = margin.training
    margin.eval()
    try:
        with torch.no_grad():
            values = {  # learnable per-class values (AdaM-Softmax): their initial mean
                name: torch.full_like(angles, (p.init_low + p.init_high) / 2).float()
                for name, p in margin.class_parameters().items()
            }
            used_norms = norms if margin.requires_norms else None
            logits = margin(cosine, labels, used_norms, values or None)  # (T, 2)
            scale = torch.as_tensor(margin.scale_for(norms), dtype=logits.dtype, device=device)
            curve = logits[:, 0] / scale.reshape(-1)  # (T,)
    finally:
        margin.train(was_training)
    return curve.double().cpu().numpy()


def plot_margin_curves(
    margins: Mapping[str, Margin] | None = None,
    *,
    norm: float = DEFAULT_NORM,
    num_points: int = 361,
) -> Figure:
    r"""Target logit / scale against the angle :math:`\theta_y \in [0, π]`, one line per margin.

    Args:
        margins: ``{label: margin}``; None (default) plots :func:`default_margins`.
        norm: feature norm for norm-dependent margins; their legend entries say
            ``‖x‖ = norm``. Default: :data:`DEFAULT_NORM`.
        num_points: angles on the grid. Default: 361 (every half degree).

    Returns:
        The figure: one line per margin, plus a dotted ``cos θ`` reference (labelled
        ``"cos θ (no margin)"``). The y axis stops at :data:`Y_FLOOR`.
    """
    norm = check_real("norm", norm, positive=True)
    count = check_int("num_points", num_points, minimum=2)
    if margins is None:
        margins = default_margins()
    if not isinstance(margins, Mapping) or not margins:
        raise ValueError(f"margins must be a non-empty dict of label -> Margin, got {margins!r}")
    theta = np.linspace(0.0, np.pi, count)
    figure = new_figure(10.0, 5.0)
    ax = figure.add_subplot()
    ax.plot(theta, np.cos(theta), color="0.5", linestyle=":", label="cos θ (no margin)")
    styles = itertools.cycle(["-", "--", "-.", (0, (5, 1, 1, 1, 1, 1))])
    for name, margin in margins.items():
        curve = margin_curve(margin, theta, norm)
        label = f"{name} (‖x‖ = {norm:g})" if margin.requires_norms else str(name)
        ax.plot(theta, curve, linestyle=next(styles), linewidth=1.6, label=label)
    ax.set_xlim(0.0, np.pi)
    lowest = min(float(np.min(line.get_ydata())) for line in ax.lines)
    ax.set_ylim(max(lowest, Y_FLOOR) - 0.05, 1.1)
    ax.set_xticks(np.linspace(0.0, np.pi, 5), ["0", "π/4", "π/2", "3π/4", "π"])
    ax.set_xlabel("angle to the target center θ (radians)")
    ax.set_ylabel("target logit / scale")
    ax.set_title("Target logit curves")
    ax.grid(True, alpha=0.3)
    figure.legend(fontsize="small", loc="outside right upper")
    return figure
