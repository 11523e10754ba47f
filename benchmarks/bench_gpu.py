"""The fused margin loss against its floor and its peers on a CUDA GPU (issue 12, "race").

Methods, on the same inputs (``x[N, D]``, ``W[C, D]`` in ``--dtype``, labels; ArcFace s = 64,
m = 0.5; forward + backward, gradients set to None before each step as ``zero_grad()`` does):

* ``gemm4``: the four bare GEMMs a loss that never stores ``N×C`` needs (logits, the backward's
  recompute, ``∂x``, ``∂W``; ``torch.matmul``): the floor. It holds its own ``N×C`` products.
* ``dense``: marginface ``ArcFaceLoss(impl="dense")``.
* ``fused``: ``impl="chunked"`` with the Triton kernels (``kernels="triton"``): the forward's
  statistics kernel, the backward as gradient tiles and GEMMs (the default ``TRITON_BACKWARD``,
  ``"tiles"``).
* ``fused_unchecked``: ``fused`` with the value checks off (``marginface.set_value_checks(
  False)``): no read back to the host in the step (the peers check no values either), so the
  host can queue a step while the GPU runs the previous one.
* ``fused_kernels``: the same with the backward on the fused ``∂x̂``/``∂W`` kernels
  (``TRITON_BACKWARD = "fused"``).
* ``fused_torch``: ``impl="chunked"`` with PyTorch per chunk (``kernels="torch"``: cuBLAS does
  the GEMMs, the margin and the log-sum-exp are elementwise kernels): the "split" alternative.
* ``fused_compiled``: ``torch.compile`` of the ``fused`` loss.
* ``plain`` / ``plain_compiled``: ArcFace as users write it in plain PyTorch (insightface's
  formulation, ``benchmarks/bench_compile.py``), eager and under ``torch.compile``.
* ``pml``: pytorch-metric-learning's ``ArcFaceLoss`` (if importable).
* ``liger``: Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss`` and ``cce``: Apple's Cut
  Cross-Entropy ``linear_cross_entropy`` (default ``filter_eps``), both on
  ``(s·x/‖x‖, W/‖W‖)``: a margin-free fused linear cross-entropy, the speed a fused loss of
  this shape reaches without a margin (if importable).

Times: CUDA events around each step, methods interleaved round by round, median over
``--repeats`` rounds after ``--warmup`` rounds (compilation happens there). Memory:
``torch.cuda.max_memory_allocated`` over one step after a warm-up step, minus what was
allocated before the step plus the gradients a training loop holds anyway (``W.grad``,
``x.grad``): the step's workspace beyond inputs, weights and gradients. For ``gemm4`` the
baseline holds only the inputs, so its figure includes its ``N×C`` products.

``--tuned JSON`` sets the kernels' tiles (:data:`~marginface.executors.kernel_options.
TUNED_BLOCKS`, ``{"statistics": "128x256x32x8x3", ...}``) before anything runs: the tiles a
probe in the same session found fastest (``probe_gpu_chunks.py --best``).

``--train-steps K`` instead runs K optimizer steps (SGD, momentum 0.9) of the ``fused`` head
alone at each C and reports the peak beyond weights, gradients and optimizer state: the
C = 10M check (10M×512 bf16 weights are 10 GB; gradient and momentum as much again each).

``--smoke`` runs the same logic on tiny shapes, on the CPU where there is no CUDA (the
Triton-only methods left out with one line each): ``make test`` dry-runs the GPU kit this way
(tests/test_gpu_kit.py). Results are rewritten to ``--json`` after each C, so a run stopped by
its time limit keeps what it finished; ``--deadline-s`` starts no C past that many seconds.

Commands (docs/benchmarks.md, docs/gpu.md)::

    PYTHONPATH=src python3 benchmarks/bench_gpu.py --classes 100000 1000000 --json $OUT/race.json
    PYTHONPATH=src python3 benchmarks/bench_gpu.py --classes 10000000 --train-steps 3
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

import marginface
from bench_compile import MARGIN, SCALE, plain_arcface
from marginface.executors.chunked import KERNELS_ENV

METHODS = (
    "gemm4",
    "dense",
    "fused",
    "fused_unchecked",
    "fused_kernels",
    "fused_torch",
    "fused_compiled",
    "plain",
    "plain_compiled",
    "pml",
    "liger",
    "cce",
)
OPTIONAL = {
    "pml": "pytorch_metric_learning",
    "liger": "liger_kernel",
    "cce": "cut_cross_entropy",
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MB = 2**20
DEVICE = "cuda"  # a smoke test of the script's logic may point it elsewhere


@contextlib.contextmanager
def kernels_from_environment(kernels: str) -> Iterator[None]:
    """The chunked executor's kernels for the calls inside (``MARGINFACE_KERNELS``, read at
    each call, also inside compiled code: the executor's custom op resolves it when it runs)."""
    previous = os.environ.get(KERNELS_ENV)
    os.environ[KERNELS_ENV] = kernels
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(KERNELS_ENV, None)
        else:
            os.environ[KERNELS_ENV] = previous


