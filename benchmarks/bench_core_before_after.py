"""Issue 36's before/after benchmark: the executor core of two trees, interleaved in one process.

Two copies of the package import side by side: the BEFORE tree is a git commit (``--before``,
default ``8801a4d``, the issue's "today") exported with ``git archive``; the AFTER tree is the
working tree's ``src/marginface`` (uncommitted edits included), or ``--after REF`` exported the
same way. Each copy is written to a temporary folder as ``marginface_before`` /
``marginface_after``, with every whole word ``marginface`` in its ``.py`` files rewritten to that
name (imports, the lazy-import strings and the ``torch.library`` namespace
``marginface::...`` alike, so that both trees' custom operators register side by side).

What is measured, per path and dtype (``N`` rows, ``D`` dims, ``C`` classes; weights and inputs
seeded alike for both trees):

* ``fused``: the fused softmax path, ``create_loss("arcface", C, D, impl="chunked")`` (the head a
  training run builds), one forward + backward;
* ``binary``: the one-vs-all path, ``create_loss("sphereface2", ...)`` (``--binary-loss``,
  e.g. ``uniface``), ``impl="chunked"``;
* ``sharded``: the class-sharded head (``--sharded-loss``, default ``arcface``) on ``--world``
  gloo processes on 127.0.0.1 (a free port, a collective timeout and a deadline), each holding
  ``C/W`` classes and ``N/W`` rows of the seeded global batch, ``cores // W`` threads each.

dtypes as ``benchmarks/bench_fused.py`` and ``bench_binary.py`` run them: ``float32``, or the
weight and the embeddings as ``bfloat16`` tensors.

**Step time**: one process (per rank for ``sharded``) builds both trees' heads, runs
``--warmup`` steps of each, then ``--repeats`` rounds of one BEFORE step and one AFTER step,
alternating which goes first; each step's gradients are set to None (untimed), then
``time.perf_counter`` brackets forward + backward (for ``sharded`` after a barrier; a round's
time is its slowest rank's). Reported: each tree's median, the ratio of the medians
(after / before) and the median of the per-round ratios (paired, so a slow spell of a shared
machine hits both alike).

**Extra memory**, as ``benchmarks/bench_memory.py`` measures it (its ``measure_step``,
``memory_report`` and ``hold_gradients``, and ``bench_sharded.py``'s per-rank form): a peak
resident set cannot be reset per tree inside one process, so each tree gets fresh processes
importing only that tree: a *step* process (warm-up step, gradients set to None, ``VmHWM``
reset, one step, whole-process ``VmHWM``) and a *baseline* process holding the same inputs,
weight and gradients (every page written), running nothing; extra = step peak - baseline peak
(the largest over ranks for ``sharded``), the median over ``--memory-repeats`` pairs.

Output: a markdown table on stdout and a JSON file (default
``benchmarks/results/core_before_after-<time>.json``, git-ignored) with every sample.

    PYTHONPATH=src python benchmarks/bench_core_before_after.py            # C = 100k, 7 rounds
    PYTHONPATH=src python benchmarks/bench_core_before_after.py --quick    # C = 10k, 3 rounds
    PYTHONPATH=src python benchmarks/bench_core_before_after.py --before 8801a4d --after HEAD
    PYTHONPATH=src python benchmarks/bench_core_before_after.py --before HEAD  # A/A: the noise

The default run is about 5 minutes on a quiet 2-core machine (estimated from the C = 100k step
times of docs/benchmarks.md plus ~2.5 s per fresh process; 37 processes in all), twice that
under load. An A/A run (the same code as both trees) shows how far the ratios scatter on the
machine at hand: a difference smaller than that scatter is not measured.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from bench_memory import DTYPES, hold_gradients, measure_step, memory_report, training_step
from bench_sharded import free_port

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "marginface"
VARIANTS = ("before", "after")
PATHS = ("fused", "binary", "sharded")
DEFAULT_BEFORE = "8801a4d"
MB = 2**20
_WORD = re.compile(rf"\b{PACKAGE}\b")


# ---------------------------------------------------------------- the two trees
def module_name(variant: str) -> str:
    """The name a tree's package is imported under: ``marginface_before`` / ``marginface_after``."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    return f"{PACKAGE}_{variant}"


