"""Summarise per-fold LFW results of ``bench_verification.py`` into one table per loss.

Reads any number of ``verification_lfw_<tag>.csv`` files (one row per fold and loss, as
``bench_verification.py`` writes them), keeps the rows with ``status == "ok"`` and prints two
markdown tables:

1. per loss: verification accuracy as mean ± standard deviation *over the test folds* (the LFW
   protocol's figure), the paired difference to a baseline loss (mean ± std over the folds both
   ran, folds better / worse, the two-sided paired t-test p-value and its Holm adjustment over
   all the losses compared with the baseline), the means of AUC, EER,
   TAR@FAR=1e-2, precision@1 and MAP@R, and the median training seconds per model;
2. per loss and fold: the accuracy (mean over the fold's 10 threshold sub-folds).

A loss that ran on a different set of folds than the baseline is compared on the folds both
ran. Two rows for the same fold and loss are an error (a fold was run twice).

Usage (from the repository root)::

    python benchmarks/summarize_verification.py --baseline arcface \\
        benchmarks/results/verification_lfw_issue25_fold*.csv
    python benchmarks/summarize_verification.py --baseline "arcface (centre)" \\
        centre=benchmarks/results/verification_lfw_centre.csv \\
        aligned=benchmarks/results/verification_lfw_aligned.csv
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

MEAN_COLUMNS = ("auc", "eer", "tar@far=1e-02", "precision_at_1", "map_at_r")


def read_results(
    paths: list[Path], labels: list[str | None] | None = None
) -> dict[str, dict[int, dict[str, Any]]]:
    """``{loss: {fold: row}}`` from the CSV files, rows with ``status == "ok"`` only, losses in
    the order first seen. ``labels[i]`` (when not None) names every row of ``paths[i]`` as
    ``"<loss> (<label>)"``, so two runs of one loss (e.g. two image framings) pair up.
    Raises ``ValueError`` naming the file for a fold and loss seen twice."""
    results: dict[str, dict[int, dict[str, Any]]] = {}
    labels = labels if labels is not None else [None] * len(paths)
    for path, label in zip(paths, labels, strict=True):
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row.get("status") != "ok":
                    continue
                loss, fold = row["loss"], int(row["fold"])
                if label is not None:
                    loss = f"{loss} ({label})"
                folds = results.setdefault(loss, {})
                if fold in folds:
                    raise ValueError(f"{path}: loss {loss!r} fold {fold} appears twice")
                folds[fold] = row
    return results


def _float(row: dict[str, Any], key: str) -> float:
    value = row.get(key)
    return float(value) if value not in (None, "") else math.nan


def paired_difference(
    mine: dict[int, dict[str, Any]], baseline: dict[int, dict[str, Any]]
) -> dict[str, float]:
    """Accuracy of ``mine`` minus the baseline's on the folds both ran: mean and std (ddof 1)
    of the per-fold differences, how many folds are better / worse, and the two-sided paired
    t-test p-value (NaN for fewer than 2 folds or identical accuracies)."""
    folds = sorted(set(mine) & set(baseline))
    diffs = np.asarray(
        [
            _float(mine[k], "verification_accuracy") - _float(baseline[k], "verification_accuracy")
            for k in folds
        ]
    )
    if len(diffs) == 0:
        return {
            "folds": 0,
            "mean": math.nan,
            "std": math.nan,
            "better": 0,
            "worse": 0,
            "p": math.nan,
        }
    p = math.nan
    if len(diffs) >= 2 and np.ptp(diffs) > 0:
        p = float(stats.ttest_1samp(diffs, 0.0).pvalue)
    return {
        "folds": len(diffs),
        "mean": float(diffs.mean()),
        "std": float(diffs.std(ddof=1)) if len(diffs) >= 2 else math.nan,
        "better": int((diffs > 1e-12).sum()),
        "worse": int((diffs < -1e-12).sum()),
        "p": p,
    }


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of ``p_values`` (name → p) for the family of all of them
    (NaN entries left out of the family and returned as NaN): with the ``m`` p-values sorted,
    ``p̃_(i) = max_{j≤i} min(1, (m - j + 1)·p_(j))``."""
    finite = sorted((p, name) for name, p in p_values.items() if math.isfinite(p))
    adjusted = {name: math.nan for name in p_values}
    running = 0.0
    for rank, (p, name) in enumerate(finite):
        running = max(running, min(1.0, (len(finite) - rank) * p))
        adjusted[name] = running
    return adjusted


