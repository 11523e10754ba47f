"""``marginface evaluate``'s calibration when the test set has few impostor pairs: the first of
FAR 1e-3, 1e-2, 1e-1 the pairs support (``10 / impostors`` at most), a warning naming the
numbers, and no threshold at all when even 0.1 is beyond them."""

from __future__ import annotations

import numpy as np

from marginface.cli.runs import _describe_evaluated
from marginface.inference import describe_model
from marginface.models.description import ModelDescription
from marginface.train import Evaluation


def _saved(folder) -> ModelDescription:
    return ModelDescription.from_json((folder / "description.json").read_text(encoding="utf-8"))


def _evaluation(identities: int, per_identity: int) -> Evaluation:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(identities), per_identity)
    centres = rng.normal(size=(identities, 3))
    embeddings = centres[labels] + 0.3 * rng.normal(size=(labels.shape[0], 3))
    return Evaluation({"auc": 0.9}, embeddings.astype(np.float32), labels)


def test_few_impostors_save_the_first_supported_far_with_a_warning(digits_run, tmp_path):
    found = describe_model(digits_run).replace(threshold=0.9, threshold_far=1e-3)
    # 3 identities x 10 images: 3 * C(10, 2) = 135 genuine, 300 impostor pairs; 0.1 * 300 = 30
    # false accepts expected (supported), 0.01 * 300 = 3 (not)
    path, line, warning = _describe_evaluated(tmp_path, _evaluation(3, 10), found, flip=None)
    assert path == tmp_path / "description.json"
    saved = _saved(tmp_path)
    assert saved.threshold_far == 0.1
    assert line.startswith(f"threshold {saved.threshold:.6f} for FAR 0.1: ")
    assert "of 300 impostor pairs accepted" in line and "support FAR >= 0.0333" in line
    assert warning == (
        "the test set's 300 impostor pairs (all 435 pairs of 30 test images) support "
        "FAR >= 0.0333, not 0.001 (it needs 10,000): the threshold saved is for FAR 0.1"
    )


def test_too_few_impostors_for_any_far_save_no_threshold(digits_run, tmp_path):
    found = describe_model(digits_run).replace(threshold=0.9, threshold_far=1e-3)
    # 2 identities x 7 images: 49 impostor pairs; 0.1 * 49 < 10
    path, line, warning = _describe_evaluated(tmp_path, _evaluation(2, 7), found, flip=None)
    assert path == tmp_path / "description.json"
    saved = _saved(tmp_path)
    assert saved.threshold is None and saved.threshold_far is None  # the old one is gone too
    assert line == "" and len(warning.splitlines()) == 1
    assert "49 impostor pairs" in warning and "support FAR >= 0.204" in warning
    assert warning.endswith("(it needs 100): no threshold saved")


def test_pairs_of_one_kind_save_nothing(digits_run, tmp_path):
    found = describe_model(digits_run)
    assert _describe_evaluated(tmp_path, _evaluation(1, 5), found, flip=None) is None
    assert _describe_evaluated(tmp_path, _evaluation(5, 1), found, flip=None) is None
    assert not any(tmp_path.iterdir())
