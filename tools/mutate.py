"""Mutation testing of marginface's core: does the test suite notice a small bug?

Each *mutant* is the source with one small change: a comparison flipped (``<`` -> ``<=``), an
operator swapped (``+`` -> ``-``, ``*`` -> ``/``, ``and`` -> ``or``), a numeric constant moved by
one, a ``not`` removed or an ``if`` condition negated, a reduction replaced (``median`` ->
``mean``, ``max`` -> ``min``...), or a statement dropped. For each mutant the script runs the
tests that cover that file (``pytest -x -q -p no:cacheprovider``, with a timeout) and reports it
**killed** (a test failed, errored or timed out) or **survived** (every test passed).

Scope: the margins, the executors (the softmax chunk loop; the one-vs-all reduction,
``executors/binary*.py`` and ``triton_binary.py``, as its own area with its own tests),
verification (``evaluation/verification.py``) and the resume path (``train/state/run_state.py``'s
reading and single-file restoring, ``train/state/checkpoint.py``).
Mutants are sampled with a fixed seed, a share per file, so a run is repeatable.

Safety: the mutants are written into a copy of ``src/`` and ``tests/`` in a temporary folder
(``PYTHONPATH`` points there; the script checks that ``marginface`` is imported from the copy).
The repository is never modified, so an interrupted run cannot leave a mutated source behind.

Usage (from the repository root; ``make mutate`` runs the first line)::

    .venv/bin/python tools/mutate.py                         # ~80 sampled mutants
    .venv/bin/python tools/mutate.py --budget 20 --only adacos
    .venv/bin/python tools/mutate.py --list                  # enumerate, run nothing
    .venv/bin/python tools/mutate.py --area executors --workers 2   # the sample's executors
    .venv/bin/python tools/mutate.py --all                   # every mutant (slow)
    .venv/bin/python tools/mutate.py --all --match "adacos.py:118"   # one line's mutants

Writes ``runs/mutation/report.json`` (git-ignored): every mutant with its outcome and diff.
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MARGIN_TESTS = (
    "tests/margins",
    "tests/test_gradcheck.py",
    "tests/test_registry_sweep.py",
    "tests/test_bad_input.py",
)
EXECUTOR_TESTS = ("tests/executors", "tests/test_registry_sweep.py", "tests/test_gradcheck.py")
VERIFICATION_TESTS = ("tests/evaluation/test_verification.py",)
BINARY_TESTS = (
    "tests/executors/test_binary_loop.py",
    "tests/executors/test_binary_op.py",
    "tests/executors/test_binary_triton.py",
    "tests/margins/test_binary_parity.py",
    "tests/distributed/test_binary_sharded.py",
    "tests/executors/test_compile.py::test_compiled_loss_equals_eager[uniface-chunked]",
    "tests/executors/test_compile.py::test_compiled_loss_equals_eager[sphereface2-a-chunked]",
)
"""The one-vs-all reduction's tests: the loss restated, chunked = dense, Partial FC, the custom
operators and the Triton kernels (interpreter), the authors' code, 2 ranks, and two losses
compiled (the operators' registered autograd and fake implementations)."""
BASELINE_TIMEOUT_S = 1800
"""Seconds the unmutated tests of one area may take (tests/executors, one process, is the
longest); each mutant's own limit is a multiple of its area's measured time."""
RESUME_TESTS = ("tests/train/test_trainer.py", "tests/train/state/test_run_state.py")
RESUME_FUNCTIONS = frozenset({"read_saved_run", "_restore_file"})
"""The resume path in ``train/state/run_state.py``: reading a checkpoint once and restoring it into
a
run of one process (the sharded path needs several processes, too slow per mutant)."""


@dataclass(frozen=True)
class Target:
    """Files to mutate, their area, the tests that should notice, and (optionally) the only
    functions to mutate."""

    area: str
    pattern: str
    tests: tuple[str, ...]
    functions: frozenset[str] | None = None


TARGETS = (
    Target("margins", "src/marginface/margins/[!_]*.py", MARGIN_TESTS),
    Target("margins", "src/marginface/margins/_angles.py", MARGIN_TESTS),
    Target("executors", "src/marginface/executors/dense.py", EXECUTOR_TESTS),
    # the chunk loop: prologue, loop, workspace, entry points, autograd Function
    Target("executors", "src/marginface/executors/chunk*.py", EXECUTOR_TESTS),
    Target("executors", "src/marginface/executors/margin_loss.py", EXECUTOR_TESTS),
    Target("executors", "src/marginface/executors/_online_softmax.py", EXECUTOR_TESTS),
    Target("executors", "src/marginface/executors/triton_kernels.py", ("tests/executors",)),
    Target("executors", "src/marginface/executors/triton_dispatch.py", ("tests/executors",)),
    # the one-vs-all reduction: loop, rule, in-place passes, custom operators, Triton kernels
    Target("binary", "src/marginface/executors/binary*.py", BINARY_TESTS),
    Target("binary", "src/marginface/executors/triton_binary.py", BINARY_TESTS),
    # the one-vs-all parts of the shared custom-op registration and Triton device code
    Target(
        "binary",
        "src/marginface/executors/fused_op.py",
        BINARY_TESTS,
        frozenset({"register", "_binary_rule", "_binary_reduce", "_binary_gradient"}),
    ),
    Target(
        "binary",
        "src/marginface/executors/triton_rules.py",
        BINARY_TESTS,
        frozenset({"_binary_logit"}),
    ),
    Target("verification", "src/marginface/evaluation/verification.py", VERIFICATION_TESTS),
    Target("resume", "src/marginface/train/state/run_state.py", RESUME_TESTS, RESUME_FUNCTIONS),
    Target("resume", "src/marginface/train/state/checkpoint.py", RESUME_TESTS),
)

AREA_SHARES = {
    "margins": 0.3,
    "executors": 0.3,
    "binary": 0.15,
    "verification": 0.125,
    "resume": 0.125,
}
"""How the sampling budget is split between the areas (within an area: by number of mutants)."""

COMPARE_FLIPS: dict[type, type] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
BINOP_SWAPS: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
}
CALL_SWAPS = {
    "median": "mean",
    "max": "min",
    "min": "max",
    "amax": "amin",
    "amin": "amax",
    "argmax": "argmin",
    "argmin": "argmax",
    "clamp_min": "clamp_max",
    "clamp_max": "clamp_min",
    "sum": "mean",
    "mean": "sum",
    "any": "all",
    "all": "any",
    "cos": "sin",
    "sin": "cos",
    "maximum": "minimum",
    "minimum": "maximum",
}


