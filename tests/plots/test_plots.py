"""Plots return figures with the expected artists; save_figure writes valid PNGs atomically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image
from sklearn import metrics

import marginface
from marginface.margins import ArcFaceMargin, CosFaceMargin, MagFaceMargin, NormFaceMargin
from marginface.plots import (
    margin_curve,
    plot_embedding_grid,
    plot_embeddings,
    plot_margin_curves,
    plot_roc,
    plot_state_curve,
    plot_training_curves,
    save_figure,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def clusters(n: int, dim: int, classes: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    return rng.normal(size=(classes, dim))[labels] + 0.2 * rng.normal(size=(n, dim)), labels


def scatter_points(ax) -> int:
    return sum(len(c.get_offsets()) for c in ax.collections if hasattr(c, "get_offsets"))


def test_importing_plots_does_not_import_matplotlib() -> None:
    code = "import sys, marginface.plots; print('matplotlib' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_sphere_has_wireframe_equal_aspect_and_every_point_on_the_unit_sphere() -> None:
    embeddings, labels = clusters(150, 3)
    figure = plot_embeddings(torch.from_numpy(embeddings * 5).float(), labels, title="t")
    assert isinstance(figure, Figure)
    (ax,) = figure.axes
    assert ax.name == "3d" and ax.get_title() == "t"
    wireframes = [c for c in ax.collections if type(c).__name__ == "Line3DCollection"]
    assert len(wireframes) == 1
    points = [c for c in ax.collections if type(c).__name__ == "Path3DCollection"]
    assert len(points) == 4  # one scatter per class
    assert sum(len(c._offsets3d[0]) for c in points) == 150
    xyz = np.concatenate([np.stack([np.asarray(a) for a in c._offsets3d], 1) for c in points])
    np.testing.assert_allclose(np.linalg.norm(xyz, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(ax.get_box_aspect(), ax.get_box_aspect()[0])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["0", "1", "2", "3"]


def test_circle_has_reference_line_and_points_on_it() -> None:
    embeddings, labels = clusters(80, 2)
    figure = plot_embeddings(embeddings, labels)
    (ax,) = figure.axes
    assert ax.name == "rectilinear" and ax.get_aspect() == 1.0
    assert len(ax.lines) == 1  # the unit circle
    assert scatter_points(ax) == 80
    offsets = np.concatenate([c.get_offsets() for c in ax.collections])
    np.testing.assert_allclose(np.linalg.norm(offsets, axis=1), 1.0, atol=1e-6)


def test_plot_into_given_axes_and_wrong_kind_of_axes() -> None:
    from marginface.plots._figure import new_figure

    figure = new_figure(4, 4)
    ax = figure.add_subplot(projection="3d")
    assert plot_embeddings(*clusters(10, 3), ax=ax) is figure
    with pytest.raises(ValueError, match="ax must be a 2-D axes"):
        plot_embeddings(*clusters(10, 2), ax=ax)


@pytest.mark.parametrize(
    ("embeddings", "labels", "error", "match"),
    [
        (np.zeros((5, 4)), np.zeros(5, dtype=int), ValueError, "2 or 3 columns"),
        (np.zeros((5, 3)), np.zeros(4, dtype=int), ValueError, "labels must have length 5"),
        (np.zeros((5, 3)), np.zeros(5), TypeError, "integer dtype"),
        (np.full((5, 3), np.inf), np.zeros(5, dtype=int), ValueError, "non-finite"),
    ],
)
def test_plot_embeddings_bad_input(embeddings, labels, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        plot_embeddings(embeddings, labels)


def test_grid_has_one_panel_per_entry_and_one_legend() -> None:
    panels = {name: clusters(60, 3, seed=i) for i, name in enumerate(["a", "b", "c", "d", "e"])}
    panels["flat"] = clusters(30, 2, classes=6)
    figure = plot_embedding_grid(panels)
    assert [ax.get_title() for ax in figure.axes] == list(panels)
    assert [ax.name for ax in figure.axes] == ["3d"] * 5 + ["rectilinear"]
    assert len(figure.legends) == 1
    assert [t.get_text() for t in figure.legends[0].get_texts()] == [str(i) for i in range(6)]
    # the same class has the same colour in every panel
    colors = {}
    for ax in figure.axes:
        for collection, name in zip(*ax.get_legend_handles_labels(), strict=True):
            color = tuple(np.round(collection.get_facecolor()[0][:3], 6))
            assert colors.setdefault(name, color) == color
    with pytest.raises(ValueError, match="non-empty dict"):
        plot_embedding_grid({})
    with pytest.raises(TypeError, match=r"panels\['x'\] must be"):
        plot_embedding_grid({"x": np.zeros((3, 3))})


def test_margin_curves_one_line_per_margin_and_norm_in_legend() -> None:
    margins = {"normface": NormFaceMargin(), "arc": ArcFaceMargin(0.5), "mag": MagFaceMargin()}
    figure = plot_margin_curves(margins, norm=40.0)
    (ax,) = figure.axes
    labels = [line.get_label() for line in ax.lines]
    assert labels == ["cos θ (no margin)", "normface", "arc", "mag (‖x‖ = 40)"]
    theta = ax.lines[0].get_xdata()
    assert theta[0] == 0.0 and theta[-1] == pytest.approx(np.pi)
    np.testing.assert_allclose(ax.lines[1].get_ydata(), np.cos(theta), atol=1e-6)
    inside = theta + 0.5 <= np.pi
    np.testing.assert_allclose(
        ax.lines[2].get_ydata()[inside], np.cos(theta + 0.5)[inside], atol=1e-6
    )
    magface_margin = 0.45 + (0.8 - 0.45) * (40 - 10) / (110 - 10)
    # MagFace's default policy "easy" (the authors' MagLinear): the margin only where θ < π/2
    expected = np.where(np.cos(theta) > 0, np.cos(theta + magface_margin), np.cos(theta))
    np.testing.assert_allclose(ax.lines[3].get_ydata(), expected, atol=1e-5)


def test_default_margin_curves_cover_every_registered_loss() -> None:
    figure = plot_margin_curves()
    names = [line.get_label() for line in figure.axes[0].lines[1:]]
    assert [name.split(" ")[0] for name in names] == marginface.list_losses()
    assert any("‖x‖" in name for name in names)  # norm-dependent ones say so


def test_margin_curve_restores_mode_and_state() -> None:
    loss = marginface.create_loss("curricularface", num_classes=5, embedding_dim=3)
    loss.margin.t.fill_(0.3)
    loss.train()
    curve = margin_curve(loss.margin, np.linspace(0, np.pi, 7))
    assert loss.margin.training and float(loss.margin.t) == pytest.approx(0.3)
    np.testing.assert_allclose(curve[:3], np.cos(np.linspace(0, np.pi, 7)[:3] + 0.5), atol=1e-6)
    cos_face = margin_curve(CosFaceMargin(0.35, 30.0), np.array([0.0, np.pi / 2]))
    np.testing.assert_allclose(cos_face, [0.65, -0.35], atol=1e-6)
    with pytest.raises(TypeError, match="Margin"):
        margin_curve(torch.nn.Linear(2, 2), np.array([0.0]))
    with pytest.raises(ValueError, match="norm must be > 0"):
        plot_margin_curves({"a": NormFaceMargin()}, norm=0.0)


HISTORY = [
    {"epoch": "1", "loss": "2.0", "val_loss": "2.5", "accuracy": "0.5", "t": "0.1"},
    {"epoch": "2", "loss": "1.0", "val_loss": "", "accuracy": "0.8", "t": "0.3"},
    {"epoch": "3", "loss": "0.5", "val_loss": "1.0", "accuracy": "0.9", "t": "0.5"},
]


def test_training_curves_lines_and_values() -> None:
    figure = plot_training_curves(HISTORY)
    loss_ax, accuracy_ax = figure.axes
    assert [line.get_label() for line in loss_ax.lines] == ["training loss", "validation loss"]
    np.testing.assert_allclose(loss_ax.lines[1].get_xdata(), [1, 3])  # empty cell skipped
    np.testing.assert_allclose(accuracy_ax.lines[0].get_ydata(), [0.5, 0.8, 0.9])
    only_loss = plot_training_curves([{"loss": 1.0}, {"loss": 0.5}])
    assert len(only_loss.axes) == 1  # no empty accuracy panel
    assert len(only_loss.axes[0].lines) == 1
    np.testing.assert_allclose(only_loss.axes[0].lines[0].get_xdata(), [1, 2])
    open_set = plot_training_curves(
        [{"loss": 2.0, "verification_accuracy": 0.7}, {"loss": 1.0, "verification_accuracy": 0.8}]
    )
    (line,) = open_set.axes[1].lines
    assert line.get_label() == "verification accuracy (test pairs)"
    np.testing.assert_allclose(line.get_ydata(), [0.7, 0.8])


def test_state_curve() -> None:
    figure = plot_state_curve(HISTORY, "t")
    (line,) = figure.axes[0].lines
    np.testing.assert_allclose(line.get_ydata(), [0.1, 0.3, 0.5])
    with pytest.raises(ValueError, match=r"no values for key 's'.*accuracy, epoch, loss, t"):
        plot_state_curve(HISTORY, "s")


@pytest.mark.parametrize(
    ("history", "error", "match"),
    [
        ([], ValueError, "non-empty list"),
        ({"loss": 1}, ValueError, "non-empty list"),
        ([1, 2], TypeError, r"history\[0\] must be a dict"),
        ([{"epoch": 1, "lr": 0.1}], ValueError, "none of the columns.*epoch, lr"),
        ([{"loss": "abc"}], ValueError, "non-numeric value 'abc'"),
    ],
)
def test_training_curves_bad_input(history, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        plot_training_curves(history)


def test_roc_one_line_per_curve() -> None:
    fpr, tpr = np.array([0.0, 0.001, 0.1, 1.0]), np.array([0.0, 0.5, 0.9, 1.0])
    figure = plot_roc({"a": (fpr, tpr), "b": (torch.from_numpy(fpr), torch.from_numpy(tpr**2))})
    ax = figure.axes[0]
    aucs = [metrics.auc(fpr, tpr), metrics.auc(fpr, tpr**2)]  # 0.92455, 0.867095
    assert [line.get_label() for line in ax.lines] == [
        f"a (AUC = {aucs[0]:.4f})",
        f"b (AUC = {aucs[1]:.4f})",
    ]
    assert ax.get_xscale() == "log"
    np.testing.assert_allclose(ax.lines[0].get_xdata(), [0.001, 0.1, 1.0])  # FAR = 0 not drawn
    linear = plot_roc({"a": (fpr, tpr)}, log_far=False)
    assert [line.get_label() for line in linear.axes[0].lines] == ["a (AUC = 0.9245)", "chance"]
    with pytest.raises(ValueError, match="non-decreasing"):
        plot_roc({"a": (fpr[::-1], tpr)})
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        plot_roc({"a": (fpr * 2, tpr)})
    with pytest.raises(ValueError, match="tpr must have length 4"):
        plot_roc({"a": (fpr, tpr[:2])})


def test_save_figure_writes_a_valid_png(tmp_path: Path) -> None:
    figure = plot_embeddings(*clusters(50, 3))
    target = save_figure(figure, tmp_path / "new" / "sphere.png", dpi=50)
    assert target == (tmp_path / "new" / "sphere.png").absolute()
    assert target.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(target) as image:
        image.verify()
    with Image.open(target) as image:
        assert image.format == "PNG" and image.size == (350, 300)  # 7×6 inches at 50 dpi
    assert sorted(p.name for p in target.parent.iterdir()) == ["sphere.png"]


def test_save_figure_leaves_nothing_on_error(tmp_path: Path, monkeypatch) -> None:
    figure = plot_roc({"a": ([0.0, 1.0], [0.0, 1.0])})
    existing = tmp_path / "roc.png"
    existing.write_bytes(b"old")

    def failing_savefig(stream, **kwargs) -> None:
        stream.write(PNG_SIGNATURE + b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(figure, "savefig", failing_savefig)
    with pytest.raises(RuntimeError, match="disk full"):
        save_figure(figure, existing)
    with pytest.raises(RuntimeError, match="disk full"):
        save_figure(figure, tmp_path / "fresh.png")
    assert existing.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["roc.png"]


def test_save_figure_bad_arguments(tmp_path: Path) -> None:
    figure = plot_roc({"a": ([0.0, 1.0], [0.0, 1.0])})
    with pytest.raises(ValueError, match=r"must end in \.png"):
        save_figure(figure, tmp_path / "x.jpg")
    with pytest.raises(TypeError, match="figure must be a matplotlib Figure"):
        save_figure("not a figure", tmp_path / "x.png")
    with pytest.raises(TypeError, match="path must be"):
        save_figure(figure, 3)
    with pytest.raises(ValueError, match="dpi must be >= 1"):
        save_figure(figure, tmp_path / "x.png", dpi=0)
    assert list(tmp_path.iterdir()) == []