SETTINGS = {
    "backward": ("executors.triton_dispatch", "TRITON_BACKWARD"),
    "wg_bytes": ("executors.triton_dispatch", "WEIGHT_GRADIENT_WORKSPACE_BYTES"),
    "tile_bytes": ("executors.triton_dispatch", "GRADIENT_TILE_BYTES"),
    "tuned": ("executors.kernel_options", "TUNED_BLOCKS"),
    "value_checks": ("_validation", "_value_checks"),
}
"""The module settings a step can run with: each key's ``marginface.<module>.<name>`` (the
executor's Triton backward, workspace bounds and tuned tiles; the value checks of
``marginface.set_value_checks``)."""


@contextlib.contextmanager
def settings_applied(settings: dict[str, Any]) -> Iterator[None]:
    """The module settings (:data:`SETTINGS`) for the calls inside, restored after."""
    saved = []
    for key, value in settings.items():
        module_name, name = SETTINGS[key]
        module = importlib.import_module(f"marginface.{module_name}")
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


def blocks_of(spec: str) -> Any:
    """``"128x128x64x8x3"`` -> ``Blocks(n=128, c=128, d=64, warps=8, stages=3)``."""
    from marginface.executors.kernel_options import Blocks

    n, c, d, warps, stages = (int(part) for part in spec.split("x"))
    return Blocks(n=n, c=c, d=d, warps=warps, stages=stages)


def set_tuned_blocks(path: str) -> dict[str, str]:
    """Set :data:`~marginface.executors.kernel_options.TUNED_BLOCKS` from a JSON file of
    ``{kernel: "NxCxDxWARPSxSTAGES"}``; returns what it set."""
    from marginface.executors import kernel_options

    with open(path) as handle:
        tuned = json.load(handle)
    for kernel, spec in tuned.items():
        kernel_options.TUNED_BLOCKS[kernel] = blocks_of(spec)
    return tuned


class Step:
    """One forward + backward of a method and the tensors whose gradients it leaves (held by a
    training loop anyway: the memory baseline counts them)."""

    def __init__(self, run: Callable[[], None], holds: list[torch.Tensor]) -> None:
        self.run = run
        self.holds = holds

    def __call__(self) -> None:
        for tensor in self.holds:
            tensor.grad = None
        self.run()


