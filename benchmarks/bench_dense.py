"""Dense ArcFace/CosFace/CurricularFace heads vs plain PyTorch implementations of the same formulas.

Times forward + backward of the loss head (embeddings -> scalar loss, gradients for the
embeddings and the class centers) and reports the median over repeats and the ratio of our
dense path to the plain implementation measured in the same run.

    python benchmarks/bench_dense.py --batch 512 --dim 512 --classes 10000 100000
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import marginface


def plain_arcface(x, w, labels, s=64.0, m=0.5):
    """The usual copy-pasted head (seed 003 / insightface style), margin on the whole matrix."""
    cos = F.linear(F.normalize(x), F.normalize(w)).clamp(-1, 1)
    sin = torch.sqrt(1.0 - cos * cos)
    phi = cos * math.cos(m) - sin * math.sin(m)
    phi = torch.where(cos > math.cos(math.pi - m), phi, cos - math.sin(math.pi - m) * m)
    one_hot = F.one_hot(labels, cos.shape[1]).to(cos.dtype)
    logits = s * (one_hot * phi + (1.0 - one_hot) * cos)
    return F.cross_entropy(logits, labels)


def plain_cosface(x, w, labels, s=64.0, m=0.35):
    cos = F.linear(F.normalize(x), F.normalize(w))
    one_hot = F.one_hot(labels, cos.shape[1]).to(cos.dtype)
    return F.cross_entropy(s * (cos - m * one_hot), labels)


def plain_curricular(x, w, labels, t, s=64.0, m=0.5):
    """The authors' CurricularFace forward (index assignment on a clone)."""
    cos = F.linear(F.normalize(x), F.normalize(w)).clamp(-1, 1)
    rows = torch.arange(cos.shape[0])
    target = cos[rows, labels].view(-1, 1)
    sin = torch.sqrt(1.0 - target * target)
    cos_m = target * math.cos(m) - sin * math.sin(m)
    mask = cos > cos_m
    final = torch.where(target > math.cos(math.pi - m), cos_m, target - math.sin(math.pi - m) * m)
    with torch.no_grad():
        t = target.mean() * 0.01 + 0.99 * t
    out = cos.clone()
    hard = out[mask]
    out[mask] = hard * (t + hard)
    out = out.scatter(1, labels.view(-1, 1), final)
    return F.cross_entropy(s * out, labels)


def time_pair(first, second, repeats: int) -> tuple[float, float]:
    """Median seconds of two callables, run alternately so both see the same machine noise."""
    first(), second()  # warm-up
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((first, samples[0]), (second, samples[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(samples[0]), statistics.median(samples[1])


def forward_backward(loss_fn, x: torch.Tensor, params: list[torch.Tensor]):
    """A closure running one forward + backward of ``loss_fn()`` with fresh gradients."""

    def run() -> None:
        for p in (x, *params):
            p.grad = None
        loss_fn().backward()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads"
    )
    print("| C | loss | plain (s) | marginface dense (s) | ratio dense/plain |")
    print("|---:|---|---:|---:|---:|")
    for num_classes in args.classes:
        x = torch.randn(args.batch, args.dim, requires_grad=True)
        labels = torch.randint(0, num_classes, (args.batch,))
        heads = {
            "arcface": (marginface.ArcFaceLoss(num_classes, args.dim), plain_arcface),
            "cosface": (marginface.CosFaceLoss(num_classes, args.dim), plain_cosface),
            "curricularface": (
                marginface.CurricularFaceLoss(num_classes, args.dim),
                lambda x_, w_, y_: plain_curricular(x_, w_, y_, torch.zeros(())),
            ),
        }
        for name, (head, plain) in heads.items():
            w = head.weight
            ours = forward_backward(lambda h=head, x=x, y=labels: h(x, y), x, [w])
            reference = forward_backward(lambda p=plain, w=w, x=x, y=labels: p(x, w, y), x, [w])
            t_plain, t_ours = time_pair(reference, ours, args.repeats)
            print(
                f"| {num_classes} | {name} | {t_plain:.4f} | {t_ours:.4f} | "
                f"{t_ours / t_plain:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
