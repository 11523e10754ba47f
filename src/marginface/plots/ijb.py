"""IJB-B / IJB-C results over training, from the IJB columns of a run's per-epoch log
(``train --ijb-dir``: ``ijbc_tar@far=1e-06`` ... ``1e-01``, ``ijbc_<gallery>_rank1``,
``ijbc_<gallery>_tpir@fpir=1e-01``), and the IJB result sets a metrics dict holds."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ._figure import new_figure
from .training import _check_history, _keys, history_column

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["ijb_prefixes", "plot_ijb_history"]

_TAR_KEY = re.compile(r"^(ijb[bc](?:-[a-z-]+)?_)tar@far=([0-9.e+-]+)$")
_GALLERY_KEY = re.compile(r"^(?P<gallery>[A-Za-z0-9+]+)_(?P<what>rank1|tpir@fpir=[0-9.e+-]+)$")


def ijb_prefixes(keys: Sequence[str] | Mapping[str, object]) -> list[str]:
    """The IJB result prefixes among ``keys``, in order of first appearance: ``ijbc_``,
    ``ijbb_``, and ablations of ``marginface ijb`` (``ijbc-noflip_`` ...): every prefix ``p``
    with a key ``p + "tar@far=<FAR>"``."""
    found: list[str] = []
    for key in keys:
        match = _TAR_KEY.match(str(key))
        if match and match.group(1) not in found:
            found.append(match.group(1))
    return found


def plot_ijb_history(history: Sequence[Mapping[str, object]], prefix: str = "ijbc_") -> Figure:
    """IJB results per epoch: 1:1 TAR at each FAR (left panel) and, when the log has them,
    1:N rank-1 and TPIR per gallery (right panel); epochs without IJB values are skipped.

    Args:
        history: the trainer's per-epoch rows (strings are converted, empty cells skipped).
        prefix: the columns' prefix, ``"ijbc_"`` (default) or ``"ijbb_"``.

    Returns:
        The figure: one line per column with values (at least one TAR@FAR column must have
        one; ``ValueError`` listing the columns otherwise).
    """
    _check_history(history)
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a string, got {prefix!r}")
    keys = _keys(history)
    tar = sorted(
        (k for k in keys if k.startswith(prefix) and _TAR_KEY.match(k)),
        key=lambda k: float(k.rsplit("=", 1)[1]),
    )
    tar_curves = {k: history_column(history, k) for k in tar}
    tar_curves = {k: v for k, v in tar_curves.items() if v[1].size}
    if not tar_curves:
        raise ValueError(
            f"history has no values in {prefix}tar@far=... columns; "
            f"its columns are: {', '.join(keys)}"
        )
    one_to_n = {}
    for key in keys:
        match = _GALLERY_KEY.match(key[len(prefix) :]) if key.startswith(prefix) else None
        if match:
            curve = history_column(history, key)
            if curve[1].size:
                one_to_n[key] = (match.group("gallery"), match.group("what"), curve)
    target = prefix.rstrip("_").upper()
    figure = new_figure(11.0, 4.0) if one_to_n else new_figure(6.0, 4.0)
    axes = figure.subplots(1, 2) if one_to_n else [figure.add_subplot()]
    for key, (epochs, values) in tar_curves.items():
        axes[0].plot(epochs, values, marker=".", label=f"FAR={key.rsplit('=', 1)[1]}")
    axes[0].set_title(f"{target} 1:1 TAR at FAR")
    axes[0].set_ylabel("TAR")
    if one_to_n:
        for gallery, what, (epochs, values) in one_to_n.values():
            style = "-" if what == "rank1" else "--"
            axes[1].plot(epochs, values, style, marker=".", label=f"{gallery} {what}")
        axes[1].set_title(f"{target} 1:N rank-1 and TPIR")
        axes[1].set_ylabel("rate")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    return figure