def rename_package(text: str, name: str) -> str:
    """``text`` with every whole word ``marginface`` replaced by ``name``.

    Whole words only: ``from marginface.x import y``, ``"marginface::op"`` and
    ``torch.ops.marginface.op`` change; ``MARGINFACE_X`` and ``marginface_version`` do not.
    """
    return _WORD.sub(name, text)


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)


def resolve_commit(ref: str) -> str:
    """The full hash of commit ``ref``; ``SystemExit`` naming ``ref`` if there is none."""
    result = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if result.returncode != 0:
        raise SystemExit(f"error: {ref!r} is not a commit of {REPO} (git rev-parse)")
    return result.stdout.decode().strip()


def export_tree(ref: str | None, variant: str, into: Path) -> dict[str, Any]:
    """Write the package of ``ref`` (``None``: the working tree's ``src/marginface``) to
    ``into/marginface_<variant>``, renamed by :func:`rename_package`; what was exported."""
    name = module_name(variant)
    target = into / name
    if ref is None:
        shutil.copytree(
            REPO / "src" / PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__")
        )
        head = _git("rev-parse", "HEAD").stdout.decode().strip()
        dirty = bool(_git("status", "--porcelain", "--", "src").stdout.strip())
        info = {"ref": "working tree", "commit": head, "src_modified": dirty}
    else:
        commit = resolve_commit(ref)
        archive = _git("archive", "--format=tar", commit, f"src/{PACKAGE}")
        if archive.returncode != 0:
            raise SystemExit(f"error: git archive {ref} src/{PACKAGE}: {archive.stderr.decode()}")
        staging = into / f"_archive_{variant}"
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(staging, filter="data")
        shutil.move(staging / "src" / PACKAGE, target)
        shutil.rmtree(staging)
        info = {"ref": ref, "commit": commit}
    for path in target.rglob("*.py"):
        path.write_text(rename_package(path.read_text(encoding="utf-8"), name), encoding="utf-8")
    return {**info, "module": name}


def load_variant(packages_dir: str, variant: str) -> ModuleType:
    """Import one exported tree from ``packages_dir``."""
    if packages_dir not in sys.path:
        sys.path.insert(0, packages_dir)
    return importlib.import_module(module_name(variant))


# ---------------------------------------------------------------- one head's step
def build(
    package: ModuleType,
    loss: str,
    n: int,
    d: int,
    c: int,
    dtype: torch.dtype,
    chunk: int | None,
    process_group: Any = None,
    rows: slice | torch.Tensor | None = None,
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """``package``'s head for ``loss`` (chunked; class-sharded if ``process_group``), with
    ``x[N, D]`` and ``labels[N]`` seeded as ``bench_memory.build`` does (``rows``: this rank's
    rows of the global batch). The centers are drawn after ``torch.manual_seed(0)``, so both
    trees' heads start from the same weight."""
    torch.manual_seed(0)
    if process_group is None:
        head = package.create_loss(loss, c, d, impl="chunked", chunk_size=chunk, dtype=dtype)
    else:
        head = package.create_loss(
            loss, c, d, process_group=process_group, chunk_size=chunk, dtype=dtype
        )
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=generator)  # (N, D)
    labels = torch.randint(0, c, (n,), generator=generator)  # (N,)
    if rows is not None:
        x, labels = x[rows].clone(), labels[rows].clone()  # (N/W, D), (N/W,)
    return head, x.to(dtype).requires_grad_(True), labels


def split_step(
    head: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor
) -> tuple[Callable[[], None], Callable[[], None]]:
    """``(reset, run)``: gradients set to None (untimed), then forward + backward (timed)."""

    def reset() -> None:
        head.zero_grad(set_to_none=True)
        x.grad = None

    def run() -> None:
        head(x, labels).backward()

    return reset, run


