"""Tile candidates of the chunked executor's Triton kernels: what each compiles to, and (on a
GPU) how fast each runs (issue 12, "tune the kernels").

Two modes:

* ``--compile-only`` (no GPU needed): every candidate of every kernel is compiled for ``sm_90``
  (the H100/H200) by Triton's own compiler (:mod:`marginface.executors.triton_aot`): registers,
  spilled bytes, shared memory, whether the products are ``wgmma``. Candidates that spill or
  exceed the shared memory are marked; a GPU run times only the others.
* default (CUDA): each kernel's launcher (:func:`~marginface.executors.triton_kernels.
  nontarget_statistics`, ``embedding_gradient``, ``weight_gradient`` over all chunks, and
  :func:`~marginface.executors.triton_gradient_tiles.gradient_tile` over the class tiles of
  ``triton_dispatch.GRADIENT_TILE_BYTES``, as the executor calls them) with each candidate's
  ``Blocks`` on N×D embeddings and C×D centers at the executor's default chunk size; median
  milliseconds by ``triton.testing.do_bench``; each candidate's output compared with the
  default tiles' (a candidate that changes the numbers beyond rounding is reported, not
  ranked). Prints the table, the best candidate per kernel and its speed-up over the default,
  and the 4-GEMM floor of the shape (``torch.matmul``) in the same run.

Commands (docs/benchmarks.md, docs/gpu.md)::

    python benchmarks/tune_triton.py --compile-only --json /tmp/resources.json
    PYTHONPATH=src python3 benchmarks/tune_triton.py --classes 1000000 --dtype bfloat16 \\
        --json $OUT/tune.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
import warnings

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KERNELS = ("statistics", "embedding_gradient", "weight_gradient", "gradient_tile")
SHARED_LIMIT = 227 * 1024  # bytes of shared memory one block may use on sm_90

TILES_N = (64, 128)
TILES_C = (64, 128, 256)
TILES_D = (32, 64)
WARPS = (4, 8)
STAGES = (2, 3, 4)


def candidates(kernel: str) -> list[dict]:
    """The tile/launch grid tried for ``kernel`` (the same for each; the default first)."""
    default = {"n": 64, "c": 64, "d": 32, "warps": 4, "stages": 3}
    grid = [
        dict(zip(("n", "c", "d", "warps", "stages"), values, strict=True))
        for values in itertools.product(TILES_N, TILES_C, TILES_D, WARPS, STAGES)
    ]
    return [default] + [g for g in grid if g != default]


def compile_only(kernels: list[str], dtypes: list[str], dim: int, arch: int) -> list[dict]:
    """Compile every candidate; a row per (kernel, dtype, candidate)."""
    from marginface.executors.triton_aot import compile_kernel
    from marginface.executors.triton_kernels import Blocks

    rows = []
    for kernel, name in itertools.product(kernels, dtypes):
        for tiles in candidates(kernel):
            started = time.perf_counter()
            row = {"kernel": kernel, "dtype": name, **tiles}
            try:
                result = compile_kernel(
                    kernel, DTYPES[name], blocks=Blocks(**tiles), dim=dim, arch=arch
                )
            except Exception as error:  # a candidate that does not compile
                row.update(error=f"{type(error).__name__}: {str(error).splitlines()[0][:120]}")
            else:
                row.update(
                    registers=result.registers,
                    spilled=result.spilled_bytes,
                    shared=result.shared_bytes,
                    wgmma=result.wgmma,
                    viable=result.spilled_bytes == 0 and result.shared_bytes <= SHARED_LIMIT,
                )
            row["compile_s"] = round(time.perf_counter() - started, 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def summarize_resources(rows: list[dict]) -> None:
    """A markdown table of a ``--compile-only`` run: per kernel and dtype, how many candidates
    compiled, spilled, exceeded the shared memory, and their registers and shared memory."""
    print(
        "| kernel | dtype | candidates | compiled | spill | over shared | registers | "
        "shared KiB | wgmma | default (64×64×32, 4 warps, 3 stages) |"
    )
    print("|---|---|---:|---:|---:|---:|---|---|---:|---|")
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["kernel"], row["dtype"]), []).append(row)
    for (kernel, dtype), group in groups.items():
        built = [r for r in group if "registers" in r]
        if not built:
            print(f"| {kernel} | {dtype} | {len(group)} | 0 | | | | | | |")
            continue
        registers = [r["registers"] for r in built]
        shared = [r["shared"] // 1024 for r in built]
        default = next(
            (
                r
                for r in built
                if (r["n"], r["c"], r["d"], r["warps"], r["stages"]) == (64, 64, 32, 4, 3)
            ),
            None,
        )
        described = (
            f"{default['registers']} reg, {default['shared'] // 1024} KiB" if default else "-"
        )
        print(
            f"| {kernel} | {dtype} | {len(group)} | {len(built)} "
            f"| {sum(1 for r in built if r['spilled'])} "
            f"| {sum(1 for r in built if r['shared'] > SHARED_LIMIT)} "
            f"| {min(registers)}-{max(registers)} | {min(shared)}-{max(shared)} "
            f"| {sum(1 for r in built if r['wgmma'])} | {described} |"
        )


def read_rows(path: str) -> list[dict]:
    """Rows from a ``--json`` file, or from a run's printed JSON lines."""
    with open(path) as handle:
        text = handle.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _problem(n: int, dim: int, classes: int, dtype: torch.dtype, device: torch.device):
    """Seeded inputs of the kernels, as the chunked executor prepares them (ArcFace: the
    identity rule; per-row scale 64; a log-sum-exp and upstream gradient of the right size)."""
    from marginface.executors.chunked import DEFAULT_CHUNK_BYTES
    from marginface.executors.triton_kernels import NonTargetRule

    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, dim, generator=generator, device=device)
    x_hat = torch.nn.functional.normalize(x, dim=1).to(dtype)
    weight = torch.randn(classes, dim, generator=generator, device=device).to(dtype)
    inv_norms = 1.0 / weight.float().norm(dim=1)
    labels = torch.randint(0, classes, (n,), generator=generator, device=device)
    scale = torch.full((n,), 64.0, device=device)
    # logits of a trained-looking head are around s·0.1: a lse of that order keeps p finite
    lse = torch.full((n,), 64.0 * 0.5 + math.log(classes), device=device)
    grad = torch.full((n,), 1.0 / n, device=device)
    bytes_per_logit = 4 if dtype == torch.float32 else 6
    chunk = max(1024, DEFAULT_CHUNK_BYTES // (n * bytes_per_logit))
    return x_hat, weight, inv_norms, labels, scale, NonTargetRule(), lse, grad, chunk


def _launch(kernel: str, problem, blocks) -> torch.Tensor:
    """One call of ``kernel``'s launcher over all classes; returns its main output."""
    from marginface.executors import triton_kernels as tk

    x_hat, weight, inv_norms, labels, scale, rule, lse, grad, chunk = problem
    if kernel == "statistics":
        row_max, exp_sum = tk.nontarget_statistics(
            x_hat, weight, inv_norms, labels, scale, rule, sub_centers=1, chunk_size=chunk,
            blocks=blocks,
        )  # fmt: skip
        return row_max + torch.log(exp_sum)
    if kernel == "embedding_gradient":
        return tk.embedding_gradient(
            x_hat, weight, inv_norms, labels, scale, rule, lse, grad, sub_centers=1,
            chunk_size=chunk, blocks=blocks,
        )[0]  # fmt: skip
    classes = weight.shape[0]
    if kernel == "gradient_tile":
        from marginface.executors.triton_dispatch import GRADIENT_TILE_BYTES
        from marginface.executors.triton_gradient_tiles import gradient_tile

        n, dim = x_hat.shape
        width = max(64, GRADIENT_TILE_BYTES // (n * x_hat.element_size() + 4 * dim) // 64 * 64)
        tile = torch.empty(n, min(width, classes), dtype=x_hat.dtype, device=x_hat.device)
        checksum = torch.zeros((), dtype=torch.float64, device=weight.device)
        for start in range(0, classes, width):
            stop = min(start + width, classes)
            part, _ = gradient_tile(
                x_hat, weight[start:stop], inv_norms[start:stop], labels - start, scale, rule,
                lse, grad, sub_centers=1, out=tile[:, : stop - start], blocks=blocks,
            )  # fmt: skip
            checksum += part.double().abs().sum()
        return checksum.reshape(1)
    out = torch.empty(chunk, weight.shape[1], dtype=torch.float32, device=weight.device)
    checksum = torch.zeros((), dtype=torch.float64, device=weight.device)
    for start in range(0, classes, chunk):
        stop = min(start + chunk, classes)
        part = tk.weight_gradient(
            x_hat, weight, inv_norms, labels, scale, rule, lse, grad, sub_centers=1,
            start=start, stop=stop, out=out[: stop - start], blocks=blocks,
        )  # fmt: skip
        checksum += part.double().abs().sum()
    return checksum.reshape(1)


def _floor_ms(n: int, dim: int, classes: int, dtype: torch.dtype, device) -> float:
    """The 4 GEMMs of the loss at this shape (logits twice, ∂x, ∂W), milliseconds."""
    import triton.testing

    x = torch.randn(n, dim, device=device, dtype=dtype)
    w = torch.randn(classes, dim, device=device, dtype=dtype)
    g = torch.randn(n, classes, device=device, dtype=dtype)

    def gemms() -> None:
        torch.matmul(x, w.t())
        torch.matmul(x, w.t())
        torch.matmul(g, w)
        torch.matmul(g.t(), x)

    return float(triton.testing.do_bench(gemms, return_mode="median"))


def time_candidates(
    kernels: list[str],
    n: int,
    dim: int,
    classes: int,
    dtype_name: str,
    limit: int | None,
    viable: set[tuple] | None = None,
) -> list[dict]:
    """Median ms of every candidate of every kernel on CUDA (see the module docstring);
    ``viable``: if given, only the ``(kernel, dtype, n, c, d, warps, stages)`` in it (and the
    default, the reference of the comparison)."""
    import triton.testing

    from marginface.executors.triton_kernels import Blocks

    device = torch.device("cuda")
    dtype = DTYPES[dtype_name]
    problem = _problem(n, dim, classes, dtype, device)
    floor = _floor_ms(n, dim, classes, dtype, device)
    print(f"# 4-GEMM floor at N={n} D={dim} C={classes} {dtype_name}: {floor:.3f} ms")
    rows = [{"kernel": "gemm4_floor", "dtype": dtype_name, "C": classes, "ms": floor}]
    for kernel in kernels:
        reference = None
        chosen = [
            tiles
            for index, tiles in enumerate(candidates(kernel))
            if index == 0 or viable is None or _key(kernel, dtype_name, tiles) in viable
        ]
        for tiles in chosen[:limit]:
            blocks = Blocks(**tiles)
            row = {"kernel": kernel, "dtype": dtype_name, "C": classes, **tiles}
            try:
                output = _launch(kernel, problem, blocks)  # compiles
                torch.cuda.synchronize()
                if reference is None:
                    reference = output
                error = float((output - reference).abs().max() / reference.abs().max())
                row["difference"] = error
                row["ms"] = float(
                    triton.testing.do_bench(
                        lambda kernel=kernel, blocks=blocks: _launch(kernel, problem, blocks),
                        return_mode="median",
                    )
                )
            except Exception as failure:  # a candidate that fails to run
                row["error"] = f"{type(failure).__name__}: {str(failure).splitlines()[0][:120]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _key(kernel: str, dtype_name: str, tiles: dict) -> tuple:
    return (kernel, dtype_name, *(tiles[key] for key in ("n", "c", "d", "warps", "stages")))


def read_viable(path: str) -> set[tuple]:
    """The candidates a ``--compile-only`` run's JSON marks viable."""
    with open(path) as handle:
        rows = json.load(handle)
    return {_key(r["kernel"], r["dtype"], r) for r in rows if r.get("viable")}


def summarize(rows: list[dict]) -> None:
    """The best candidate of each kernel against its default (the first row of each)."""
    tolerance = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 1e-2}
    for kernel in KERNELS:
        timed = [r for r in rows if r["kernel"] == kernel and "ms" in r]
        if not timed:
            continue
        default = timed[0]
        ok = [r for r in timed if r["difference"] <= tolerance[r["dtype"]]]
        best = min(ok, key=lambda r: r["ms"])
        tiles = {key: best[key] for key in ("n", "c", "d", "warps", "stages")}
        print(
            f"{kernel}: default {default['ms']:.3f} ms, best {best['ms']:.3f} ms "
            f"({default['ms'] / best['ms']:.2f}x) with {tiles}; "
            f"{len(timed) - len(ok)} candidates off the default's numbers"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compile-only", action="store_true", help="no GPU: compile for sm_90")
    parser.add_argument("--arch", type=int, default=90, help="with --compile-only: sm_ARCH")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, default=1_000_000)
    parser.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=list(DTYPES))
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--limit", type=int, default=None, help="first LIMIT candidates only")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    parser.add_argument(
        "--only-viable", default=None, metavar="JSON", help="a --compile-only run's rows"
    )
    parser.add_argument(
        "--summarize", default=None, metavar="FILE", help="table of a --compile-only run's rows"
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
    if args.summarize:
        summarize_resources(read_rows(args.summarize))
        return
    if args.compile_only:
        if os.environ.get("TRITON_INTERPRET") == "1":
            sys.exit("--compile-only needs the compiler: unset TRITON_INTERPRET")
        rows = compile_only(args.kernels, args.dtype, args.dim, args.arch)
        viable = sum(1 for r in rows if r.get("viable"))
        print(f"# {viable} of {len(rows)} candidates compile without spills within shared memory")
        summarize_resources(rows)
    else:
        if not torch.cuda.is_available():
            sys.exit("timing needs CUDA; on a machine without a GPU use --compile-only")
        print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
        viable = read_viable(args.only_viable) if args.only_viable else None
        rows = []
        for name in args.dtype:
            rows += time_candidates(
                args.kernels, args.batch, args.dim, args.classes, name, args.limit, viable
            )
        summarize(rows)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()
