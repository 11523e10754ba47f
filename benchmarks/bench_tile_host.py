"""The host's share of a step on the Triton kernels, per class tile, measured on the CPU.

On an H200 the fused step at C = 1M waits on the host (docs/benchmarks.md, "On an NVIDIA H200
(issue 48, second session)": GPU busy 7.4 ms of a 9.8-11.7 ms step, ~0.3 ms per class tile of
the backward). This script measures that host work without a GPU: the Triton kernels' launches
are replaced by no-ops (their outputs stay uninitialized; ``TRITON_INTERPRET=1`` lets the
executor take the kernels' path on CPU tensors), so a step of ``ArcFaceLoss(impl=
"chunked", kernels="triton")`` on tiny bf16 tensors (N = 64, D = 32) is the Python and PyTorch
dispatch around the kernels. With ``triton_dispatch.GRADIENT_TILE_BYTES`` set to tiles of 256
classes, steps with ``--tiles`` class tiles are timed (median of ``--repeats``) and their
PyTorch operations counted (``TorchDispatchMode``; views left out): the slope between the fewest
and the most tiles is the host cost and the operations of one tile. The step's reads of tensor
values back to the host (``item``, ``tolist``, ``bool(t)``...: on a GPU each is a
synchronization) are counted too; ``--unchecked`` runs the steps with
``marginface.set_value_checks(False)``. A CUDA launch adds its own
microseconds to each operation, which this does not see; on the CPU each float32 product of
bf16 tiles also upcasts its two operands (two copies that ``torch.mm(out_dtype=)`` spares CUDA).

Command (docs/benchmarks.md)::

    PYTHONPATH=src python benchmarks/bench_tile_host.py --tiles 4 16 --repeats 300
    PYTHONPATH=src python benchmarks/bench_tile_host.py --tiles 4 16 --repeats 300 --unchecked
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")

VIEWS = {
    "view", "slice", "detach", "unsqueeze", "squeeze", "t", "transpose", "as_strided", "alias",
    "expand", "_reshape_alias", "select", "permute", "_unsafe_view", "empty", "empty_strided",
    "lift_fresh", "split", "unbind", "new_empty",
}  # fmt: skip


class _NoLaunch:
    """A Triton kernel whose launch does nothing."""

    def __getitem__(self, grid: object):
        return lambda *args, **kwargs: None


class _Count(TorchDispatchMode):
    """Counts the PyTorch operations (not views) dispatched inside."""

    def __init__(self) -> None:
        super().__init__()
        self.operations = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in VIEWS:
            self.operations += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counted_reads():
    """The names of the host's reads of tensor values inside (``torch.Tensor`` methods patched
    for the block)."""
    reads: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name: str):
        def read(self, *args):
            reads.append(name)
            return originals[name](self, *args)

        return read

    for name in READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield reads
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def stub_kernels() -> None:
    """Replace every Triton kernel the softmax's step launches by :class:`_NoLaunch`."""
    from marginface.executors import triton_gradient_tiles, triton_kernels

    triton_kernels._reduce_kernel = _NoLaunch()
    for name in ("_gradient_tile_kernel", "_project_kernel"):
        setattr(triton_gradient_tiles, name, _NoLaunch())


def measure(tiles: int, repeats: int, width: int = 256, n: int = 64, dim: int = 32) -> dict:
    """Median host seconds and PyTorch operations of one step with ``tiles`` class tiles."""
    import marginface
    from marginface.executors import triton_dispatch

    triton_dispatch.GRADIENT_TILE_BYTES = width * (n * 2 + 4 * dim)  # bf16 G and float32 P
    triton_dispatch.TILE_CLASS_MULTIPLE = width
    torch.manual_seed(0)
    classes = tiles * width
    head = marginface.ArcFaceLoss(
        classes, dim, 0.5, 64.0, impl="chunked", kernels="triton", dtype=torch.bfloat16
    )
    x = torch.randn(n, dim).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, classes, (n,))

    def step() -> None:
        head.weight.grad = None
        x.grad = None
        head(x, labels).backward()

    for _ in range(5):
        step()
    counter = _Count()
    with counter, counted_reads() as reads:
        step()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        step()
        times.append(time.perf_counter() - began)
    median_ms = 1000 * statistics.median(times)
    return {"tiles": tiles, "median_ms": median_ms, "ops": counter.operations, "reads": len(reads)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiles", type=int, nargs=2, default=[4, 16])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--unchecked", action="store_true", help="steps with set_value_checks(False)"
    )
    args = parser.parse_args(argv)
    # the executor runs kernels="triton" on CPU tensors only under the interpreter; the
    # kernels themselves are stubbed out below
    os.environ["TRITON_INTERPRET"] = "1"
    torch.set_num_threads(1)
    stub_kernels()
    if args.unchecked:
        import marginface

        marginface.set_value_checks(False)
    rows = [measure(tiles, args.repeats) for tiles in args.tiles]
    low, high = rows
    span = high["tiles"] - low["tiles"]
    result = {
        "value_checks": not args.unchecked,
        "rows": rows,
        "ms_per_tile": (high["median_ms"] - low["median_ms"]) / span,
        "ops_per_tile": (high["ops"] - low["ops"]) / span,
        "ops_besides_tiles": low["ops"] - low["tiles"] * (high["ops"] - low["ops"]) / span,
    }
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
