"""``marginface evaluate`` on a MagFace run: the error-versus-reject curve of the test pairs with
the feature magnitude as quality, in evaluation.json, erc.png and evaluation.html, equal to the
curve computed here from the run's own embeddings; other runs have none."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from marginface.cli import main
from marginface.report.pictures import draw_run_pictures
from marginface.train import (
    evaluate_run,
    extract_embeddings,
    load_bundle,
    load_run,
    verification_pairs,
)

TINY = ["--limit", "120", "--epochs", "1", "--batch-size", "40", "--threads", "1"]


def _curve_by_hand(run_dir, fractions):
    """Embeddings of the test set, pairs, quality = min of the two norms, the threshold of
    best accuracy on all pairs (brute force, lowest on ties), accuracy of the kept pairs."""
    run = load_run(run_dir)
    bundle = load_bundle(run.config)
    x = extract_embeddings(run.model, bundle.test.images, flip=run.config.flip).double().numpy()
    pairs = verification_pairs(bundle)
    norms = np.linalg.norm(x, axis=1)
    unit = x / norms[:, None]
    scores = [float(unit[a] @ unit[b]) for a, b in pairs.index]
    quality = [min(norms[a], norms[b]) for a, b in pairs.index]
    same = pairs.same.tolist()

    def accuracy(kept, t):
        return sum((scores[i] >= t) == same[i] for i in kept) / len(kept)

    everything = range(len(scores))
    candidates = [*sorted(set(scores)), math.inf]
    best = max(candidates, key=lambda t: (accuracy(everything, t), -candidates.index(t)))
    order = sorted(everything, key=lambda i: (quality[i], i))
    return {r: accuracy(order[math.floor(r * len(scores) + 1e-9) :], best) for r in fractions}


def test_evaluate_magface_reports_the_error_versus_reject_curve(tmp_path, capsys):
    run = tmp_path / "mag"
    assert main(["--quiet", "train", *TINY, "--loss", "magface", "--out", str(run)]) == 0
    assert main(["evaluate", str(run), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads((run / "evaluation.json").read_text())
    fractions = (0.1, 0.2, 0.3, 0.5)
    expected = _curve_by_hand(run, fractions)
    for r in fractions:
        key = f"erc_accuracy@reject={r:.2f}"
        assert metrics[key] == pytest.approx(expected[r], abs=1e-9), key
        assert key in printed
    assert (run / "erc.png").stat().st_size > 1000
    page = (run / "evaluation.html").read_text()
    assert "Error versus reject" in page and "data:image/png;base64," in page
    # compare/demo reports draw it too
    loaded = load_run(run)
    evaluation = evaluate_run(run, device="cpu")
    images = draw_run_pictures({"magface": (loaded.history, evaluation, loaded.loss)}, tmp_path)
    assert images["Error versus reject (feature magnitude as quality)"].stat().st_size > 1000


def test_other_losses_have_no_curve(tmp_path):
    run = tmp_path / "arc"
    assert main(["--quiet", "train", *TINY, "--loss", "arcface", "--out", str(run)]) == 0
    assert main(["--quiet", "evaluate", str(run), "--device", "cpu"]) == 0
    metrics = json.loads((run / "evaluation.json").read_text())
    assert not any(key.startswith("erc_") for key in metrics)
    assert not (run / "erc.png").exists() and not (run / "evaluation.html").exists()
