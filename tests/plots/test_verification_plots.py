"""The pictures of a verification run: accuracy curves per set (in %), score histograms with
labelled thresholds, the PCA projection coloured by identity."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.plots import (
    TEST_PAIRS,
    plot_pca_projection,
    plot_score_histograms,
    plot_verification_curves,
    verification_set_names,
)

HISTORY = [
    {"epoch": 1, "loss": 3.0, "lfw_accuracy": 0.80, "lfw_accuracy_std": 0.02, "accuracy": ""},
    {"epoch": 2, "loss": 2.0, "lfw_accuracy": 0.90, "lfw_accuracy_std": 0.01, "accuracy": ""},
]
STEPS = [
    {"step": 50, "lfw_accuracy": 0.7, "lfw_accuracy_std": 0.03},
    {"step": 100, "lfw_accuracy": 0.85, "lfw_accuracy_std": 0.02},
]


def test_set_names_need_the_accuracy_and_its_std():
    keys = ["accuracy", "lfw_accuracy", "lfw_accuracy_std", "cfp_fp_accuracy", "erc_accuracy"]
    keys += ["verification_accuracy", "verification_accuracy_std", "erc_accuracy_x"]
    assert verification_set_names(keys) == ["lfw", TEST_PAIRS]


def test_curves_per_epoch_and_per_step_in_percent():
    figure = plot_verification_curves(HISTORY, STEPS)
    epoch_ax, step_ax = figure.axes
    (line,) = epoch_ax.lines
    assert line.get_label() == "lfw"
    np.testing.assert_allclose(line.get_xdata(), [1, 2])
    np.testing.assert_allclose(line.get_ydata(), [80.0, 90.0])
    np.testing.assert_allclose(step_ax.lines[0].get_xdata(), [50, 100])
    assert step_ax.get_title() == "Verification accuracy, every 50 steps"
    assert len(plot_verification_curves(HISTORY).axes) == 1
    with pytest.raises(ValueError, match="no verification accuracy in the log"):
        plot_verification_curves([{"epoch": 1, "loss": 1.0, "accuracy": 0.5}])


def test_histograms_draw_both_kinds_and_each_threshold():
    rng = np.random.default_rng(0)
    same = np.arange(100) % 2 == 0
    scores = np.where(same, rng.uniform(0.4, 0.9, 100), rng.uniform(-0.2, 0.5, 100))
    thresholds = {"insightface grid": 0.45, "midpoint": 0.44}
    figure = plot_score_histograms({"lfw": (scores, same, thresholds), "agedb": (scores, same, {})})
    ax = figure.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == [
        "genuine (50)",
        "impostor (50)",
        "insightface grid threshold 0.4500",
        "midpoint threshold 0.4400",
    ]
    assert [line.get_xdata()[0] for line in ax.lines] == [0.45, 0.44]
    assert sum(patch.get_height() > 0 for patch in ax.patches) > 10
    with pytest.raises(TypeError, match=r"sets\['lfw'\] must be a \(scores, same, "):
        plot_score_histograms({"lfw": (scores, same, 0.5)})
    with pytest.raises(ValueError, match="sets must be a non-empty dict"):
        plot_score_histograms({})


def test_pca_colours_the_largest_identities_and_greys_the_rest():
    rng = np.random.default_rng(1)
    centers = rng.standard_normal((4, 16))
    labels = np.repeat([0, 1, 2, 3], [10, 8, 6, 1])  # identity 3 has one image: grey
    embeddings = centers[labels] + 0.05 * rng.standard_normal((labels.size, 16))
    figure = plot_pca_projection(embeddings, labels, max_identities=2)
    ax = figure.axes[0]
    names = ax.get_legend_handles_labels()[1]
    assert names == ["others", "0", "1"]
    grey, first, second = ax.collections
    assert len(grey.get_offsets()) == 7 and len(first.get_offsets()) == 10
    assert len(second.get_offsets()) == 8
    assert "% of the variance" in ax.get_xlabel()
    joined = plot_pca_projection(embeddings, labels, join=True, legend_title="genuine pair")
    assert len(joined.axes[0].lines) == 3  # one line per coloured identity
    assert joined.axes[0].get_legend().get_title().get_text() == "genuine pair"
    with pytest.raises(ValueError, match="max_identities must be >= 1, got 0"):
        plot_pca_projection(embeddings, labels, max_identities=0)
    with pytest.raises(TypeError, match="max_identities must be an int"):
        plot_pca_projection(embeddings, labels, max_identities=2.0)