@dataclass
class Mutant:
    """One change to one file. ``start``/``end`` are byte offsets in the original source."""

    path: str
    line: int
    kind: str
    description: str
    start: int
    end: int
    replacement: str
    tests: tuple[str, ...]
    outcome: str = "not run"
    seconds: float = 0.0
    diff: str = field(default="", repr=False)

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.replacement.encode() + source[self.end :]


class _Finder(ast.NodeVisitor):
    """Collects mutation points of one module (skipping docstrings, annotations, f-strings,
    ``raise`` statements and ``__all__``)."""

    def __init__(self, source: bytes, functions: frozenset[str] | None) -> None:
        self.source = source
        self.line_starts = [0]
        for line in source.splitlines(keepends=True):
            self.line_starts.append(self.line_starts[-1] + len(line))
        self.functions = functions
        self.stack: list[str] = []
        self.points: list[tuple[ast.AST, str, str, str]] = []  # node, kind, description, text

    # ------------------------------------------------------------------ helpers
    def offsets(self, node: ast.AST) -> tuple[int, int]:
        start = self.line_starts[node.lineno - 1] + node.col_offset
        end = self.line_starts[node.end_lineno - 1] + node.end_col_offset
        return start, end

    def text(self, node: ast.AST) -> str:
        start, end = self.offsets(node)
        return self.source[start:end].decode()

    def active(self) -> bool:
        return self.functions is None or any(name in self.functions for name in self.stack)

    def add(self, node: ast.AST, kind: str, description: str, replacement: str) -> None:
        if self.active():
            self.points.append((node, kind, description, replacement))

    def expression(self, node: ast.expr, mutated: ast.expr, kind: str) -> None:
        before = self.text(node)
        after = ast.unparse(mutated)
        if ast.unparse(node) != after:
            self.add(node, kind, f"{_short(before)} -> {_short(after)}", f"({after})")

    # ------------------------------------------------------------------ skips
    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.stack.append(node.name)
        for decorator in node.decorator_list:
            self.visit(decorator)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        self._body(node.body)
        self.stack.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.stack.append(node.name)
        self._body(node.body)
        self.stack.pop()

    def visit_Module(self, node: ast.Module) -> None:
        self._body(node.body)

    def _body(self, body: list[ast.stmt]) -> None:
        for index, statement in enumerate(body):
            docstring = (
                index == 0
                and isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            )
            if not docstring:
                self.visit(statement)

    def visit_Raise(self, node: ast.Raise) -> None:
        pass  # error messages and their types: not the behaviour under test here

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        pass

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_Assign(self, node: ast.Assign) -> None:
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return
        if any(isinstance(t, (ast.Attribute, ast.Subscript)) for t in node.targets):
            self.add(node, "drop", f"drop `{_short(self.text(node))}`", "pass")
        self.visit(node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.add(node, "drop", f"drop `{_short(self.text(node))}`", "pass")
        self.visit(node.value)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Call):
            self.add(node, "drop", f"drop `{_short(self.text(node))}`", "pass")
        self.visit(node.value)

    def visit_If(self, node: ast.If) -> None:
        negated = ast.UnaryOp(op=ast.Not(), operand=copy.deepcopy(node.test))
        self.expression(node.test, negated, "negate-if")
        self.generic_visit(node)

    # ------------------------------------------------------------------ expressions
    def visit_Compare(self, node: ast.Compare) -> None:
        for index, op in enumerate(node.ops):
            flipped = COMPARE_FLIPS.get(type(op))
            if flipped is not None:
                mutated = copy.deepcopy(node)
                mutated.ops[index] = flipped()
                self.expression(node, mutated, "compare")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        swapped = BINOP_SWAPS.get(type(node.op))
        if swapped is not None and not _is_string(node):
            mutated = copy.deepcopy(node)
            mutated.op = swapped()
            self.expression(node, mutated, "operator")
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        mutated = copy.deepcopy(node)
        mutated.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        self.expression(node, mutated, "boolean")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, (ast.Not, ast.USub)):
            self.expression(node, copy.deepcopy(node.operand), "unary")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self.expression(node, ast.Constant(value + 1), "constant")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in CALL_SWAPS:
            mutated = copy.deepcopy(node)
            if isinstance(mutated.func, ast.Attribute):
                mutated.func.attr = CALL_SWAPS[name]
            else:
                mutated.func.id = CALL_SWAPS[name]
            self.expression(node, mutated, "call")
        self.generic_visit(node)


