"""train/state/results.py: RUN/evaluation.json written by one function, each section kept."""

from __future__ import annotations

import json
import math

import pytest

from marginface.train.state.layout import EVALUATION_NAME
from marginface.train.state.results import (
    ijb_results,
    read_results,
    update_results,
    write_results_file,
)


def _saved(run_dir):
    return json.loads((run_dir / EVALUATION_NAME).read_text())


def test_evaluate_replaces_its_keys_and_keeps_ijb(tmp_path):
    update_results(tmp_path, "evaluate", {"lfw_acc": 0.9, "old_key": 1.0})
    update_results(tmp_path, "ijb", {"ijbc_tar@far=1e-4": 0.8, "ijbb_auc": math.nan})
    path = update_results(tmp_path, "evaluate", {"lfw_acc": 0.95})
    assert path == tmp_path / EVALUATION_NAME
    assert _saved(tmp_path) == {"lfw_acc": 0.95, "ijbc_tar@far=1e-4": 0.8, "ijbb_auc": None}


def test_evaluate_values_win_over_kept_ijb(tmp_path):
    update_results(tmp_path, "ijb", {"ijbc_auc": 0.5})
    update_results(tmp_path, "evaluate", {"ijbc_auc": 0.7, "acc": 0.1})
    assert _saved(tmp_path) == {"ijbc_auc": 0.7, "acc": 0.1}


def test_ijb_merges_and_keeps_everything_else(tmp_path):
    update_results(tmp_path, "evaluate", {"acc": 0.9, "threshold": 1.2})
    update_results(tmp_path, "ijb", {"ijbb_auc": 0.6})
    update_results(tmp_path, "ijb", {"ijbc_auc": 0.7, "ijbb_auc": 0.65})
    assert _saved(tmp_path) == {"acc": 0.9, "threshold": 1.2, "ijbb_auc": 0.65, "ijbc_auc": 0.7}


def test_reading(tmp_path):
    assert read_results(tmp_path) == {} and ijb_results(tmp_path) == {}
    (tmp_path / EVALUATION_NAME).write_text("[1, 2]")
    assert read_results(tmp_path) == {}
    (tmp_path / EVALUATION_NAME).write_text("{not json")
    assert read_results(tmp_path) == {}
    write_results_file(
        tmp_path / EVALUATION_NAME, {"ijbb_auc": math.inf, "ijbc_x": "text", "acc": 0.5}
    )
    assert read_results(tmp_path) == {"ijbb_auc": None, "ijbc_x": "text", "acc": 0.5}
    got = ijb_results(tmp_path)
    assert list(got) == ["ijbb_auc"] and math.isnan(got["ijbb_auc"])


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="section must be one of .*got 'plot'"):
        update_results(tmp_path, "plot", {})
    with pytest.raises(ValueError, match=r"section 'ijb' must start with ijbb/ijbc, got \['acc'\]"):
        update_results(tmp_path, "ijb", {"acc": 1.0})
    with pytest.raises(ValueError, match="run_dir .*missing is not a folder"):
        update_results(tmp_path / "missing", "evaluate", {})
