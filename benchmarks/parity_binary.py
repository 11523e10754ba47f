"""Largest differences between marginface's one-vs-all losses and the authors' code (SphereFace2
C/A/M from OpenSphere, UniFace's ``Unified_Cross_Entropy_Loss``), restated in
``tests/_opensphere_reference.py``: loss, ∂x, ∂W, ∂b in float64 over 3 SGD steps and 3 seeds,
dense and chunked (3 class chunks). The figures of docs/parity.md's binary rows.

    PYTHONPATH=src:. python benchmarks/parity_binary.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tests._opensphere_reference import sphereface2_loss, uniface_loss

import marginface

N, C, D = 10, 12, 8
LR = 0.5

ROWS = [
    ("sphereface2", "C", {}, "SphereFace2Loss(C, D)"),
    ("sphereface2-a", "A", {}, "SphereFace2ALoss(C, D)"),
    ("sphereface2-m", "M", {}, "SphereFace2MLoss(C, D)"),
    ("uniface", None, {"clamp_logits": True}, "UniFaceLoss(C, D, clamp_logits=True)"),
    # where the options differ from the code on purpose (the exact gradient; no clamp):
    ("sphereface2-a", "A", {"gradient": "exact"}, 'SphereFace2ALoss(C, D, gradient="exact")'),
    ("sphereface2-m", "M", {"gradient": "exact"}, 'SphereFace2MLoss(C, D, gradient="exact")'),
    ("uniface", None, {}, "UniFaceLoss(C, D)"),
]  # fmt: skip


def _batch(generator: torch.Generator, weight: torch.Tensor):
    labels = torch.randint(0, C, (N,), generator=generator)
    x = torch.randn(N, D, generator=generator, dtype=torch.float64)
    centers = F.normalize(weight[labels], dim=1)
    away = torch.arange(N) % 3 == 0
    x[away] = -centers[away] + 0.15 * x[away] / x[away].norm(dim=1, keepdim=True)
    x[1] = centers[1] + 0.01 * F.normalize(x[1], dim=0)
    norms = torch.linspace(2.0, 140.0, N, dtype=torch.float64).unsqueeze(1)
    return F.normalize(x, dim=1) * norms, labels


def measure(name: str, variant: str | None, options: dict, impl: str) -> list[float]:
    worst = [0.0, 0.0, 0.0, 0.0]
    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        loss_fn = marginface.create_loss(
            name, C, D, dtype=torch.float64, impl=impl, chunk_size=4, **options
        )
        weight = torch.randn(C, D, generator=generator, dtype=torch.float64)
        if variant is not None:
            weight = F.normalize(weight, dim=1)
        bias = loss_fn.margin.bias.detach().clone()
        for _ in range(3):
            with torch.no_grad():
                loss_fn.weight.copy_(weight)
                loss_fn.margin.bias.copy_(bias)
            x, labels = _batch(generator, weight)
            xo = x.clone().requires_grad_(True)
            value = loss_fn(xo, labels)
            ours = torch.autograd.grad(value, [xo, loss_fn.weight, loss_fn.margin.bias])
            xr, wr, br = (t.clone().requires_grad_(True) for t in (x, weight, bias))
            m = loss_fn.margin
            if variant is None:
                ref = uniface_loss(xr, wr, labels, br, m=m.margin, s=m.scale, l=m.negative_weight)
            else:
                ref = sphereface2_loss(
                    xr, wr, labels, br, variant=variant, alpha=m.balance, r=m.scale,
                    m=m.margin, t=m.power, lw=m.loss_weight,
                )  # fmt: skip
            rx, rw, rb = torch.autograd.grad(ref, [xr, wr, br])
            if variant is not None:  # unit centers, normalized outside the graph
                rw_cmp = rw - weight * (rw * weight).sum(dim=1, keepdim=True)
            else:
                rw_cmp = rw
            pairs = [(value, ref), (ours[0], rx), (ours[1], rw_cmp), (ours[2], rb)]
            for i, (a, b) in enumerate(pairs):
                worst[i] = max(worst[i], float((a.detach() - b.detach()).abs().max()))
            with torch.no_grad():
                weight = weight - LR * rw
                if variant is not None:
                    weight = F.normalize(weight, dim=1)
                bias = bias - LR * rb
    return worst


def main() -> None:
    print("| call | dense: loss / ∂x / ∂W / ∂b | chunked: loss / ∂x / ∂W / ∂b |")
    print("|---|---|---|")
    for name, variant, options, call in ROWS:
        cells = []
        for impl in ("dense", "chunked"):
            cells.append(" / ".join(f"{v:.1e}" for v in measure(name, variant, options, impl)))
        print(f"| `{call}` | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
