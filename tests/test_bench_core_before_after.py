"""benchmarks/bench_core_before_after.py (issue 36's before/after benchmark), end to end on tiny
sizes: two exported trees side by side, the interleaved rounds, the memory probes, the JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_core_before_after.py"
pytestmark = pytest.mark.skipif(
    not (REPO / ".git").exists(), reason="the benchmark exports trees with git: not a git checkout"
)
TINY = ["--quick", "--before", "HEAD", "--classes", "64", "--batch", "8", "--dim", "8"]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(SCRIPT.parent))  # the script imports bench_memory, bench_sharded
    try:
        spec = importlib.util.spec_from_file_location("bench_core_under_test", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def run_script(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [sys.executable, str(SCRIPT), *TINY, *options, "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result, json.loads(out.read_text())


def test_rename_package_whole_words_only(bench):
    source = (
        "from marginface.executors import x\nimport marginface\n"
        'op = torch.library.custom_op("marginface::lse", f)\ny = torch.ops.marginface.lse\n'
        "MARGINFACE_TRITON = marginface_version()\n"
    )
    assert bench.rename_package(source, "marginface_before") == (
        "from marginface_before.executors import x\nimport marginface_before\n"
        'op = torch.library.custom_op("marginface_before::lse", f)\n'
        "y = torch.ops.marginface_before.lse\nMARGINFACE_TRITON = marginface_version()\n"
    )


def test_module_name_names_a_bad_variant(bench):
    assert bench.module_name("before") == "marginface_before"
    with pytest.raises(ValueError, match="variant must be one of before, after, got 'during'"):
        bench.module_name("during")


def test_summarize_medians_and_paired_ratio(bench):
    samples = {"before": [1.0, 2.0, 4.0], "after": [3.0, 1.0, 2.0]}
    summary = bench.summarize(samples)
    assert (summary["before_s"], summary["after_s"], summary["ratio"]) == (2.0, 2.0, 1.0)
    assert summary["paired_ratio"] == 0.5  # per round 3.0, 0.5, 0.5


def test_interleave_alternates_which_tree_goes_first(bench):
    calls = []

    def step(variant):
        return (lambda: calls.append(("reset", variant)), lambda: calls.append(("run", variant)))

    samples = bench.interleave({"before": step("before"), "after": step("after")}, 3, 1)
    runs = [variant for what, variant in calls if what == "run"]
    assert runs == ["before", "after", "before", "after", "after", "before", "before", "after"]
    assert all(calls[i] == ("reset", calls[i + 1][1]) for i in range(0, len(calls), 2))
    assert [len(samples["before"]), len(samples["after"])] == [3, 3]


@pytest.mark.parametrize("ref", ["HEAD", None])
def test_export_tree_renames_the_package(bench, tmp_path, ref):
    info = bench.export_tree(ref, "after", tmp_path)
    package = tmp_path / "marginface_after"
    assert info["module"] == "marginface_after" and info["ref"] == (ref or "working tree")
    sources = {path.name: path.read_text() for path in package.rglob("*.py")}
    assert "executors" in {path.name for path in package.iterdir()}
    assert "__init__.py" in sources
    assert not any(bench._WORD.search(text) for text in sources.values())
    assert any("marginface_after::" in text for text in sources.values())  # custom ops
    assert not list(package.rglob("__pycache__"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--before", "no-such-ref-36"], "'no-such-ref-36' is not a commit"),
        (["--binary-loss", "sphereface9"], "--binary-loss in the before tree: unknown loss"),
    ],
)
def test_bad_option_is_one_line(options, message):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [sys.executable, str(SCRIPT), *TINY, "--no-memory", *options]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_every_path_runs_both_trees_interleaved(tmp_path):
    result, data = run_script(
        tmp_path, "--paths", "fused", "binary", "sharded", "--dtypes", "float32", "--no-memory",
        "--repeats", "2",
    )  # fmt: skip
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert data["trees"]["before"] == {
        "ref": "HEAD",
        "commit": commit,
        "module": "marginface_before",
    }
    assert data["trees"]["after"]["module"] == "marginface_after"
    assert [(row["path"], row["dtype"]) for row in data["rows"]] == [
        ("fused", "float32"), ("binary", "float32"), ("sharded", "float32"),
    ]  # fmt: skip
    for row in data["rows"]:
        samples = row["samples_s"]
        assert [len(samples["before"]), len(samples["after"])] == [2, 2]
        assert all(t > 0 for t in samples["before"] + samples["after"])
        assert row["ratio"] == pytest.approx(row["after_s"] / row["before_s"])
        assert "before_extra_mib" not in row
    lines = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert len(lines) == 1 + 3  # the header and one row per path
    assert lines[1].startswith("| fused (arcface) | float32 |") and lines[1].endswith("| - | - |")


@pytest.mark.slow
@pytest.mark.parametrize("path", ["fused", "sharded"])
def test_extra_memory_of_each_tree(tmp_path, path):
    _, data = run_script(tmp_path, "--paths", path, "--dtypes", "bfloat16", "--repeats", "1")
    (row,) = data["rows"]
    for variant in ("before", "after"):
        memory = row[f"{variant}_memory"]
        assert memory["extras_mib"] == [row[f"{variant}_extra_mib"]]
        # a step beyond the held tensors needs at least its (N, C-chunk) buffers, and a tiny
        # step far less than the ~200 MiB a process of torch holds
        assert 0 < row[f"{variant}_extra_mib"] < 200
