"""Cost of inter-class filtering (``interclass_filtering_threshold``): forward + backward time of
ArcFace with the filter off and on, on the dense and the chunked executor.

With the filter on, the chunked executor cannot fold the scale into its GEMM (it runs the
non-target transform on each chunk, forward and backward) and the Triton kernels are not used;
the dense executor adds one ``N×C`` comparison and ``masked_fill``. Times are medians over
``--repeats`` rounds; within a round the four variants run one after another (interleaved), so a
slow spell of a shared machine hits all of them alike. Ratios are filter-on over filter-off for
the same executor, measured in the same run.

Example (the command recorded in docs/benchmarks.md)::

    PYTHONPATH=src python benchmarks/bench_interclass_filtering.py --classes 20000 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import marginface


def _step(loss_fn: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor) -> float:
    loss_fn.weight.grad = None
    x.grad = None
    began = time.perf_counter()
    loss_fn(x, labels).backward()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--classes", type=int, default=20000)
    parser.add_argument("--threshold", type=float, default=0.2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, args.dim, generator=generator).requires_grad_(True)
    labels = torch.randint(0, args.classes, (args.batch,), generator=generator)
    variants = {}
    for impl in ("dense", "chunked"):
        for threshold in (0.0, args.threshold):
            torch.manual_seed(1)
            variants[(impl, threshold)] = marginface.ArcFaceLoss(
                args.classes, args.dim, impl=impl, interclass_filtering_threshold=threshold
            )
    with torch.no_grad():
        cosine = variants[("dense", 0.0)].cosine(x)
        filtered = float((cosine > args.threshold).float().mean())
    times: dict = {key: [] for key in variants}
    for loss_fn in variants.values():  # warm-up
        _step(loss_fn, x, labels)
    for _ in range(args.repeats):
        for key, loss_fn in variants.items():
            times[key].append(_step(loss_fn, x, labels))
    print(
        f"N = {args.batch}, D = {args.dim}, C = {args.classes}, threshold = {args.threshold} "
        f"({100 * filtered:.2f}% of the cosines above it), threads = {args.threads}, "
        f"median of {args.repeats}"
    )
    for impl in ("dense", "chunked"):
        off = statistics.median(times[(impl, 0.0)])
        on = statistics.median(times[(impl, args.threshold)])
        print(
            f"{impl:8s} off {1000 * off:8.1f} ms   on {1000 * on:8.1f} ms   on/off {on / off:.2f}"
        )


if __name__ == "__main__":
    main()