def _pct(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{100 * value:.2f}"


def summary_table(results: dict[str, dict[int, dict[str, Any]]], baseline: str) -> str:
    """The per-loss table (see the module docstring); ``baseline`` must be one of the losses."""
    if baseline not in results:
        raise ValueError(
            f"baseline must be one of the losses read, {sorted(results)}; got {baseline!r}"
        )
    header = (
        f"| loss | folds | acc. (%) mean ± std over folds | Δ acc. vs {baseline} (points) | "
        "folds better / worse | paired t p | Holm p | AUC | EER | TAR@FAR=1e-2 | P@1 | MAP@R | "
        "median s/model |"
    )
    lines = [header, "|" + "|".join(["---"] * (header.count("|") - 1)) + "|"]
    differences = {
        loss: paired_difference(folds, results[baseline])
        for loss, folds in results.items()
        if loss != baseline
    }
    adjusted = holm({loss: diff["p"] for loss, diff in differences.items()})

    def p_text(p: float) -> str:
        return "–" if not math.isfinite(p) else f"{p:.3f}"

    for loss, folds in results.items():
        accs = np.asarray([_float(row, "verification_accuracy") for row in folds.values()])
        spread = 100 * accs.std(ddof=1) if len(accs) >= 2 else math.nan
        if loss == baseline:
            delta, record, p_raw, p_holm = "–", "–", "–", "–"
        else:
            diff = differences[loss]
            delta = f"{100 * diff['mean']:+.2f} ± {_pct(diff['std'])}"
            record = f"{diff['better']} / {diff['worse']}"
            p_raw, p_holm = p_text(diff["p"]), p_text(adjusted[loss])
        means = [np.nanmean([_float(row, key) for row in folds.values()]) for key in MEAN_COLUMNS]
        seconds = np.median([_float(row, "train_seconds") for row in folds.values()])
        cells = [
            loss,
            str(len(folds)),
            f"{_pct(accs.mean())} ± {'–' if not math.isfinite(spread) else f'{spread:.2f}'}",
            delta,
            record,
            p_raw,
            p_holm,
            *(f"{value:.4f}" for value in means),
            f"{seconds:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_fold_table(results: dict[str, dict[int, dict[str, Any]]]) -> str:
    """Accuracy (%) per loss (rows) and test fold (columns); "–" where a fold did not run."""
    folds = sorted({fold for by_fold in results.values() for fold in by_fold})
    header = "| loss | " + " | ".join(f"fold {k}" for k in folds) + " |"
    lines = [header, "|" + "|".join(["---"] * (len(folds) + 1)) + "|"]
    for loss, by_fold in results.items():
        cells = [
            _pct(_float(by_fold[k], "verification_accuracy")) if k in by_fold else "–"
            for k in folds
        ]
        lines.append(f"| {loss} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "csv",
        nargs="+",
        help="bench_verification.py result files; LABEL=FILE names its rows 'LOSS (LABEL)'",
    )
    parser.add_argument(
        "--baseline",
        default="arcface",
        help="the loss the others are paired with ('LOSS (LABEL)' for a labelled file)",
    )
    args = parser.parse_args(argv)
    labels: list[str | None] = []
    paths: list[Path] = []
    for item in args.csv:
        label, sep, path = item.partition("=")
        labels.append(label if sep else None)
        paths.append(Path(path if sep else item))
    results = read_results(paths, labels)
    print(summary_table(results, args.baseline))
    print()
    print(per_fold_table(results))


if __name__ == "__main__":
    main()
