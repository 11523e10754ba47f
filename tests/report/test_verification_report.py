"""The face report's parts on metrics written by hand: the verification table in percent, the
columns and rows that have values, the coarse-grid note, the other metrics without empty rows."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from marginface.report import write_report
from marginface.report.verification import (
    other_metrics,
    verification_sections,
    verification_table,
)
from marginface.train.evaluation.evaluate import Evaluation, ScoredPairs

NAN = math.nan
BIN = {
    "lfw_accuracy": 0.99517,
    "lfw_accuracy_std": 0.00351,
    "lfw_threshold": 1.42,
    "lfw_xnorm": 22.5,
    "lfw_val@far=1e-03": 0.9803,
    "lfw_val_std": 0.0101,
    "lfw_far": 0.00093,
    "lfw_grid_too_coarse_folds": 0.0,
    "lfw_accuracy_midpoint": 0.9955,
    "lfw_accuracy_midpoint_std": 0.0030,
    "lfw_auc": 0.9991,
    "lfw_eer": 0.006,
    "lfw_tar@far=1e-01": 1.0,
    "lfw_tar@far=1e-02": 0.995,
    "lfw_tar@far=1e-03": NAN,
    "lfw_tar@far=1e-04": NAN,
    "accuracy": NAN,
}


def test_the_table_is_in_percent_with_std_and_leaves_out_empty_columns():
    rows, columns, shown = verification_table(BIN, {"lfw": 6000})
    assert columns == [
        "set", "pairs", "accuracy (%)", "VAL@FAR=1e-3 (%)", "TAR@FAR=1e-2 (%)", "AUC (%)",
        "EER (%)", "midpoint accuracy (%)",
    ]  # fmt: skip
    (row,) = rows
    assert row["accuracy (%)"] == "99.52 ± 0.35"
    assert row["VAL@FAR=1e-3 (%)"] == "98.03 ± 1.01"
    assert row["TAR@FAR=1e-2 (%)"] == "99.50"
    assert row["EER (%)"] == "0.60"
    assert row["midpoint accuracy (%)"] == "99.55 ± 0.30"
    assert {"lfw_accuracy", "lfw_val_std", "lfw_tar@far=1e-04"} <= shown


def test_test_pairs_and_a_set_without_values():
    metrics = {
        "accuracy": NAN,
        "verification_accuracy": 0.875,
        "verification_accuracy_std": 0.02,
        "auc": 0.93,
        "tar@far=1e-02": 0.4,
        "cfp_fp_accuracy_midpoint": NAN,  # a set measured nowhere: no row
        "precision_at_1": 0.8,
    }
    rows, columns, shown = verification_table(metrics)
    assert [row["set"] for row in rows] == ["test pairs"]
    assert rows[0]["accuracy (%)"] == "87.50 ± 2.00"
    assert "VAL@FAR=1e-3 (%)" not in columns and "pairs" not in columns
    rest = other_metrics(metrics, shown)
    assert rest == [{"metric": "precision_at_1", "value": 0.8}]  # no 'accuracy -' row


def test_the_report_says_when_the_grid_was_too_coarse(tmp_path):
    metrics = dict(BIN)
    metrics |= {"lfw_accuracy": 0.5, "lfw_accuracy_std": 0.0, "lfw_grid_too_coarse_folds": 10.0}
    same = np.arange(20) % 2 == 0
    pairs = {"lfw": ScoredPairs(np.linspace(0.99, 1.0, 20), same, {"insightface grid": 1.0})}
    evaluation = Evaluation(metrics, np.zeros((40, 8)), np.zeros(40, np.int64), pairs=pairs)
    first, last = verification_sections(evaluation, {})
    assert [section.title for section in first] == ["Verification"]
    html = write_report(tmp_path / "r.html", title="t", sections=[*first, last]).read_text()
    assert '<p class="note">lfw: insightface&#x27;s threshold grid' in html
    assert "in 10 of 10 folds" in html and "50.00% ± 0.00" in html
    assert "<td>lfw</td><td>20</td><td>50.00 ± 0.00</td>" in html
    assert "<td>lfw_xnorm</td><td>22.5000</td>" in html
    assert "grid_too_coarse" not in html


def test_an_open_set_run_reports_its_test_pairs_with_identities(tmp_path):
    """A run on open-set test data (identities unseen in training, sampled pairs): the table's
    'test pairs' row is the evaluation's own numbers, the histogram's threshold is the
    midpoint search's, and the PCA colours the test identities."""
    from marginface.data import load_dataset
    from marginface.data.base import DatasetBundle
    from marginface.report.verification import draw_verification_pictures
    from marginface.train import Trainer, evaluate_run
    from marginface.train.config import TrainConfig

    digits = load_dataset("digits", seed=0)
    train, test = digits.train, digits.test
    seen = train.labels < 5  # train on digits 0-4, test on 5-9: open set
    unseen = test.labels >= 5
    bundle = DatasetBundle(
        "digits",
        type(train)(train.images[seen], train.labels[seen], train.class_names[:5]),
        type(test)(test.images[unseen], test.labels[unseen], test.class_names),
        open_set=True,
    )
    config = TrainConfig(
        dataset="digits", epochs=1, batch_size=50, embedding_dim=8, threads=1, device="cpu"
    )
    Trainer(config, tmp_path / "run", bundle=bundle).fit()
    evaluation = evaluate_run(tmp_path / "run", device="cpu", bundle=bundle)
    scored = evaluation.pairs["test pairs"]
    assert scored.scores.shape == scored.same.shape == (int(evaluation.metrics["pairs"]),)
    assert list(scored.thresholds) == ["midpoint"]
    rows, _, _ = verification_table(evaluation.metrics, {"test pairs": scored.scores.size})
    (row,) = rows
    accuracy = evaluation.metrics["verification_accuracy"]
    std = evaluation.metrics["verification_accuracy_std"]
    assert row["accuracy (%)"] == f"{100 * accuracy:.2f} ± {100 * std:.2f}"
    images = draw_verification_pictures(evaluation, [], [], tmp_path / "plots")
    (pca,) = [caption for caption in images if "principal components" in caption]
    assert "coloured by identity" in pca
    assert (tmp_path / "plots" / "scores.png").is_file()


