"""IJB results over training (``plot_ijb_history``), the IJB prefixes of a metrics dict, and
the report's IJB section (``report.pictures.ijb_section``)."""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest

from marginface.plots import ijb_prefixes, plot_ijb_history
from marginface.report import Image, Table, write_report
from marginface.report.pictures import ijb_curve_caption, ijb_section, report_sections
from marginface.train.evaluation.evaluate import Evaluation

NAN = math.nan
HISTORY = [
    {"epoch": 1, "loss": 3.0, "ijbc_tar@far=1e-04": NAN, "ijbc_tar@far=1e-01": NAN},
    {
        "epoch": 2,
        "loss": 2.0,
        "ijbc_tar@far=1e-04": 0.25,
        "ijbc_tar@far=1e-01": 0.5,
        "ijbc_G1_rank1": 0.75,
        "ijbc_G1_tpir@fpir=1e-01": 0.5,
    },
    {
        "epoch": 3,
        "loss": 1.0,
        "ijbc_tar@far=1e-04": 0.375,
        "ijbc_tar@far=1e-01": "0.625",
        "ijbc_G1_rank1": 1.0,
        "ijbc_G1_tpir@fpir=1e-01": 0.875,
    },
]


def test_ijb_prefixes_find_targets_and_ablations_only() -> None:
    keys = [
        "accuracy",
        "lfw_tar@far=1e-03",
        "ijbc_tar@far=1e-04",
        "ijbc_tar@far=1e-04_conservative",
        "ijbc-nodet_tar@far=1e-06",
        "ijbb_G1_rank1",  # no 1:1 key: not an IJB result set
        "ijbc_tar@far=1e-01",
    ]
    assert ijb_prefixes(keys) == ["ijbc_", "ijbc-nodet_"]
    assert ijb_prefixes({"ijbb_tar@far=1e-05": 0.1}) == ["ijbb_"]


def test_ijb_history_lines_skip_epochs_without_values() -> None:
    figure = plot_ijb_history(HISTORY)
    one_to_one, one_to_n = figure.axes
    assert [line.get_label() for line in one_to_one.lines] == ["FAR=1e-04", "FAR=1e-01"]
    np.testing.assert_allclose(one_to_one.lines[0].get_xdata(), [2, 3])
    np.testing.assert_allclose(one_to_one.lines[1].get_ydata(), [0.5, 0.625])
    labels = [line.get_label() for line in one_to_n.lines]
    assert labels == ["G1 rank1", "G1 tpir@fpir=1e-01"]
    np.testing.assert_allclose(one_to_n.lines[1].get_ydata(), [0.5, 0.875])
    # 1:1 columns alone: one panel
    only = plot_ijb_history([{k: v for k, v in row.items() if "_G1_" not in k} for row in HISTORY])
    assert len(only.axes) == 1 and len(only.axes[0].lines) == 2


def test_ijb_history_errors_name_the_columns() -> None:
    with pytest.raises(ValueError, match=r"no values in ijbb_tar@far=\.\.\. columns.*epoch"):
        plot_ijb_history(HISTORY, "ijbb_")
    with pytest.raises(ValueError, match="no values in ijbc_tar@far"):
        plot_ijb_history([HISTORY[0]])
    with pytest.raises(TypeError, match="prefix must be a string"):
        plot_ijb_history(HISTORY, None)
    with pytest.raises(ValueError, match="non-empty list"):
        plot_ijb_history([])


def _evaluation(metrics: dict) -> Evaluation:
    return Evaluation(metrics, np.zeros((0, 16), np.float32), np.zeros(0, np.int64))


class _Loss:
    """What report_sections reads of a head when no picture needs it."""


def test_ijb_section_tables_come_from_marginface_ijb_else_the_history(tmp_path) -> None:
    measured = {
        "accuracy": 0.5,
        "ijbc_tar@far=1e-06": 0.125,
        "ijbc_tar@far=1e-01": 0.875,
        "ijbc_G1+G2_rank1": 0.5,
        "ijbc_G1+G2_rank5": 1.0,
        "ijbc_G1+G2_tpir@fpir=1e-01": 0.25,
        "ijbc_G1+G2_probes_mated": 8.0,
    }
    runs = {
        "arcface": (HISTORY, _evaluation(measured), _Loss()),
        "cosface": (HISTORY, _evaluation({"accuracy": 0.4}), _Loss()),
        "normface": ([{"epoch": 1, "loss": 1.0}], _evaluation({"accuracy": 0.3}), _Loss()),
    }
    curve = tmp_path / "curve.png"
    curve.write_bytes(base64.b64decode(PNG))
    roc = tmp_path / "roc.png"
    roc.write_bytes(base64.b64decode(PNG))
    images = {ijb_curve_caption("cosface", "ijbc_"): curve, "Margin curves": curve}
    section = ijb_section(runs, images, {"IJBC ROC": roc})
    one_to_one, one_to_n = (b for b in section.blocks if isinstance(b, Table))
    rows = {row["run"]: row for row in one_to_one.rows}
    assert set(rows) == {"arcface", "cosface"}  # normface has no IJB result
    assert rows["arcface"]["from"] == "marginface ijb"
    assert rows["arcface"]["tar@far=1e-06"] == 0.125 and rows["arcface"]["tar@far=1e-01"] == 0.875
    assert rows["arcface"]["tar@far=1e-04"] is None  # not measured: "-"
    assert rows["cosface"]["from"] == "history, epoch 3"
    assert rows["cosface"]["tar@far=1e-04"] == 0.375
    galleries = {(row["run"], row["gallery"]): row for row in one_to_n.rows}
    assert set(galleries) == {("arcface", "G1+G2"), ("cosface", "G1")}
    assert galleries["arcface", "G1+G2"]["rank5"] == 1.0
    assert galleries["cosface", "G1"]["tpir@fpir=1e-01"] == 0.875
    captions = [b.caption for b in section.blocks if isinstance(b, Image)]
    assert captions == [ijb_curve_caption("cosface", "ijbc_"), "IJBC ROC"]
    # in the page: the IJB section, its curve not repeated among the other pictures
    sections = report_sections(runs, images, {"IJBC ROC": roc})
    assert [s.title for s in sections] == ["IJB-B / IJB-C", "Pictures"]
    assert [b.caption for b in sections[1].blocks] == ["Margin curves"]
    page = write_report(tmp_path / "r.html", title="t", sections=sections).read_text()
    assert "<td>0.8750</td>" in page and "<td>history, epoch 3</td>" in page
    # no IJB anywhere: no section
    plain = {"normface": runs["normface"]}
    assert ijb_section(plain, {}) is None
    assert [s.title for s in report_sections(plain, {"Margin curves": curve})] == ["Pictures"]


PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJ"
    "RU5ErkJggg=="
)
