"""sphere_figure: a valid plotly figure with every sample on the unit sphere, one trace per
class, the class centers, and hover angles that match an independent computation; and the
angle-distribution figure's histograms."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from marginface.plots import plot_angle_distributions, sphere_figure

go = pytest.importorskip("plotly.graph_objects")


def clusters(n: int, classes: int = 4, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, 3, generator=generator)
    labels = torch.randint(0, classes, (n,), generator=generator)
    embeddings = centers[labels] * 4 + torch.randn(n, 3, generator=generator)
    return embeddings, labels, centers


def independent_angles(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor):
    """Degrees to the own center and to the nearest other center, in float64 torch."""
    cosine = F.normalize(x.double(), dim=1) @ F.normalize(w.double(), dim=1).T  # (N, C)
    angles = torch.rad2deg(torch.acos(cosine.clamp(-1, 1)))
    own = angles.gather(1, y[:, None]).squeeze(1)
    others = angles.scatter(1, y[:, None], float("inf")).min(dim=1).values
    return own.numpy(), others.numpy()


def point_traces(figure: dict) -> list[dict]:
    return [t for t in figure["data"] if t["type"] == "scatter3d" and t["name"] != "class centers"]


def test_sphere_figure_is_valid_plotly_with_classes_centers_and_hover_angles() -> None:
    x, y, w = clusters(60)
    figure = sphere_figure(x, y, w, title="arcface")
    go.Figure(figure)  # raises on any property plotly does not know
    json.dumps(figure, allow_nan=False)  # plain JSON values
    traces = point_traces(figure)
    assert [t["name"] for t in traces] == [f"class {c}" for c in sorted(set(y.tolist()))]
    assert sum(len(t["x"]) for t in traces) == 60
    own, nearest = independent_angles(x, y, w)
    for trace in traces:
        points = np.array([trace["x"], trace["y"], trace["z"]]).T  # (n_c, 3)
        np.testing.assert_allclose(np.linalg.norm(points, axis=1), 1.0, atol=1e-3)
        c = int(trace["name"].split()[1])
        hover = np.array(trace["customdata"])  # (n_c, 2) degrees
        np.testing.assert_allclose(hover[:, 0], own[(y == c).numpy()], atol=0.006)
        np.testing.assert_allclose(hover[:, 1], nearest[(y == c).numpy()], atol=0.006)
        assert trace["hovertemplate"].startswith(f"class {c}<br>θ to its center")
        assert "customdata[1]" in trace["hovertemplate"]
    (centers,) = [t for t in figure["data"] if t["name"] == "class centers"]
    expected = F.normalize(w, dim=1).numpy()
    np.testing.assert_allclose(
        np.array([centers["x"], centers["y"], centers["z"]]).T, expected, atol=1e-4
    )
    assert centers["text"] == ["0", "1", "2", "3"] and centers["marker"]["symbol"] == "diamond"
    assert figure["layout"]["title"]["text"] == "arcface"


def test_sub_centers_are_all_drawn_and_the_nearest_one_counts() -> None:
    x, y, _ = clusters(30, classes=3)
    w = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))  # 3 classes × 2
    figure = sphere_figure(x, y, w, sub_centers=2)
    (centers,) = [t for t in figure["data"] if t["name"] == "class centers"]
    assert centers["text"] == ["0", "0", "1", "1", "2", "2"]
    pooled = torch.stack([w[0::2], w[1::2]])  # (2, C, 3)
    cosine = F.normalize(x.double(), dim=1) @ F.normalize(pooled.double(), dim=2).transpose(1, 2)
    own = torch.rad2deg(torch.acos(cosine.max(dim=0).values.gather(1, y[:, None]).squeeze(1)))
    hover = {
        int(t["name"].split()[1]): np.array(t["customdata"])[:, 0] for t in point_traces(figure)
    }
    for c, values in hover.items():
        np.testing.assert_allclose(values, own[(y == c).numpy()].numpy(), atol=0.006)


def test_without_centers_the_hover_gives_the_class_mean_direction() -> None:
    x, y, _ = clusters(40)
    figure = sphere_figure(x, y)
    go.Figure(figure)
    assert not [t for t in figure["data"] if t["name"] == "class centers"]
    for trace in point_traces(figure):
        c = int(trace["name"].split()[1])
        rows = F.normalize(x[y == c].double(), dim=1)
        mean = F.normalize(rows.sum(0), dim=0)
        expected = torch.rad2deg(torch.acos((rows @ mean).clamp(-1, 1))).numpy()
        np.testing.assert_allclose(np.array(trace["customdata"])[:, 0], expected, atol=0.006)
        assert "mean direction" in trace["hovertemplate"]


def test_large_sets_are_subsampled_and_the_title_says_so() -> None:
    x, y, w = clusters(500)
    figure = sphere_figure(x, y, w, title="t", max_points=100)
    assert sum(len(t["x"]) for t in point_traces(figure)) == 100
    assert figure["layout"]["title"]["text"] == "t (100 of 500 samples shown)"


def test_sphere_figure_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="3 columns"):
        sphere_figure(np.ones((4, 2)), np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match="max_points"):
        sphere_figure(np.ones((4, 3)), np.zeros(4, dtype=int), max_points=0)
    with pytest.raises(ValueError, match="labels must lie in"):
        sphere_figure(np.ones((2, 3)), np.array([0, 5]), np.eye(3))


def test_angle_figure_histograms_count_the_independently_computed_angles() -> None:
    from marginface.evaluation import target_and_nearest_angles

    x, y, w = clusters(80)
    panels = {
        "arcface": target_and_nearest_angles(x, y, w),
        "cosface": (np.full(5, np.pi / 4), np.full(5, np.pi / 2)),
    }
    figure = plot_angle_distributions(panels, bins=18)
    own, nearest = independent_angles(x, y, w)
    edges = np.linspace(0, 180, 19)
    ax = figure.axes[0]
    heights = [p.get_height() for p in ax.patches]  # the θ_y bars, then the others
    np.testing.assert_array_equal(heights[:18], np.histogram(own, edges)[0])
    np.testing.assert_array_equal(heights[18:], np.histogram(nearest, edges)[0])
    correct = np.mean(own < nearest)
    assert f"{correct:.1%}" in ax.get_title()
    second = figure.axes[1]
    assert [p.get_height() for p in second.patches][:18][4] == 5  # 45° lies in bin [40, 50)
    assert "100.0%" in second.get_title()


def test_angle_figure_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="panels"):
        plot_angle_distributions({})
    with pytest.raises(TypeError, match="pair"):
        plot_angle_distributions({"a": np.zeros(3)})
    with pytest.raises(ValueError, match="radians"):
        plot_angle_distributions({"a": (np.array([200.0]), np.array([1.0]))})
    with pytest.raises(ValueError, match="length"):
        plot_angle_distributions({"a": (np.zeros(3), np.zeros(2))})
