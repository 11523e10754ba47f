"""insightface's 0.01 threshold grid when every pair distance lies below one step: the rule's
0.5000 is flagged (``grid_too_coarse_folds``) and :func:`grid_note` says so beside the midpoint
search's accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.data.base import PairSet
from marginface.evaluation import (
    bin_set_metrics,
    bin_verification_metrics,
    grid_note,
    grid_notes,
)


def _pairs_at_angles(angles: np.ndarray, dim: int = 8, seed: int = 0) -> np.ndarray:
    """``float64[2P, D]``: pair ``p`` is a random unit vector and the same turned by
    ``angles[p]`` radians in a random plane (squared distance ``2 - 2 cos angle``)."""
    rng = np.random.default_rng(seed)
    rows = []
    for angle in angles:
        a = rng.standard_normal(dim)
        a /= np.linalg.norm(a)
        u = rng.standard_normal(dim)
        u -= (u @ a) * a
        u /= np.linalg.norm(u)
        rows += [a, np.cos(angle) * a + np.sin(angle) * u]
    return np.asarray(rows)


def _tiny_distance_set(num_pairs: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Genuine pairs 0.01-0.03 rad apart, impostors 0.05-0.09 rad (every squared distance
    below 0.0081 < 0.01): perfectly ordered, yet inside one grid step."""
    rng = np.random.default_rng(1)
    same = np.arange(num_pairs) % 2 == 0
    angles = np.where(same, rng.uniform(0.01, 0.03, num_pairs), rng.uniform(0.05, 0.09, num_pairs))
    return _pairs_at_angles(angles), same


def test_every_distance_below_one_grid_step_is_flagged_in_every_fold():
    embeddings, same = _tiny_distance_set()
    metrics = bin_verification_metrics(embeddings, same)
    assert metrics.distances.max() < 0.01
    # the grid's own numbers: threshold 0 accepts nothing, 0.01 everything
    assert metrics.accuracy == 0.5 and metrics.accuracy_std == 0.0 and metrics.threshold == 0.0
    assert metrics.coarse_folds == 10 and metrics.grid_too_coarse
    assert metrics.as_dict()["grid_too_coarse_folds"] == 10.0


def test_the_note_names_the_grid_and_the_midpoint_accuracy():
    embeddings, same = _tiny_distance_set()
    index = np.arange(embeddings.shape[0]).reshape(-1, 2)
    fold = np.repeat(np.arange(10), same.shape[0] // 10)
    values, _ = bin_set_metrics(embeddings, None, PairSet(index, same, fold))
    assert values["grid_too_coarse_folds"] == 10.0
    assert values["accuracy_midpoint"] == 1.0  # the pairs are perfectly ordered
    note = grid_note("lfw", values)
    assert note is not None
    assert "lfw: insightface's threshold grid (steps of 0.01" in note
    assert "in 10 of 10 folds" in note
    assert "50.00% ± 0.00" in note  # the grid's accuracy, named as the grid's
    assert "100.00% ± 0.00 (lfw_accuracy_midpoint)" in note


def test_a_set_the_grid_can_split_gets_no_note():
    rng = np.random.default_rng(2)
    same = np.arange(200) % 2 == 0
    # genuine 0.2-0.6 rad, impostor 0.9-1.4 rad: squared distances 0.04 .. 1.3, overlap-free
    angles = np.where(same, rng.uniform(0.2, 0.6, 200), rng.uniform(0.9, 1.4, 200))
    metrics = bin_verification_metrics(_pairs_at_angles(angles), same)
    assert metrics.coarse_folds == 0 and not metrics.grid_too_coarse
    assert metrics.accuracy > 0.95
    assert grid_note("lfw", metrics.as_dict()) is None


def test_distances_no_threshold_can_split_are_not_blamed_on_the_grid():
    # every pair at the same distance (identical embeddings): no threshold of any fineness
    # separates them, so the constant answer is the truth, not the grid's fault
    same = np.arange(200) % 2 == 0
    metrics = bin_verification_metrics(np.ones((400, 3)), same)
    assert metrics.distances.max() == 0.0
    assert metrics.accuracy == 0.5 and metrics.coarse_folds == 0


@pytest.mark.parametrize("folds", [0.0, float("nan")])
def test_no_note_without_coarse_folds(folds):
    assert grid_note("lfw", {"grid_too_coarse_folds": folds, "accuracy": 0.5}) is None
    assert grid_note("lfw", {"accuracy": 0.5}) is None


def test_grid_notes_finds_each_flagged_set_among_prefixed_metrics():
    embeddings, same = _tiny_distance_set()
    index = np.arange(embeddings.shape[0]).reshape(-1, 2)
    fold = np.repeat(np.arange(10), same.shape[0] // 10)
    values, _ = bin_set_metrics(embeddings, None, PairSet(index, same, fold))
    metrics = {"accuracy": float("nan")}
    metrics |= {f"cfp_fp_{k}": v for k, v in values.items()}
    metrics |= {"lfw_accuracy": 0.99, "lfw_grid_too_coarse_folds": 0.0}
    notes = grid_notes(metrics)
    assert len(notes) == 1 and notes[0].startswith("cfp_fp: insightface's threshold grid")
    assert "(cfp_fp_accuracy_midpoint)" in notes[0]
