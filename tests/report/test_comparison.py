"""The comparison report of ``compare``/``demo`` written from a comparison's rows and runs:
the metrics table in TABLE_COLUMNS' order, the notes, the interactive sphere of a 3-D run and
the PNGs drawn into the folder (the training itself: cli/test_cli.py's compare test)."""

from __future__ import annotations

import re

import numpy as np

from marginface.registry import create_loss
from marginface.report.comparison import ComparisonReport, write_comparison_report
from marginface.train.compare import TABLE_COLUMNS, Comparison
from marginface.train.evaluation.evaluate import Evaluation


def _run(name: str, seed: int) -> tuple[list[dict], Evaluation, object]:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(3), 4)
    x = rng.normal(size=(12, 3)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    evaluation = Evaluation({"accuracy": 0.5 + seed / 10}, x, labels)
    history = [{"epoch": 1, "loss": 2.0, "accuracy": 0.4}, {"epoch": 2, "loss": 1.0}]
    return history, evaluation, create_loss(name, 3, 3)


def test_the_report_holds_the_table_the_notes_and_the_pictures(tmp_path) -> None:
    runs = {"arcface": _run("arcface", 1), "cosface": _run("cosface", 2)}
    rows = [{"loss": name, **ev.metrics, "epochs": 2} for name, (_, ev, _) in runs.items()]
    written = write_comparison_report(
        Comparison(rows, runs), tmp_path / "out", title="a <test>", notes=["command: x"]
    )
    assert isinstance(written, ComparisonReport) and written.rows == rows
    assert written.report == tmp_path / "out" / "report.html"
    assert all(
        path.is_file() and path.parent == tmp_path / "out" for path in written.images.values()
    )
    assert "Margin curves (target logit / s against θ)" in written.images
    assert "Training curves: cosface" in written.images
    page = written.report.read_text(encoding="utf-8")
    assert "<title>a &lt;test&gt;</title>" in page and "command: x" in page
    header = page[page.index("<thead>") : page.index("</thead>")].replace("<wbr>", "")
    assert re.findall(r"<th>([^<]*)</th>", header) == list(TABLE_COLUMNS)
    assert "<td>0.6000</td>" in page and "<td>0.7000</td>" in page  # the runs' accuracy
    assert page.count("<img ") == len(written.images)
    assert "arcface: test embeddings on the unit sphere" in page  # 3-D runs: interactive
