"""Training curves from the trainer's per-epoch log (the rows of its CSV)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ._figure import new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["history_column", "plot_state_curve", "plot_training_curves"]


def _check_history(history: Sequence[Mapping[str, object]]) -> None:
    if isinstance(history, Mapping | str) or not isinstance(history, Sequence) or not history:
        raise ValueError(f"history must be a non-empty list of per-epoch dicts, got {history!r}")
    for i, row in enumerate(history):
        if not isinstance(row, Mapping):
            raise TypeError(f"history[{i}] must be a dict, got {type(row).__name__}")


def _as_float(value: object) -> float:
    """A CSV cell or number as a float; empty or missing cells are NaN."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return math.nan
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"history holds a non-numeric value {value!r}") from None


def history_column(history: Sequence[Mapping[str, object]], key: str) -> tuple[np.ndarray, ...]:
    """``(epochs, values)`` for one column, rows without it (or with an empty cell) skipped.

    Epochs come from each row's ``"epoch"`` and default to the 1-based row number.
    """
    _check_history(history)
    epochs, values = [], []
    for i, row in enumerate(history, start=1):
        value = _as_float(row.get(key))
        if math.isnan(value):
            continue
        epoch = _as_float(row.get("epoch", i))
        epochs.append(i if math.isnan(epoch) else epoch)
        values.append(value)
    return np.asarray(epochs, dtype=np.float64), np.asarray(values, dtype=np.float64)


def _keys(history: Sequence[Mapping[str, object]]) -> list[str]:
    return sorted({str(k) for row in history for k in row})


def _set_accuracy_keys(history: Sequence[Mapping[str, object]]) -> list[str]:
    """The verification sets' ``<set>_accuracy`` columns (those with a ``<set>_accuracy_std``
    beside them: ``lfw_accuracy``...), the test pairs' ``verification_accuracy`` excepted."""
    keys = list(dict.fromkeys(str(k) for row in history for k in row))
    return [
        k
        for k in keys
        if k.endswith("_accuracy") and f"{k}_std" in keys and k != "verification_accuracy"
    ]


def plot_training_curves(history: Sequence[Mapping[str, object]]) -> Figure:
    """Loss and validation loss (left panel) and accuracy (right panel) per epoch.

    Args:
        history: the trainer's per-epoch rows (e.g. ``csv.DictReader`` output; strings are
            converted): ``"epoch"`` and any of ``"loss"``, ``"val_loss"``, ``"accuracy"``
            (closed-set), ``"verification_accuracy"`` (open-set runs: test pairs) and the
            verification sets' ``"<set>_accuracy"`` (``lfw_accuracy``... beside their
            ``_std``). Missing or empty cells are skipped.

    Returns:
        The figure: one line per column present (at least one must be); the accuracy panel
        only when an accuracy column has a value.
    """
    _check_history(history)
    keys = ("loss", "val_loss", "accuracy", "verification_accuracy", *_set_accuracy_keys(history))
    columns = {key: history_column(history, key) for key in keys}
    present = {key: value for key, value in columns.items() if value[1].size}
    if not present:
        raise ValueError(
            f"history has none of the columns {', '.join(keys)}; "
            f"its columns are: {', '.join(_keys(history))}"
        )
    accuracies = [key for key in keys[2:] if key in present]
    if not accuracies:  # nothing to draw on the right: the loss alone
        figure = new_figure(6.0, 4.0)
        loss_ax = figure.add_subplot()
        _draw_losses(loss_ax, present)
        return figure
    figure = new_figure(11.0, 4.0)
    loss_ax, accuracy_ax = figure.subplots(1, 2)
    _draw_losses(loss_ax, present)
    if "accuracy" in present:
        accuracy_ax.plot(*present["accuracy"], marker=".", color="tab:green", label="accuracy")
    if "verification_accuracy" in present:
        accuracy_ax.plot(
            *present["verification_accuracy"],
            marker=".",
            color="tab:purple",
            label="verification accuracy (test pairs)",
        )
    for key in accuracies:
        if key not in ("accuracy", "verification_accuracy"):
            name = key[: -len("_accuracy")]
            accuracy_ax.plot(*present[key], marker=".", label=f"{name} (verification set)")
    accuracy_ax.set_title("Accuracy")
    accuracy_ax.set_ylabel("accuracy")
    accuracy_ax.set_xlabel("epoch")
    accuracy_ax.grid(True, alpha=0.3)
    accuracy_ax.legend(fontsize="small")
    return figure


def _draw_losses(ax: Axes, present: Mapping[str, tuple[np.ndarray, ...]]) -> None:
    """The training and validation losses present, on ``ax``."""
    for key, label in (("loss", "training loss"), ("val_loss", "validation loss")):
        if key in present:
            ax.plot(*present[key], marker=".", label=label)
    ax.set_title("Loss")
    ax.set_ylabel("loss")
    ax.set_xlabel("epoch")
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small")


def plot_state_curve(history: Sequence[Mapping[str, object]], key: str) -> Figure:
    """One column of the log against the epoch, e.g. CurricularFace's ``"t"`` or AdaCos's
    ``"s"``.

    Args:
        history: the trainer's per-epoch rows, as for :func:`plot_training_curves`.
        key: the column; ``ValueError`` listing the columns if no row has a value for it.

    Returns:
        The figure with one line.
    """
    if not isinstance(key, str):
        raise TypeError(f"key must be a string, got {key!r}")
    epochs, values = history_column(history, key)
    if not values.size:
        raise ValueError(
            f"history has no values for key {key!r}; its columns are: {', '.join(_keys(history))}"
        )
    figure = new_figure(6.0, 4.0)
    ax = figure.add_subplot()
    ax.plot(epochs, values, marker=".", label=key)
    ax.set_xlabel("epoch")
    ax.set_ylabel(key)
    ax.set_title(f"{key} over training")
    ax.grid(True, alpha=0.3)
    return figure
