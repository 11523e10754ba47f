"""target_and_nearest_angles against a per-sample loop with math.acos."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from marginface.evaluation import closed_set_accuracy, target_and_nearest_angles


def reference_angles(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, k: int):
    """One sample and one center at a time, in float64, with math.acos."""
    target, other = [], []
    classes = w.shape[0] // k
    for i in range(x.shape[0]):
        best = []
        for c in range(classes):
            cosines = []
            for j in range(c * k, (c + 1) * k):
                dot = sum(float(a) * float(b) for a, b in zip(x[i], w[j], strict=True))
                norm = math.sqrt(sum(float(a) ** 2 for a in x[i]))
                norm *= math.sqrt(sum(float(b) ** 2 for b in w[j]))
                cosines.append(dot / norm)
            best.append(max(cosines))
        own = int(y[i])
        target.append(math.acos(max(-1.0, min(1.0, best[own]))))
        other.append(min(math.acos(max(-1.0, min(1.0, b))) for c, b in enumerate(best) if c != own))
    return np.array(target), np.array(other)


@pytest.mark.parametrize("sub_centers", [1, 3])
def test_angles_match_a_per_sample_reference(sub_centers: int) -> None:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(12, 4, generator=generator) * 3  # not normalized
    w = torch.randn(5 * sub_centers, 4, generator=generator)
    y = torch.randint(0, 5, (12,), generator=generator)
    theta_y, theta_other = target_and_nearest_angles(x, y, w, sub_centers=sub_centers)
    expected_y, expected_other = reference_angles(x, y, w, sub_centers)
    np.testing.assert_allclose(theta_y, expected_y, atol=1e-6)
    np.testing.assert_allclose(theta_other, expected_other, atol=1e-6)
    assert theta_y.dtype == np.float64 and theta_y.shape == (12,)
    # correct exactly when the own center is nearer than every other one
    accuracy = closed_set_accuracy(x, y, w, sub_centers=sub_centers)
    assert np.mean(theta_y < theta_other) == pytest.approx(accuracy)


def test_angles_of_exact_centers_are_zero_and_right_angles() -> None:
    centers = np.eye(3)
    embeddings = np.array([[2.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    theta_y, theta_other = target_and_nearest_angles(embeddings, np.array([0, 2]), centers)
    np.testing.assert_allclose(theta_y, [0.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(theta_other, [math.pi / 2] * 2)


def test_angle_errors_name_the_argument() -> None:
    x = np.ones((2, 3))
    with pytest.raises(ValueError, match="at least 2 classes"):
        target_and_nearest_angles(x, np.array([0, 0]), np.ones((1, 3)))
    with pytest.raises(ValueError, match="labels must lie in"):
        target_and_nearest_angles(x, np.array([0, 4]), np.eye(3))
    with pytest.raises(ValueError, match="sub_centers"):
        target_and_nearest_angles(x, np.array([0, 1]), np.eye(3), sub_centers=2)
    with pytest.raises(TypeError, match="labels"):
        target_and_nearest_angles(x, np.array([0.0, 1.0]), np.eye(3))
