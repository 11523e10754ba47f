"""The open-set confusion of known and unknown probes at a threshold: counts restated from the
definitions on a hand-made set, the rates and their exact intervals, the report's lines."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.evaluation.binomial import clopper_pearson
from marginface.evaluation.open_set import OpenSetReport, open_set_counts

# 6 mated probes (right: the best identity is theirs) and 4 non-mated ones, their best cosines
RIGHT = np.array([1, 1, 1, 0, 0, 1, 0, 0, 0, 0], bool)
MATED = np.array([1, 1, 1, 1, 1, 1, 0, 0, 0, 0], bool)
SCORES = np.array([0.9, 0.8, 0.3, 0.7, 0.2, 0.5, 0.6, 0.1, 0.4, 0.55])


def test_counts_at_a_threshold_follow_the_definitions():
    counts = open_set_counts(RIGHT, MATED, SCORES, 0.5)
    # mated: right & >= 0.5: probes 0, 1, 5; wrong & >= 0.5: probe 3; < 0.5: probes 2, 4
    # non-mated: >= 0.5: probes 6, 9; < 0.5: probes 7, 8
    assert counts == {
        "mated": 6,
        "rank1": 4,
        "accepted_right": 3,
        "accepted_wrong": 1,
        "rejected_mated": 2,
        "non_mated": 4,
        "rejected_non_mated": 2,
        "accepted_non_mated": 2,
    }
    # the partitions add up
    assert counts["accepted_right"] + counts["accepted_wrong"] + counts["rejected_mated"] == 6
    assert counts["rejected_non_mated"] + counts["accepted_non_mated"] == 4


def test_no_threshold_accepts_every_probe():
    counts = open_set_counts(RIGHT, MATED, SCORES, None)
    assert counts["accepted_right"] == 4 and counts["accepted_wrong"] == 2
    assert counts["rejected_mated"] == 0 and counts["accepted_non_mated"] == 4
    line = OpenSetReport(None, **counts).lines()[1]
    assert "; no threshold: every probe accepted: 4 accepted right, 2 accepted wrong" in line


def test_rates_and_intervals():
    report = OpenSetReport(
        0.5, fnir_at_fpir={0.1: None}, **open_set_counts(RIGHT, MATED, SCORES, 0.5)
    )
    assert report.rank1_rate == 4 / 6
    assert report.fnir == (1 + 2) / 6  # (accepted wrong + rejected) / mated
    assert report.fpir == 2 / 4
    assert report.fnir_interval == clopper_pearson(3, 6)
    assert report.fpir_interval == clopper_pearson(2, 4)
    lines = report.lines()
    assert lines[0] == "probes: 10: 6 mated (identity in the gallery), 4 non-mated"
    assert lines[1].startswith(
        "mated: rank-1 0.6667 (4 of 6); at threshold 0.5: 3 accepted right, 1 accepted "
        "wrong, 2 rejected: FNIR 0.5000 (95% exact interval"
    )
    assert lines[2].startswith("non-mated: 2 rejected, 2 accepted: FPIR 0.5000 (95% exact")
    assert lines[3] == (
        "FNIR at FPIR 0.1: not measurable: it needs >= 100 non-mated probes (10 false alarms "
        "expected), these are 4 (they support FPIR >= 2.5)"
    )
    assert report.as_dict()["fnir@fpir=1e-01"] is None and report.as_dict()["fpir"] == 0.5


def test_without_non_mated_probes_there_is_no_fpir():
    counts = open_set_counts(RIGHT[:6], MATED[:6], SCORES[:6], 0.5)
    report = OpenSetReport(0.5, **counts)
    assert report.fpir is None and report.fpir_interval is None
    assert "non-mated: none" in report.lines()[2]


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="right must be False for non-mated probes"):
        open_set_counts(np.ones(10, bool), MATED, SCORES, 0.5)
    with pytest.raises(ValueError, match="mated must have length 10, got 3"):
        open_set_counts(RIGHT, MATED[:3], SCORES, 0.5)
