"""Exploration (issue 16): row blocks with the gradients computed in the forward (3 GEMMs)
against the chunked executor (class chunks, 4 GEMMs), for small N and large C.

The row-block step, as fused linear cross-entropy kernels for language models do it: for each
block of ``b`` rows, the whole ``b×C`` logit block (``x̂_b @ Wᵀ · r``, ArcFace's target
``s·cos(θ + m)``), its log-sum-exp, and at once its gradient (mean reduction: the upstream
gradient is a known scalar), which two GEMMs turn into ``∂x̂_b`` and ``∂W += gᵀ x̂_b``. No
recompute: 3 GEMMs instead of 4, at the price of a ``b×C`` workspace (256 MB for b = 64,
C = 1M in float32, vs the chunked executor's 16 MiB) and of a weight gradient rewritten once
per block (so only N <= b, one block, avoids re-reading ``∂W``). It only works for a scalar
upstream gradient (``reduction="mean"``/``"sum"``), and the margin's target gradient has to be
written by hand (here ArcFace's ``f'(c) = cos m + sin m · c/sin θ``).

Both compute the same loss and gradients (checked below against the chunked executor).
Times: medians over ``--repeats`` interleaved rounds in one process.

    PYTHONPATH=src python benchmarks/explore_rowblock.py --batch 64 --classes 1000000
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

import marginface

SCALE, MARGIN = 64.0, 0.5


def rowblock_step(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, block: int):
    """Mean ArcFace loss and ``(∂x, ∂W)`` by row blocks, gradients in the forward."""
    n = x.shape[0]
    norms = x.norm(dim=1, keepdim=True).clamp_min(1e-12)
    x_hat = x / norms  # (N, D)
    inv = weight.norm(dim=1).clamp_min(1e-12).reciprocal()  # (C,)
    grad_w = torch.zeros_like(weight)
    grad_x_hat = torch.empty_like(x_hat)
    total = x.new_zeros(())
    cos_m, sin_m = math.cos(MARGIN), math.sin(MARGIN)
    for lo in range(0, n, block):
        xb, lb = x_hat[lo : lo + block], labels[lo : lo + block].unsqueeze(1)
        logits = torch.mm(xb, weight.t()).mul_(inv)  # (b, C) cosines      GEMM 1
        c = logits.gather(1, lb).clamp(-1.0, 1.0)  # (b, 1)
        sin = (1.0 - c * c).clamp_min(1e-8).sqrt()
        shifted = c * cos_m - sin * sin_m
        beyond = c < -cos_m
        target = torch.where(beyond, c - MARGIN * sin_m, shifted)
        slope = torch.where(beyond, torch.ones_like(c), cos_m + sin_m * c / sin)
        logits.mul_(SCALE).scatter_(1, lb, target * SCALE)
        lse = torch.logsumexp(logits, dim=1, keepdim=True)  # (b, 1)
        total = total + (lse - target * SCALE).sum()
        p = logits.sub_(lse).exp_()  # softmax, in place
        p_target = p.gather(1, lb)
        g = p.mul_(SCALE / n)  # ∂L/∂cos (non-targets)
        g.scatter_(1, lb, (p_target - 1.0) * slope * (SCALE / n))
        g.mul_(inv)  # ∂L/∂(x̂·w)
        grad_x_hat[lo : lo + block] = torch.mm(g, weight)  # GEMM 2
        grad_w.addmm_(g.t(), xb)  # GEMM 3
        del logits, p, g
    coefficient = (weight * grad_w).sum(dim=1) * inv * inv  # through w/‖w‖
    grad_w.sub_(weight * coefficient.unsqueeze(1))
    radial = (x_hat * grad_x_hat).sum(dim=1, keepdim=True)
    grad_x = (grad_x_hat - x_hat * radial) / norms
    return total / n, grad_x, grad_w


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[64])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, C={args.classes}")
    print("| N | block | row-block s | chunked s | row-block / chunked | max rel. diff |")
    print("|---|---|---|---|---|---|")
    for n in args.batch:
        row, chunk, diff = compare(n, args.dim, args.classes, args.repeats)
        print(f"| {n} | {n} | {row:.2f} | {chunk:.2f} | {row / chunk:.2f} | {diff:.1e} |")


def compare(n: int, d: int, c: int, repeats: int) -> tuple[float, float, float]:
    """Median seconds of the row-block step (one block of all N rows) and of the chunked
    executor's step, and the largest relative difference of (loss, ∂x, ∂W)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=generator)
    labels = torch.randint(0, c, (n,), generator=generator)
    head = marginface.ArcFaceLoss(c, d, MARGIN, SCALE, impl="chunked")

    def chunked():
        x_in = x.clone().requires_grad_(True)
        head.weight.grad = None
        loss = head(x_in, labels)
        loss.backward()
        return loss.detach(), x_in.grad, head.weight.grad

    def rowblock():
        with torch.no_grad():
            return rowblock_step(x, head.weight.detach(), labels, block=n)

    reference, candidate = chunked(), rowblock()
    diff = max(
        float((a - b).abs().max() / b.abs().max())
        for a, b in zip(candidate, reference, strict=True)
    )
    times: dict[str, list[float]] = {"row": [], "chunked": []}
    for _ in range(repeats):
        for name, step in (("row", rowblock), ("chunked", chunked)):
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["row"]), statistics.median(times["chunked"]), diff


if __name__ == "__main__":
    main()