def make_step(method: str, n: int, d: int, c: int, dtype: torch.dtype) -> Step:
    """Seeded inputs on CUDA and the method's step."""
    device = torch.device(DEVICE)
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, d, generator=generator, device=device).to(dtype).requires_grad_(True)
    labels = torch.randint(0, c, (n,), generator=generator, device=device)

    def weight() -> torch.Tensor:
        w = torch.randn(c, d, generator=generator, device=device) * 0.01
        return w.to(dtype).requires_grad_(True)

    if method == "gemm4":
        w, xd = weight().detach(), x.detach()

        def gemms() -> None:
            logits = xd @ w.t()  # (N, C)
            logits = xd @ w.t()  # the backward's recompute
            _ = logits @ w  # ∂x
            _ = logits.t() @ xd  # ∂W

        return Step(gemms, [])
    if method == "dense" or method.startswith("fused"):
        impl = "dense" if method == "dense" else "chunked"
        head = marginface.ArcFaceLoss(c, d, MARGIN, SCALE, impl=impl, dtype=dtype, device=device)
        call = torch.compile(head) if method == "fused_compiled" else head
        kernels = "torch" if method == "fused_torch" else "triton"
        settings = {
            "backward": "fused" if method == "fused_kernels" else "tiles",
            "value_checks": method != "fused_unchecked",
        }

        def head_step() -> None:
            with kernels_from_environment(kernels), settings_applied(settings):
                call(x, labels).backward()

        return Step(head_step, [head.weight, x])
    if method in ("plain", "plain_compiled"):
        w = weight()
        function = torch.compile(plain_arcface) if method == "plain_compiled" else plain_arcface
        return Step(lambda: function(x, w, labels).backward(), [w, x])
    if method == "pml":
        from pytorch_metric_learning.losses import ArcFaceLoss

        pml = ArcFaceLoss(c, d, margin=math.degrees(MARGIN), scale=SCALE).to(device, dtype)
        return Step(lambda: pml(x, labels).backward(), [pml.W, x])
    if method in ("liger", "cce"):
        w = weight()
        if method == "liger":
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

            liger = LigerFusedLinearCrossEntropyLoss()

            def loss() -> torch.Tensor:
                return liger(F.normalize(w, dim=1), F.normalize(x, dim=1) * SCALE, labels)
        else:
            from cut_cross_entropy import linear_cross_entropy

            def loss() -> torch.Tensor:
                return linear_cross_entropy(
                    F.normalize(x, dim=1) * SCALE, F.normalize(w, dim=1), labels
                )

        return Step(lambda: loss().backward(), [w, x])
    raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")


def _synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def step_memory(step: Step) -> float:
    """Peak bytes of one step beyond inputs, weights and the gradients it leaves, MB (NaN off
    CUDA: the figure is CUDA's allocator's)."""
    step()  # warm-up (and the gradients' first allocation)
    if DEVICE != "cuda":
        return math.nan
    held = sum(t.numel() * t.element_size() for t in step.holds)
    for tensor in step.holds:
        tensor.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step.run()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before - held) / MB


def timed_ms(step: Callable[[], None]) -> float:
    """One call of ``step`` in milliseconds: CUDA events on CUDA, the wall clock elsewhere."""
    if DEVICE != "cuda":
        began = time.perf_counter()
        step()
        return 1000.0 * (time.perf_counter() - began)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop)


def race(
    methods: list[str], n: int, d: int, c: int, dtype: torch.dtype, repeats: int, warmup: int
) -> dict[str, dict]:
    """Median ms per step (interleaved rounds) and workspace MB of each method."""
    results: dict[str, dict] = {}
    steps: dict[str, Step] = {}
    for method in methods:
        try:
            steps[method] = make_step(method, n, d, c, dtype)
            results[method] = {"workspace_mb": step_memory(steps[method])}
        except Exception as error:  # a peer that fails here is reported, not fatal
            results[method] = {
                "error": f"{type(error).__name__}: {str(error)[:200]}".replace("\n", " ")
            }
            steps.pop(method, None)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    for _ in range(warmup):
        for step in steps.values():
            step()
    samples: dict[str, list[float]] = {m: [] for m in steps}
    for _ in range(repeats):
        for method, step in steps.items():
            samples[method].append(timed_ms(step))
    for method, values in samples.items():
        results[method]["ms"] = statistics.median(values)
    return results


def train_steps(n: int, d: int, c: int, dtype: torch.dtype, steps: int) -> dict:
    """``steps`` SGD steps of the fused head; peak beyond weights, gradients, momentum."""
    device = torch.device(DEVICE)
    head = marginface.ArcFaceLoss(c, d, MARGIN, SCALE, impl="chunked", dtype=dtype, device=device)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator(device=device).manual_seed(0)
    weight_bytes = head.weight.numel() * head.weight.element_size()
    losses, times = [], []
    cuda = DEVICE == "cuda"
    if cuda:
        torch.cuda.synchronize()
        resident = torch.cuda.memory_allocated()  # weights (+ the inputs' few MB below)
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        x = torch.randn(n, d, generator=generator, device=device).to(dtype).requires_grad_(True)
        labels = torch.randint(0, c, (n,), generator=generator, device=device)
        holder: list[torch.Tensor] = []

        def one_step(x=x, labels=labels, holder=holder) -> None:
            optimizer.zero_grad(set_to_none=True)
            with kernels_from_environment("triton" if cuda else "torch"):
                loss = head(x, labels)
                loss.backward()
            optimizer.step()
            holder.append(loss.detach())

        times.append(timed_ms(one_step))
        losses.append(float(holder[0]))
    # weights + gradient + momentum = 3 weight-sized tensors (resident holds the first)
    peak = torch.cuda.max_memory_allocated() if cuda else math.nan
    workspace = peak - resident - 2 * weight_bytes if cuda else math.nan
    return {
        "C": c,
        "dtype": str(dtype).removeprefix("torch."),
        "weights_gb": weight_bytes / 2**30,
        "peak_gb": peak / 2**30,
        "workspace_mb": workspace / MB,
        "step_ms_median": statistics.median(times),
        "losses": losses,
        "finite": all(math.isfinite(v) for v in losses),
    }