def interleave(
    steps: dict[str, tuple[Callable[[], None], Callable[[], None]]],
    repeats: int,
    warmup: int,
    before_each: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Seconds of each variant's step per round: ``warmup`` untimed rounds, then ``repeats``
    rounds of BEFORE and AFTER, alternating which runs first (``before_each``: called after
    the reset and before the clock starts, e.g. a barrier)."""
    for _ in range(warmup):
        for reset, run in steps.values():
            reset()
            run()
    samples: dict[str, list[float]] = {variant: [] for variant in steps}
    for round_ in range(repeats):
        order = list(steps) if round_ % 2 == 0 else list(reversed(steps))
        for variant in order:
            reset, run = steps[variant]
            reset()
            if before_each is not None:
                before_each()
            start = time.perf_counter()
            run()
            samples[variant].append(time.perf_counter() - start)
    return samples


def summarize(samples: dict[str, list[float]]) -> dict[str, float]:
    """Medians, their ratio (after / before) and the median of the per-round ratios."""
    before, after = samples["before"], samples["after"]
    median_before, median_after = statistics.median(before), statistics.median(after)
    return {
        "before_s": median_before,
        "after_s": median_after,
        "ratio": median_after / median_before,
        "paired_ratio": statistics.median(a / b for a, b in zip(after, before, strict=True)),
    }


# ---------------------------------------------------------------- child processes
def _run_json(command: list[str], timeout: float, what: str) -> dict[str, Any]:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what}: no result within {timeout:.0f} s") from None
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {result.returncode}):\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _size_options(args: argparse.Namespace, path: str, dtype: str) -> list[str]:
    options = ["--packages-dir", args.packages_dir, "--path", path, "--dtype", dtype]
    options += ["--batch", str(args.batch), "--dim", str(args.dim), "--classes", str(args.classes)]
    options += ["--binary-loss", args.binary_loss, "--sharded-loss", args.sharded_loss]
    options += ["--softmax-loss", args.softmax_loss]
    if args.chunk_size is not None:
        options += ["--chunk-size", str(args.chunk_size)]
    return options


def path_loss(args: argparse.Namespace, path: str) -> str:
    """The loss a path runs: ``--softmax-loss``, ``--binary-loss`` or ``--sharded-loss``."""
    return {"fused": args.softmax_loss, "binary": args.binary_loss}.get(path, args.sharded_loss)


def memory_probe(args: argparse.Namespace) -> dict[str, Any]:
    """In a fresh process: one tree's step peak (``--kind step``) or baseline peak."""
    package = load_variant(args.packages_dir, args.variant)
    head, x, labels = build(
        package, path_loss(args, args.path), args.batch, args.dim, args.classes,
        DTYPES[args.dtype], args.chunk_size,
    )  # fmt: skip
    if args.kind == "baseline":
        hold_gradients(head, x)
        return {**memory_report(), "reset": False}
    return measure_step(lambda: training_step(head, x, labels))


def probe_extra(args: argparse.Namespace, path: str, dtype: str, variant: str) -> dict[str, Any]:
    """Extra peak MiB of one tree on a single-process path: median over the repeats of
    (step process - baseline process)."""
    extras, resets = [], []
    for _ in range(args.memory_repeats):
        peaks = {}
        for kind in ("step", "baseline"):
            command = [sys.executable, __file__, "--probe", "--variant", variant, "--kind", kind]
            command += _size_options(args, path, dtype)
            report = _run_json(command, args.deadline, f"{path} {dtype} {variant} {kind} probe")
            peaks[kind] = report["VmHWM"]
            if kind == "step":
                resets.append(report["reset"])
        extras.append((peaks["step"] - peaks["baseline"]) / MB)
    return {"extra_mib": statistics.median(extras), "extras_mib": extras, "reset": all(resets)}


# ---------------------------------------------------------------- the sharded head
def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One rank: ``--kind time`` (both trees interleaved), ``step`` or ``baseline`` (one tree)."""
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(seconds=args.collective_timeout),
    )
    try:
        variants = VARIANTS if args.kind == "time" else (args.variant,)
        rows = torch.arange(args.batch).tensor_split(args.world)[args.rank]
        built = {
            variant: build(
                load_variant(args.packages_dir, variant), args.sharded_loss, args.batch,
                args.dim, args.classes, DTYPES[args.dtype], args.chunk_size,
                dist.group.WORLD, rows,
            )
            for variant in variants
        }  # fmt: skip
        if args.kind == "time":
            steps = {variant: split_step(*built[variant]) for variant in variants}
            samples = interleave(steps, args.repeats, args.warmup, before_each=dist.barrier)
            return {"rank": args.rank, "samples": samples}
        head, x, labels = built[args.variant]
        if args.kind == "baseline":
            hold_gradients(head, x)
            dist.barrier()
            return {"rank": args.rank, **memory_report(), "reset": False}

        def step() -> None:
            training_step(head, x, labels)

        return {"rank": args.rank, **measure_step(step)}
    finally:
        dist.destroy_process_group()


def launch(args: argparse.Namespace, dtype: str, kind: str, variant: str) -> list[dict[str, Any]]:
    """``--world`` fresh rank processes of ``worker``; their reports in rank order."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.world)
    command = [sys.executable, __file__, "--worker", "--kind", kind, "--variant", variant]
    command += ["--world", str(args.world), "--port", str(free_port())]
    command += ["--threads", str(threads), "--repeats", str(args.repeats)]
    command += ["--warmup", str(args.warmup), "--collective-timeout", str(args.collective_timeout)]
    command += _size_options(args, "sharded", dtype)
    processes = [
        subprocess.Popen(
            [*command, "--rank", str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(args.world)
    ]  # fmt: skip
    reports, failures = [], []
    deadline = time.monotonic() + args.deadline
    try:
        for rank, process in enumerate(processes):
            try:
                out, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(
                    f"sharded {dtype} {kind}: no result within {args.deadline:.0f} s"
                ) from None
            if process.returncode != 0:
                failures.append(f"--- rank {rank} (exit {process.returncode}) ---\n{err}")
            else:
                reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    if failures:
        raise RuntimeError(f"sharded {dtype} {kind} failed:\n" + "\n".join(failures))
    return reports


def sharded_extra(args: argparse.Namespace, dtype: str, variant: str) -> dict[str, Any]:
    """Extra peak MiB per rank of one tree's sharded head (the largest rank), median over the
    repeats of (step group - baseline group)."""
    extras, resets = [], []
    for _ in range(args.memory_repeats):
        steps = launch(args, dtype, "step", variant)
        bases = launch(args, dtype, "baseline", variant)
        extras.append(max(s["VmHWM"] - b["VmHWM"] for s, b in zip(steps, bases, strict=True)) / MB)
        resets += [s["reset"] for s in steps]
    return {"extra_mib": statistics.median(extras), "extras_mib": extras, "reset": all(resets)}


# ---------------------------------------------------------------- one row
def measure(
    args: argparse.Namespace, packages: dict[str, ModuleType], path: str, dtype: str
) -> dict[str, Any]:
    """Step times (interleaved) and each tree's extra memory of one path and dtype."""
    if path == "sharded":
        reports = launch(args, dtype, "time", "after")
        per_rank = [report["samples"] for report in reports]
        samples = {  # a round's time is its slowest rank's
            variant: [max(times) for times in zip(*(r[variant] for r in per_rank), strict=True)]
            for variant in VARIANTS
        }
    else:
        built = {
            variant: build(
                packages[variant], path_loss(args, path), args.batch, args.dim, args.classes,
                DTYPES[dtype], args.chunk_size,
            )
            for variant in VARIANTS
        }  # fmt: skip
        steps = {variant: split_step(*built[variant]) for variant in VARIANTS}
        samples = interleave(steps, args.repeats, args.warmup)
        del built, steps
    row: dict[str, Any] = {"path": path, "loss": path_loss(args, path), "dtype": dtype}
    row.update(summarize(samples))
    row["samples_s"] = samples
    if args.memory:
        for variant in VARIANTS:
            if path == "sharded":
                memory = sharded_extra(args, dtype, variant)
            else:
                memory = probe_extra(args, path, dtype, variant)
            row[f"{variant}_extra_mib"] = memory["extra_mib"]
            row[f"{variant}_memory"] = memory
    return row


def table_line(row: dict[str, Any]) -> str:
    """One markdown row: path, dtype, medians, ratio, paired ratio, extra MiB of each tree."""

    def mib(variant: str) -> str:
        value = row.get(f"{variant}_extra_mib")
        return "-" if value is None else f"{value:.0f}"

    return (
        f"| {row['path']} ({row['loss']}) | {row['dtype']} | {row['before_s']:.4f} "
        f"| {row['after_s']:.4f} | {row['ratio']:.3f} | {row['paired_ratio']:.3f} "
        f"| {mib('before')} | {mib('after')} |"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options; ``--quick`` fills ``--classes`` and ``--repeats`` where they are not given,
    and a count below its minimum is a usage error naming the option."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default=DEFAULT_BEFORE, help="git ref of the BEFORE tree")
    parser.add_argument(
        "--after", default=None, help="git ref of the AFTER tree (default: the working tree)"
    )
    parser.add_argument("--batch", type=int, default=512, help="N (the global batch if sharded)")
    parser.add_argument("--dim", type=int, default=512, help="D")
    parser.add_argument("--classes", type=int, default=None, help="C (default 100000; quick 10000)")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--softmax-loss", default="arcface", help="the fused path's loss")
    parser.add_argument("--binary-loss", default="sphereface2", help="e.g. sphereface2, uniface")
    parser.add_argument("--sharded-loss", default="arcface", help="the sharded head's loss")
    parser.add_argument("--world", type=int, default=2, help="processes of the sharded head")
    parser.add_argument("--threads", type=int, default=0, help="per rank; 0: cores // world")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 7)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--memory-repeats", type=int, default=1, help="probe pairs per tree")
    parser.add_argument("--quick", action="store_true", help="C = 10000 and 3 rounds by default")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds per child launch")
    parser.add_argument("--collective-timeout", type=float, default=300.0)
    parser.add_argument("--json", default=None, help="default: benchmarks/results/...json")
    # child processes (internal)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--packages-dir", help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", choices=list(DTYPES), help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.classes is None:
        args.classes = 10_000 if args.quick else 100_000
    if args.repeats is None:
        args.repeats = 3 if args.quick else 7
    for name in ("batch", "dim", "classes", "world", "repeats", "memory_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    return args


def check_losses(args: argparse.Namespace, packages: dict[str, ModuleType]) -> None:
    """Every path's loss is registered in both trees; ``SystemExit`` naming the option if not."""
    for path in args.paths:
        option = {"fused": "--softmax-loss", "binary": "--binary-loss"}.get(path, "--sharded-loss")
        for variant, package in packages.items():
            try:
                package.get_loss_class(path_loss(args, path))
            except (KeyError, ValueError) as error:
                raise SystemExit(f"error: {option} in the {variant} tree: {error}") from None


def main(argv: list[str] | None = None) -> None:
    """Export both trees, measure every path and dtype, print the table and write the JSON."""
    args = parse_args(argv)
    if args.probe:
        print(json.dumps(memory_probe(args)))
        return
    if args.worker:
        print(json.dumps(worker(args)))
        return

    trees: dict[str, Any] = {}
    args.packages_dir = tempfile.mkdtemp(prefix="mf-before-after-")
    try:
        trees["before"] = export_tree(args.before, "before", Path(args.packages_dir))
        trees["after"] = export_tree(args.after, "after", Path(args.packages_dir))
        packages = {variant: load_variant(args.packages_dir, variant) for variant in VARIANTS}
        check_losses(args, packages)
        print(
            f"# torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"N={args.batch}, D={args.dim}, C={args.classes}, W={args.world}, "
            f"{args.repeats} rounds after {args.warmup} warm-up, "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        for variant in VARIANTS:
            tree = trees[variant]
            print(f"# {variant}: {tree['ref']} ({tree['commit'][:10]}) as {tree['module']}")
        print(
            "| path | dtype | before median s | after median s | ratio | paired ratio "
            "| before extra MiB | after extra MiB |"
        )
        print("|" + "---|" * 8, flush=True)
        rows = []
        for path in args.paths:
            for dtype in args.dtypes:
                row = measure(args, packages, path, dtype)
                print(table_line(row), flush=True)
                rows.append(row)
    finally:
        shutil.rmtree(args.packages_dir, ignore_errors=True)
    if args.json is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        args.json = str(REPO / "benchmarks" / "results" / f"core_before_after-{stamp}.json")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("packages_dir", "json")}
    result = {
        "trees": trees,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
        "settings": settings,
        "rows": rows,
    }
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    print(f"# written: {args.json}")


if __name__ == "__main__":
    main()
