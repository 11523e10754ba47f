"""1:N search over synthetic 512-D unit templates: queries per second of exact search (FAISS
``IndexFlatIP``, a NumPy matmul with ``argpartition``, marginface's torch fallback) and of the
approximate indexes (HNSW, IVF) with their build time and recall@1/@10 against exact.

    PYTHONPATH=src python benchmarks/bench_search.py --threads 2 --sizes 10000,100000 --queries 500

Templates are Gaussian vectors normalised (the hard case for an index: no cluster structure);
queries are templates plus noise (``--noise``, per coordinate, before normalising), so each has
a true nearest template. Each search runs once after a warm-up on 10 queries. Prints a markdown
table per size and the machine's load.

Sizes up to 100000 draw their templates in float64 at once (as the published 10k/100k rows);
larger sizes draw float32 in blocks of 100000 rows, so 1M x 512 needs 2 GB, not 4 GB plus a
copy (another random stream: the 1M rows are not a superset of the smaller ones).

    PYTHONPATH=src python benchmarks/bench_search.py --threads 2 --sizes 1000000 --queries 300 \
        --approximate ivf
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import machine_lines
from marginface.inference.index import TemplateIndex, exact_search


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


BLOCK = 100_000


def draw_templates(rng: np.random.Generator, size: int, dim: int) -> np.ndarray:
    """``float32[size, dim]`` unit Gaussian templates (see the module docstring)."""
    if size <= BLOCK:
        return unit(rng.normal(size=(size, dim)))
    templates = np.empty((size, dim), np.float32)
    for start in range(0, size, BLOCK):
        block = rng.standard_normal((min(BLOCK, size - start), dim), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        templates[start : start + block.shape[0]] = block
    return templates


def numpy_top(templates: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Top-k by a NumPy matmul and ``argpartition`` (then the k sorted)."""
    scores = queries @ templates.T  # (Q, G)
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1)
    return np.take_along_axis(part, order, axis=1)


def recall(truth: np.ndarray, found: np.ndarray, k: int) -> float:
    return float(
        np.mean([len(set(t[:k]) & set(f[:k])) / k for t, f in zip(truth, found, strict=True)])
    )


def timed(call):
    call_warm = call(10)
    del call_warm
    start = time.perf_counter()
    result = call(None)
    return result, time.perf_counter() - start


def measure_size(
    templates: np.ndarray, queries: np.ndarray, picked: np.ndarray, kinds: list[str]
) -> None:
    """One size's table: exact (FAISS, NumPy, torch) and approximate (HNSW, IVF) search."""
    count = queries.shape[0]

    def row(name: str, build: float, qps: float, r1: float, r10: float) -> None:
        # printed as measured, so that a run stopped by a time limit keeps its rows
        print(f"| {name} | {build:.1f} | {qps:.0f} | {r1:.4f} | {r10:.4f} |", flush=True)

    exact_index = TemplateIndex(templates, kind="exact")
    (_, truth), seconds = timed(lambda n: exact_index.search(queries[:n], 10))
    true_first = float(np.mean(truth[:, 0] == picked))
    print(
        f"\n{templates.shape[0]} templates, {templates.shape[1]}-D, {count} queries "
        f"(exact top-1 is the noisy query's source: {100 * true_first:.1f} %)\n"
    )
    print("| search | build s (incl. recall sample) | queries/s | recall@1 | recall@10 |")
    print("| --- | --- | --- | --- | --- |")
    row("FAISS IndexFlatIP (exact)", 0.0, count / seconds, 1.0, 1.0)
    found, seconds = timed(lambda n: numpy_top(templates, queries[:n], 10))
    row(
        "NumPy matmul + argpartition",
        0.0,
        count / seconds,
        recall(truth, found, 1),
        recall(truth, found, 10),
    )
    (_, found), seconds = timed(lambda n: exact_search(templates, queries[:n], 10))
    row(
        "torch matmul + topk (no FAISS)",
        0.0,
        count / seconds,
        recall(truth, found, 1),
        recall(truth, found, 10),
    )
    for kind in kinds:
        start = time.perf_counter()
        index = TemplateIndex(templates, kind=kind, sample=200)
        build = time.perf_counter() - start
        (_, found), seconds = timed(lambda n, index=index: index.search(queries[:n], 10))
        row(
            f"{kind} (approximate)",
            build,
            count / seconds,
            recall(truth, found, 1),
            recall(truth, found, 10),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--noise", type=float, default=0.05)
    parser.add_argument("--approximate", default="hnsw,ivf", help="approximate kinds measured")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import faiss

    faiss.omp_set_num_threads(args.threads)
    load_before = os.getloadavg()
    rng = np.random.default_rng(0)
    for size in (int(s) for s in args.sizes.split(",")):
        start = time.perf_counter()
        templates = draw_templates(rng, size, args.dim)
        print(f"drew {size} templates in {time.perf_counter() - start:.1f} s", flush=True)
        picked = rng.choice(size, args.queries, replace=False)
        queries = unit(templates[picked] + args.noise * rng.normal(size=(args.queries, args.dim)))
        measure_size(templates, queries, picked, [k for k in args.approximate.split(",") if k])
    command = "PYTHONPATH=src python benchmarks/bench_search.py " + " ".join(sys.argv[1:])
    for line in machine_lines(load_before, os.getloadavg(), command):
        print(line)


if __name__ == "__main__":
    main()