CUDA_ONLY = {"fused", "fused_unchecked", "fused_kernels", "fused_compiled", "liger", "cce"}
"""Methods that run Triton kernels: timed on CUDA only (a ``--device cpu`` smoke run leaves
them out with one line each)."""


def _write_json(path: str | None, rows: list[dict]) -> None:
    """Rewrite ``path`` with every row so far (a run killed later keeps them)."""
    if path:
        with open(path, "w") as handle:
            json.dump(rows, handle, indent=2)


def main(argv: list[str] | None = None) -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=0, metavar="K")
    parser.add_argument(
        "--tuned", default=None, help="a JSON file of the kernels' tiles to run with"
    )
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="start no further C after this many seconds (the results so far are written)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the script's logic on tiny shapes (N = D = 16, 1 repeat), on the CPU if there "
        "is no CUDA: the Triton-only methods are left out there with one line each",
    )
    args = parser.parse_args(argv)
    began = time.monotonic()
    if not torch.cuda.is_available():
        if not args.smoke:
            sys.exit("bench_gpu.py needs CUDA (benchmarks/bench_fused.py is the CPU race)")
        DEVICE = "cpu"
    if args.smoke:
        args.batch, args.dim, args.repeats, args.warmup = 16, 16, 1, 1
        args.classes = list(dict.fromkeys(min(c, 64) for c in args.classes))
    dtype = DTYPES[args.dtype]
    n, d = args.batch, args.dim
    if args.tuned:
        print(f"# tuned tiles: {set_tuned_blocks(args.tuned)}", flush=True)
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (smoke)"
    print(f"# {name}, torch {torch.__version__}, N={n}, D={d}", flush=True)
    rows: list[dict] = []
    for c in args.classes:
        if args.deadline_s is not None and time.monotonic() - began > args.deadline_s:
            print(f"# deadline of {args.deadline_s:.0f} s reached: C = {c} not started", flush=True)
            break
        if args.train_steps:
            row = train_steps(n, d, c, dtype, args.train_steps)
            print(json.dumps(row), flush=True)
            rows.append(row)
            _write_json(args.json, rows)
            continue
        methods = [
            m for m in args.methods if m not in OPTIONAL or importlib.util.find_spec(OPTIONAL[m])
        ]
        missing = sorted(set(args.methods) - set(methods))
        if missing and c == args.classes[0]:
            print(f"# not installed, left out: {', '.join(missing)}")
        if DEVICE != "cuda":
            for method in sorted(CUDA_ONLY & set(methods)) if c == args.classes[0] else []:
                print(f"# {method}: skipped, needs CUDA (Triton kernels)")
            methods = [m for m in methods if m not in CUDA_ONLY]
        if c == args.classes[0]:
            print("| C | dtype | method | median ms | / gemm4 | workspace MB |")
            print("|---:|---|---|---:|---:|---:|")
        results = race(methods, n, d, c, dtype, args.repeats, args.warmup)
        floor = results.get("gemm4", {}).get("ms")
        for method, result in results.items():
            rows.append({"C": c, "dtype": args.dtype, "method": method, **result})
            if "error" in result:
                print(f"| {c} | {args.dtype} | {method} | failed: {result['error']} | | |")
                continue
            ratio = f"{result['ms'] / floor:.2f}" if floor else "-"
            print(
                f"| {c} | {args.dtype} | {method} | {result['ms']:.3f} | {ratio} "
                f"| {result['workspace_mb']:.0f} |",
                flush=True,
            )
        _write_json(args.json, rows)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
