"""``marginface outliers`` and ``marginface train --drop-non-dominant`` end to end on a tiny
sub-center run (digits), checked against the angles and dominance computed here by hand."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from marginface.cli import main
from marginface.train import extract_embeddings, load_bundle, load_checkpoint, load_run

from .._subcenters_by_hand import dominant_and_angles

K = 3
TINY = ["--limit", "120", "--epochs", "2", "--batch-size", "40", "--threads", "1"]


@pytest.fixture(scope="module")
def subcenter_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("subcenter") / "run"
    args = ["--quiet", "train", *TINY, "--loss", "subcenter-arcface", "--out", str(run)]
    assert main([*args, "--loss-option", f"sub_centers={K}", "--embedding-dim", "8"]) == 0
    return run


def _by_hand(run_dir: Path):
    """Training embeddings, then per sample: nearest own sub-center, per class: the most
    frequent one, and each sample's angle (degrees) to its class's dominant sub-center."""
    run = load_run(run_dir)
    train = load_bundle(run.config).train
    x = extract_embeddings(run.model, train.images).double().numpy()
    labels = np.asarray(train.labels)
    weight = run.loss.weight.detach().double().numpy()  # (C·K, D)
    dominant, angles = dominant_and_angles(x, labels, weight, K)
    return labels, dominant, angles, weight


def test_outliers_csv_lists_the_samples_beyond_the_threshold(subcenter_run, tmp_path, capsys):
    labels, dominant, angles, _ = _by_hand(subcenter_run)
    threshold = float(np.percentile(angles, 80))  # a threshold that flags ~20% of this tiny run
    out = tmp_path / "flagged.csv"
    code = main(["outliers", str(subcenter_run), "--threshold", str(threshold), "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    with out.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    expected = [i for i, angle in enumerate(angles) if angle > threshold]
    assert 0 < len(expected) < len(angles)
    assert [int(row["index"]) for row in rows] == expected
    for row in rows:
        i = int(row["index"])
        assert int(row["label"]) == labels[i]
        assert float(row["angle_degrees"]) == pytest.approx(angles[i], abs=2e-3)
        assert int(row["dominant_sub_center"]) == dominant[labels[i]]
        assert row["class_name"] != ""
    assert f"{len(expected)} of {len(angles)} training samples" in printed
    # the default: 75 degrees, next to the run
    assert main(["--quiet", "outliers", str(subcenter_run)]) == 0
    default_rows = list(csv.DictReader((subcenter_run / "outliers.csv").open(newline="")))
    assert [int(r["index"]) for r in default_rows] == [i for i, a in enumerate(angles) if a > 75]


def test_drop_non_dominant_continues_with_one_center_per_class(subcenter_run, tmp_path):
    _, dominant, _, weight = _by_hand(subcenter_run)
    out = tmp_path / "k1"
    # lr 1e-12: the new run's weights stay (to 1e-9) where --drop-non-dominant put them
    args = ["--quiet", "train", "--drop-non-dominant", str(subcenter_run), "--out", str(out)]
    assert main([*args, "--epochs", "1", "--lr", "1e-12"]) == 0
    state = load_checkpoint(out / "checkpoint.pt")
    assert state["config"]["loss_options"]["sub_centers"] == 1
    assert state["config"]["epochs"] == 1
    kept = np.stack([weight[c * K + k] for c, k in enumerate(dominant)])
    np.testing.assert_allclose(state["loss"]["weight"].double().numpy(), kept, atol=1e-7)
    source = load_checkpoint(subcenter_run / "checkpoint.pt")["model"]
    for key, value in state["model"].items():
        if value.is_floating_point() and "running" not in key:
            torch.testing.assert_close(value, source[key], rtol=0, atol=1e-7)
    assert load_run(out).loss.sub_centers == 1  # the new run loads and evaluates as K = 1
    assert main(["--quiet", "evaluate", str(out), "--device", "cpu"]) == 0


def test_drop_non_dominant_errors(subcenter_run, tmp_path, capsys):
    args = ["train", "--drop-non-dominant", str(subcenter_run), "--out", str(tmp_path / "x")]
    assert main([*args, "--resume"]) == 2
    assert "cannot --resume" in capsys.readouterr().err
    k1 = tmp_path / "plain"
    assert (
        main(["--quiet", "train", *TINY, "--epochs", "1", "--loss", "arcface", "--out", str(k1)])
        == 0
    )
    assert main(["train", "--drop-non-dominant", str(k1), "--out", str(tmp_path / "y")]) == 2
    assert "one center per class already" in capsys.readouterr().err


def test_drop_outliers_leaves_the_flagged_samples_out_of_the_new_run(subcenter_run, tmp_path):
    """``--drop-outliers DEGREES``: the samples farther than DEGREES from their class's
    dominant sub-center (by hand) become the new run's ``exclude``, and the new run trains on
    the others only."""
    labels, _, angles, _ = _by_hand(subcenter_run)
    threshold = float(np.percentile(angles, 80))
    flagged = [i for i, angle in enumerate(angles) if angle > threshold]
    assert 0 < len(flagged) < len(angles)
    out = tmp_path / "clean"
    args = ["--quiet", "train", "--drop-non-dominant", str(subcenter_run), "--out", str(out)]
    assert main([*args, "--epochs", "1", "--drop-outliers", str(threshold)]) == 0
    config = load_run(out).config
    assert config.exclude == flagged
    train = load_bundle(config).train
    assert len(train) == len(labels) - len(flagged)
    kept = [i for i in range(len(labels)) if i not in set(flagged)]
    np.testing.assert_array_equal(np.asarray(train.labels), labels[kept])
    full = load_bundle(config, exclude=False).train
    np.testing.assert_array_equal(train.images, full.images[kept])


def test_drop_outliers_needs_drop_non_dominant(tmp_path, capsys):
    assert main(["train", *TINY, "--drop-outliers", "--out", str(tmp_path / "x")]) == 2
    assert "--drop-outliers goes with --drop-non-dominant" in capsys.readouterr().err


def test_drop_outliers_that_flags_every_sample_names_the_option(subcenter_run, tmp_path, capsys):
    """``--drop-outliers 0`` flags every training sample (each is more than 0° from its class's
    dominant sub-center): the error names the option and its value, not an empty dataset, and
    no run is written."""
    out = tmp_path / "empty"
    args = ["train", "--drop-non-dominant", str(subcenter_run), "--out", str(out)]
    assert main([*args, "--epochs", "1", "--drop-outliers", "0"]) == 2
    err = capsys.readouterr().err
    assert "--drop-outliers 0" in err and "every one of the 120 training samples" in err, err
    assert "has no training images" not in err
    assert not (out / "checkpoint.pt").exists()