class _NearlyConstant(torch.nn.Module):
    """Embeddings ``1 + 1e-3 · (W x)``: every pair's squared distance far below 0.01, ordered
    by the images (so a finer threshold does better than one answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1.0 + 1e-3 * self.linear(x.flatten(1))


def test_training_logs_a_coarse_grid_beside_the_accuracy(caplog):
    from marginface.data import load_dataset
    from marginface.data.base import DatasetBundle, PairSet, VerificationSet
    from marginface.train.evaluation.evaluate import verification_set_results

    digits = load_dataset("digits", seed=0)
    test = digits.test
    labels = np.asarray(test.labels)
    first = np.arange(200) % len(labels)
    second = np.where(
        np.arange(200) % 2 == 0,
        [np.flatnonzero(labels == labels[a])[-1] for a in first],  # same digit
        (first + 1) % len(labels),
    )
    images = np.empty((400, *test.images.shape[1:]), dtype=np.uint8)
    images[0::2] = np.round(test.images[first] * 255).astype(np.uint8)
    images[1::2] = np.round(test.images[second] * 255).astype(np.uint8)
    same = labels[first] == labels[second]
    pairs = PairSet(np.arange(400).reshape(200, 2), same, np.arange(200) * 10 // 200)
    bundle = DatasetBundle(
        "digits", digits.train, test, verification={"tiny": VerificationSet(images, pairs)}
    )
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger="marginface"):
        results = verification_set_results(_NearlyConstant(), bundle, batch_size=100, device="cpu")
    metrics = results["tiny"][1]
    assert metrics.distances.max() < 0.01 and metrics.coarse_folds > 0
    (line,) = [r.getMessage() for r in caplog.records if "too coarse" in r.getMessage()]
    assert line.startswith("[tiny] insightface's 0.01 threshold grid is too coarse")
    assert f"({metrics.coarse_folds} of 10 folds" in line
    assert f"its accuracy {metrics.accuracy:.5f} measures the grid" in line


def test_counts_are_shown_as_integers_and_rates_as_decimals():
    """An LFW face run's ``pairs`` (300) and ``num_queries`` (535), IJB's probe and gallery
    counts: integers, not ``300.0000``; a rate that happens to be whole stays a decimal."""
    from marginface.report import format_table

    metrics = {
        "pairs": 300.0,
        "num_queries": 535.0,
        "ijbc_G1_probes_mated": 35.0,
        "ijbc_G1_probes_non_mated": 88.0,
        "ijbc_G1_gallery": 1772.0,
        "precision_at_1": 1.0,
        "map_at_r": 0.25,
    }
    rows = other_metrics(metrics, set())
    values = {row["metric"]: row["value"] for row in rows}
    for key in ("pairs", "num_queries", "ijbc_G1_probes_mated", "ijbc_G1_gallery"):
        assert type(values[key]) is int and values[key] == metrics[key]
    assert type(values["precision_at_1"]) is float
    cells = dict(line.split() for line in format_table(rows, ("metric", "value")).splitlines()[2:])
    assert cells["pairs"] == "300" and cells["num_queries"] == "535"
    assert cells["ijbc_G1_probes_mated"] == "35" and cells["ijbc_G1_gallery"] == "1772"
    assert cells["precision_at_1"] == "1.0000" and cells["map_at_r"] == "0.2500"
