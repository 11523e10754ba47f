"""The error-versus-reject figure: one line per curve, error in percent."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.evaluation import error_versus_reject
from marginface.plots import plot_error_versus_reject, save_figure


def test_one_line_per_curve_with_the_error_in_percent(tmp_path):
    rng = np.random.default_rng(0)
    same = rng.random(100) < 0.5
    scores = np.where(same, 0.6, 0.2) + rng.normal(0, 0.3, 100)
    curves = {
        "magface": error_versus_reject(scores, same, rng.random(100)),
        "other": error_versus_reject(scores, same, -np.abs(scores - 0.4)),
    }
    figure = plot_error_versus_reject(curves)
    (ax,) = figure.axes
    assert [line.get_label() for line in ax.lines] == ["magface", "other"]
    for line, curve in zip(ax.lines, curves.values(), strict=True):
        np.testing.assert_allclose(line.get_xdata(), curve.fractions)
        np.testing.assert_allclose(line.get_ydata(), 100 * (1 - curve.accuracy))
    assert save_figure(figure, tmp_path / "erc.png").stat().st_size > 1000


def test_bad_curves_are_errors():
    with pytest.raises(ValueError, match="non-empty dict"):
        plot_error_versus_reject({})
    with pytest.raises(TypeError, match=r"curves\['x'\] must be an ErrorVersusReject"):
        plot_error_versus_reject({"x": (np.zeros(3), np.zeros(3))})
