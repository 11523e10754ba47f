"""benchmarks/summarize_verification.py: per-fold LFW rows into per-loss means and paired
differences, checked against numbers worked out by hand."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def summarize():
    path = REPO / "benchmarks" / "summarize_verification.py"
    spec = importlib.util.spec_from_file_location("summarize_verification_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path: Path, rows: list[dict]) -> Path:
    keys = [
        "dataset",
        "fold",
        "loss",
        "status",
        "verification_accuracy",
        "auc",
        "eer",
        "tar@far=1e-02",
        "precision_at_1",
        "map_at_r",
        "train_seconds",
    ]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: row.get(key, "") for key in keys})
    return path


def _row(fold, loss, acc, status="ok", seconds=100.0):
    return {
        "dataset": "lfw",
        "fold": fold,
        "loss": loss,
        "status": status,
        "verification_accuracy": acc,
        "auc": 0.9,
        "eer": 0.1,
        "tar@far=1e-02": 0.5,
        "precision_at_1": 0.4,
        "map_at_r": 0.3,
        "train_seconds": seconds,
    }


def test_means_and_paired_difference_by_hand(summarize, tmp_path):
    a = _write(
        tmp_path / "a.csv",
        [_row(0, "arcface", 0.80), _row(0, "x", 0.82), _row(1, "arcface", 0.90, seconds=300.0)],
    )
    b = _write(
        tmp_path / "b.csv",
        [_row(1, "x", 0.86), _row(2, "x", 0.70), _row(2, "arcface", 0.75, status="diverged")],
    )
    results = summarize.read_results([a, b])
    assert {loss: sorted(folds) for loss, folds in results.items()} == {
        "arcface": [0, 1],
        "x": [0, 1, 2],
    }
    diff = summarize.paired_difference(results["x"], results["arcface"])
    # folds both ran: 0 (+0.02) and 1 (-0.04); the diverged arcface fold 2 is left out
    assert diff["folds"] == 2 and diff["better"] == 1 and diff["worse"] == 1
    assert diff["mean"] == pytest.approx(-0.01)
    assert diff["std"] == pytest.approx(0.06 / 2**0.5)
    # t = mean / (std / sqrt 2) = -1/3 with 1 degree of freedom: p = 1 - 2 atan(1/3) / pi
    assert diff["p"] == pytest.approx(1 - 2 * 0.3217505543966422 / 3.141592653589793)
    table = summarize.summary_table(results, "arcface")
    lines = table.splitlines()
    assert lines[2].startswith("| arcface | 2 | 85.00 ± 7.07 | – | – | – | – |")
    assert lines[2].endswith("| 200 |")  # median of 100 and 300 s
    # one comparison: Holm leaves p as it is
    assert lines[3].startswith("| x | 3 | 79.33 ± 8.33 | -1.00 ± 4.24 | 1 / 1 | 0.795 | 0.795 |")
    per_fold = summarize.per_fold_table(results).splitlines()
    assert per_fold[0] == "| loss | fold 0 | fold 1 | fold 2 |"
    assert per_fold[2] == "| arcface | 80.00 | 90.00 | – |"


def test_a_fold_run_twice_is_an_error(summarize, tmp_path):
    a = _write(tmp_path / "a.csv", [_row(3, "arcface", 0.8)])
    b = _write(tmp_path / "b.csv", [_row(3, "arcface", 0.81)])
    with pytest.raises(ValueError, match=r"b\.csv: loss 'arcface' fold 3 appears twice"):
        summarize.read_results([a, b])


def test_unknown_baseline_is_an_error(summarize, tmp_path):
    results = summarize.read_results([_write(tmp_path / "a.csv", [_row(0, "x", 0.8)])])
    with pytest.raises(
        ValueError, match="baseline must be one of the losses read, \\['x'\\]; got 'arcface'"
    ):
        summarize.summary_table(results, "arcface")


def test_holm_adjustment_by_hand(summarize):
    # sorted 0.01, 0.02, 0.04 (m = 3): 3·0.01 = 0.03, max(0.03, 2·0.02) = 0.04, max(0.04, 0.04)
    adjusted = summarize.holm({"a": 0.04, "b": 0.01, "c": 0.02, "d": float("nan")})
    assert adjusted["b"] == pytest.approx(0.03) and adjusted["c"] == pytest.approx(0.04)
    assert adjusted["a"] == pytest.approx(0.04) and adjusted["d"] != adjusted["d"]
    assert summarize.holm({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}


def test_labelled_files_pair_two_runs_of_one_loss(summarize, tmp_path, capsys):
    centre = _write(tmp_path / "c.csv", [_row(0, "arcface", 0.80), _row(1, "arcface", 0.82)])
    aligned = _write(tmp_path / "a.csv", [_row(0, "arcface", 0.85), _row(1, "arcface", 0.86)])
    results = summarize.read_results([centre, aligned], ["centre", "aligned"])
    assert list(results) == ["arcface (centre)", "arcface (aligned)"]
    diff = summarize.paired_difference(results["arcface (aligned)"], results["arcface (centre)"])
    assert diff["folds"] == 2 and diff["better"] == 2
    assert diff["mean"] == pytest.approx(0.045)
    summarize.main(["--baseline", "arcface (centre)", f"centre={centre}", f"aligned={aligned}"])
    assert "arcface (aligned)" in capsys.readouterr().out


def test_unlabelled_files_of_one_loss_still_clash(summarize, tmp_path):
    first = _write(tmp_path / "c.csv", [_row(0, "arcface", 0.80)])
    second = _write(tmp_path / "a.csv", [_row(0, "arcface", 0.85)])
    with pytest.raises(ValueError, match="appears twice"):
        summarize.read_results([first, second])
