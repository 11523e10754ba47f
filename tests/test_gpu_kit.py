"""The one-command GPU kit (tools/gpu_run.sh all, docs/gpu.md) dry-runs here, without CUDA:
each CUDA part is replaced by one line and a smoke run of its logic, so a lent machine's minutes
go to measuring, not to finding a typo."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "tools" / "gpu_run.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the GPU-less machine's")
def test_the_kit_dry_runs_without_cuda(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GPU_BUDGET": "300"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        ["bash", str(KIT), "all"], env=env, capture_output=True, text=True, timeout=480
    )
    out = done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    # every CUDA part: one line saying it was skipped, and its logic run on tiny shapes
    assert "correctness: skipped, no CUDA" in out
    collected = (tmp_path / "correctness-collected.txt").read_text()
    assert int(re.search(r"(\d+) tests? collected", collected).group(1)) > 100
    assert "# fused: skipped, needs CUDA (Triton kernels)" in out
    assert "tune: skipped, no CUDA" in out
    race = json.loads((tmp_path / "race.json").read_text())
    assert {row["method"] for row in race} >= {"gemm4", "dense", "fused_torch", "plain"}
    assert all(row["ms"] > 0 for row in race if "error" not in row)
    assert not [row for row in race if "error" in row]
    (train,) = json.loads((tmp_path / "train10m.json").read_text())
    assert train["finite"] and len(train["losses"]) == 3
    pretrained = json.loads((tmp_path / "pretrained.json").read_text())
    assert {row["model"] for row in pretrained} >= {"dlib-resnet-v1", "inception-resnet-v1"}
    assert re.search(r"all: done in \d+ s of 300", out)
    assert (tmp_path / "env-all.txt").is_file()


def test_the_kit_names_only_tests_that_exist():
    text = KIT.read_text()
    checks = re.search(r"checks=\(([^)]*)\)", text).group(1).split()
    assert len(checks) >= 5
    for name in checks:
        assert (ROOT / name).is_file(), name


def test_an_unknown_stage_is_refused(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        ["bash", str(KIT), "nonsense"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "unknown stage nonsense (all," in done.stderr