def _is_string(node: ast.BinOp) -> bool:
    return any(
        isinstance(side, ast.JoinedStr)
        or (isinstance(side, ast.Constant) and isinstance(side.value, str))
        for side in (node.left, node.right)
    )


def _short(text: str, width: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def find_mutants(path: Path, target: Target) -> list[Mutant]:
    """Every syntactically valid mutant of ``path`` (relative names in the result)."""
    source = path.read_bytes()
    finder = _Finder(source, target.functions)
    finder.visit(ast.parse(source))
    relative = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
    mutants = []
    for node, kind, description, replacement in finder.points:
        start, end = finder.offsets(node)
        mutant = Mutant(
            relative, node.lineno, kind, description, start, end, replacement, target.tests
        )
        mutated = mutant.apply(source)
        try:
            compile(mutated, relative, "exec")
        except SyntaxError:
            continue
        mutants.append(mutant)
    return mutants


def unified_diff(mutant: Mutant) -> str:
    """The mutant as a zero-context unified diff against the repository's file."""
    source = (REPO / mutant.path).read_bytes()
    return "".join(
        difflib.unified_diff(
            source.decode().splitlines(keepends=True),
            mutant.apply(source).decode().splitlines(keepends=True),
            mutant.path,
            mutant.path + " (mutant)",
            n=0,
        )
    )


def all_mutants(only: str | None = None) -> dict[str, list[Mutant]]:
    """``{file: mutants}`` over :data:`TARGETS` (``only``: a substring of the path)."""
    found: dict[str, list[Mutant]] = {}
    for target in TARGETS:
        for path in sorted(REPO.glob(target.pattern)):
            relative = path.relative_to(REPO).as_posix()
            if only and only not in relative:
                continue
            found[relative] = find_mutants(path, target)
    return found


def _area(path: str) -> str:
    return next(t.area for t in TARGETS if (REPO / path).match(str(REPO / t.pattern)))


def sample(found: dict[str, list[Mutant]], budget: int | None, seed: int) -> list[Mutant]:
    """A repeatable sample of about ``budget`` mutants: :data:`AREA_SHARES` of the budget per
    area, shared between its files in proportion to their mutants (at least 2 per file that
    has any). ``budget=None`` keeps every mutant."""
    rng = random.Random(seed)
    if budget is None:
        return [m for mutants in found.values() for m in mutants]
    areas = {_area(path) for path in found}
    weight = sum(AREA_SHARES[a] for a in areas)
    chosen: list[Mutant] = []
    for area in sorted(areas):
        files = {p: m for p, m in found.items() if _area(p) == area}
        total = sum(len(m) for m in files.values())
        area_budget = budget * AREA_SHARES[area] / weight
        for mutants in files.values():
            share = round(area_budget * len(mutants) / max(total, 1))
            share = min(len(mutants), max(2, share))
            chosen += sorted(rng.sample(mutants, share), key=lambda m: (m.line, m.start))
    return chosen


# ---------------------------------------------------------------------- running
def _copy_tree(destination: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    # benchmarks/: tests/margins/test_parity.py loads the restated reference formulas from
    # benchmarks/parity_check.py
    for name in ("src", "tests", "benchmarks"):
        shutil.copytree(REPO / name, destination / name, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", destination / "pyproject.toml")
    # tests find the offline data at ../shared/data relative to the repository root
    shared = REPO.parent / "shared"
    if shared.exists() and not (destination.parent / "shared").exists():
        (destination.parent / "shared").symlink_to(shared, target_is_directory=True)


def _environment(copy_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy_root / "src")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a same-size, same-second rewrite must not reuse a .pyc
    env.pop("CI", None)
    return env


def pytest_command(tests: Sequence[str], workers: int = 1) -> list[str]:
    """The command that runs ``tests`` for one mutant: stop at the first failure, no cache;
    ``workers > 1`` spreads the tests over that many pytest-xdist processes."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    if workers > 1:
        command += ["-n", str(workers)]
    return [*command, *tests]


def _pytest(
    copy_root: Path, tests: Sequence[str], timeout: float, workers: int = 1
) -> tuple[str, float, str]:
    command = pytest_command(tests, workers)
    began = time.perf_counter()
    try:
        result = subprocess.run(
            command,
            cwd=copy_root,
            env=_environment(copy_root),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "killed (timeout)", time.perf_counter() - began, ""
    seconds = time.perf_counter() - began
    tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-3:])
    if result.returncode == 0:
        return "survived", seconds, tail
    if result.returncode == 1 or (result.returncode == 2 and "stopping after" in result.stdout):
        return "killed", seconds, tail  # exit 2: pytest-xdist's -x stops the workers
    return f"killed (pytest exit {result.returncode})", seconds, tail


def run(
    mutants: list[Mutant], *, timeout_factor: float, min_timeout: float, workers: int = 1
) -> None:
    with tempfile.TemporaryDirectory(prefix="marginface-mutate-") as tmp:
        copy_root = Path(tmp) / "repo"
        _copy_tree(copy_root)
        probe = subprocess.run(
            [sys.executable, "-c", "import marginface; print(marginface.__file__)"],
            cwd=copy_root,
            env=_environment(copy_root),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not Path(probe).resolve().is_relative_to(copy_root.resolve()):
            raise SystemExit(f"marginface is imported from {probe}, not from the copy; aborting")
        timeouts: dict[tuple[str, ...], float] = {}
        for tests in sorted({m.tests for m in mutants}):
            outcome, seconds, tail = _pytest(
                copy_root, tests, timeout=BASELINE_TIMEOUT_S, workers=workers
            )
            if outcome == "killed (timeout)":
                raise SystemExit(
                    f"the unmutated tests ({' '.join(tests)}) took over {BASELINE_TIMEOUT_S} s: "
                    "is the machine loaded?"
                )
            if outcome != "survived":
                raise SystemExit(f"the unmutated tests fail ({' '.join(tests)}):\n{tail}")
            timeouts[tests] = max(min_timeout, timeout_factor * seconds)
            print(f"baseline {' '.join(tests)}: passed in {seconds:.1f} s", flush=True)
        for index, mutant in enumerate(mutants, 1):
            path = copy_root / mutant.path
            original = path.read_bytes()
            try:
                path.write_bytes(mutant.apply(original))
                mutant.outcome, mutant.seconds, _ = _pytest(
                    copy_root, mutant.tests, timeouts[mutant.tests], workers=workers
                )
            finally:
                path.write_bytes(original)
            print(
                f"[{index:3d}/{len(mutants)}] {mutant.outcome:<17} {mutant.path}:{mutant.line} "
                f"{mutant.kind}: {mutant.description} ({mutant.seconds:.1f} s)",
                flush=True,
            )


def _label(mutant: Mutant) -> str:
    return f"{mutant.path}:{mutant.line} {mutant.kind}: {mutant.description}"


def summarize(mutants: list[Mutant]) -> str:
    lines = ["", f"{'file':<48} {'mutants':>7} {'killed':>7} {'survived':>8}"]
    per_file: dict[str, Counter] = {}
    for mutant in mutants:
        counts = per_file.setdefault(mutant.path, Counter())
        counts["mutants"] += 1
        counts["killed" if mutant.outcome.startswith("killed") else "survived"] += 1
    for path, counts in per_file.items():
        lines.append(
            f"{path:<48} {counts['mutants']:>7} {counts['killed']:>7} {counts['survived']:>8}"
        )
    total = len(mutants)
    killed = sum(m.outcome.startswith("killed") for m in mutants)
    lines.append(f"{'total':<48} {total:>7} {killed:>7} {total - killed:>8}")
    if total:
        lines.append(f"mutation score: {killed / total:.1%}")
    survivors = [m for m in mutants if m.outcome == "survived"]
    if survivors:
        lines.append("\nsurvived:")
        lines += [f"  {m.path}:{m.line} {m.kind}: {m.description}" for m in survivors]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--budget", type=int, default=80, help="mutants to sample (default 80)")
    parser.add_argument("--all", action="store_true", help="every mutant, no sampling")
    parser.add_argument("--seed", type=int, default=17, help="sampling seed (default 17)")
    parser.add_argument("--only", help="only files whose path contains this")
    parser.add_argument(
        "--match", help="only mutants whose 'path:line kind: description' contains this"
    )
    parser.add_argument(
        "--area",
        choices=sorted(AREA_SHARES),
        help="only this area's mutants of the sample (the same mutants as the whole run's)",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument(
        "--workers", type=int, default=1, help="pytest-xdist processes per mutant (default 1)"
    )
    parser.add_argument("--timeout-factor", type=float, default=3.0, help="x baseline time")
    parser.add_argument("--min-timeout", type=float, default=60.0, help="seconds, at least")
    parser.add_argument("--report", type=Path, default=REPO / "runs" / "mutation" / "report.json")
    args = parser.parse_args(argv)
    if args.budget < 1:
        parser.error(f"--budget must be >= 1, got {args.budget}")
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    found = all_mutants(args.only)
    if not found:
        parser.error(f"no target file matches --only {args.only!r}")
    mutants = sample(found, None if args.all else args.budget, args.seed)
    if args.area:
        mutants = [m for m in mutants if _area(m.path) == args.area]
    if args.match:
        mutants = [m for m in mutants if args.match in _label(m)]
    counts = ", ".join(f"{Path(p).name} {len(m)}" for p, m in found.items())
    print(f"{sum(map(len, found.values()))} mutants found ({counts}); running {len(mutants)}")
    if args.list:
        for mutant in mutants:
            print(f"{mutant.path}:{mutant.line} {mutant.kind}: {mutant.description}")
        return 0
    for mutant in mutants:
        mutant.diff = unified_diff(mutant)
    began = time.perf_counter()
    run(
        mutants,
        timeout_factor=args.timeout_factor,
        min_timeout=args.min_timeout,
        workers=args.workers,
    )
    print(summarize(mutants))
    print(f"\n{time.perf_counter() - began:.0f} s in all")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(
        json.dumps([asdict(m) for m in mutants], indent=1, ensure_ascii=False), encoding="utf-8"
    )
    print(f"report: {args.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
