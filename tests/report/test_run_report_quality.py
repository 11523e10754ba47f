"""``evaluate``'s page of a MagFace run (``write_quality_report``): the error-versus-reject
picture and the metrics; a run without the curve is a ValueError naming ``evaluation.erc``
(the command itself: cli/test_cli_quality.py)."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.evaluation.quality import error_versus_reject
from marginface.report.run_report import QUALITY_CAPTION, write_quality_report
from marginface.train.evaluation.evaluate import Evaluation


def _evaluation(erc) -> Evaluation:
    return Evaluation({"accuracy": 0.75}, np.zeros((0, 3), np.float32), np.zeros(0), erc=erc)


def test_the_page_holds_the_metrics_and_the_curve(tmp_path) -> None:
    rng = np.random.default_rng(0)
    scores, quality = rng.uniform(-1, 1, 40), rng.uniform(0, 1, 40)
    same = np.arange(40) % 2 == 0
    curve = error_versus_reject(scores, same, quality)
    page = write_quality_report(tmp_path / "run", _evaluation(curve))
    assert page == tmp_path / "run" / "evaluation.html"
    assert (tmp_path / "run" / "erc.png").is_file()
    text = page.read_text(encoding="utf-8")
    assert "marginface evaluation: run" in text and QUALITY_CAPTION.split(":")[0] in text
    assert "0.7500" in text and text.count("<img ") == 1


def test_a_run_without_the_curve_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"evaluation\.erc is None"):
        write_quality_report(tmp_path, _evaluation(None))
    assert list(tmp_path.iterdir()) == []
