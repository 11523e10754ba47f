"""``evaluate`` on a dataset judged by verification sets (.bin): insightface's numbers by default,
marginface's midpoint search labelled beside them, VAL and TAR at FAR reported."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marginface.data import load_dataset
from marginface.data.base import DatasetBundle, PairSet, VerificationSet
from marginface.evaluation import bin_set_metrics, bin_verification_metrics, verification_metrics
from marginface.train import Trainer, evaluate_run, extract_embeddings
from marginface.train.config import TrainConfig

from .test_bin_verification import insightface_reference


def _bin_only_bundle() -> tuple[DatasetBundle, VerificationSet]:
    """digits with an empty test set and one 200-pair verification set (a .bin's layout)."""
    bundle = load_dataset("digits", seed=0)
    test = bundle.test
    rng = np.random.default_rng(0)
    first = rng.integers(0, len(test), 200)
    second = rng.integers(0, len(test), 200)
    second[::3] = first[::3]  # enough genuine pairs in every fold
    same = test.labels[first] == test.labels[second]
    index = np.arange(400, dtype=np.int64).reshape(200, 2)
    images = np.empty((400, *test.images.shape[1:]), dtype=np.uint8)
    images[0::2] = np.round(test.images[first] * 255).astype(np.uint8)
    images[1::2] = np.round(test.images[second] * 255).astype(np.uint8)
    fold = np.arange(200) * 10 // 200
    verification = VerificationSet(images, PairSet(index, same, fold))
    train = bundle.train
    limited = type(train)(train.images[:120], train.labels[:120], train.class_names)
    empty = type(test)(test.images[:0], test.labels[:0], test.class_names)
    bundle = DatasetBundle("digits", limited, empty, verification={"pairs": verification})
    return bundle, verification


def test_evaluate_reports_insightface_numbers_val_and_tar(tmp_path):
    bundle, verification = _bin_only_bundle()
    config = TrainConfig(dataset="digits", epochs=1, batch_size=40, threads=1, device="cpu")
    trainer = Trainer(config, tmp_path / "run", bundle=bundle)
    trainer.fit()
    result = evaluate_run(tmp_path / "run", device="cpu", bundle=bundle)
    floats = verification.images.astype(np.float32) / 255
    as_is = extract_embeddings(trainer.model, floats, device="cpu").numpy().astype(np.float64)
    flipped = extract_embeddings(
        trainer.model, np.ascontiguousarray(floats[..., ::-1]), device="cpu"
    ).numpy()
    flipped = flipped.astype(np.float64)
    reference = insightface_reference(as_is, flipped, verification.pairs.same)
    metrics = result.metrics
    assert metrics["pairs_accuracy"] == pytest.approx(reference["accuracy"], abs=1e-12)
    assert metrics["pairs_accuracy_std"] == pytest.approx(reference["accuracy_std"], abs=1e-12)
    assert metrics["pairs_xnorm"] == pytest.approx(reference["xnorm"], rel=1e-5)
    assert metrics["pairs_val@far=1e-03"] == pytest.approx(reference["val"], abs=1e-12)
    assert metrics["pairs_far"] == pytest.approx(reference["far"], abs=1e-12)
    assert metrics["pairs_threshold"] == pytest.approx(reference["threshold"], abs=1e-12)
    assert {"pairs_accuracy_midpoint", "pairs_auc", "pairs_eer", "pairs_tar@far=1e-01"} <= set(
        metrics
    )
    assert np.isnan(metrics["pairs_tar@far=1e-03"])  # 200 pairs cannot measure FAR 1e-3


def test_bin_set_metrics_labels_the_midpoint_search():
    rng = np.random.default_rng(5)
    same = rng.random(300) < 0.5
    base = rng.standard_normal((600, 8))
    base[1::2][same] = base[0::2][same]
    embeddings = base + 0.8 * rng.standard_normal(base.shape)
    flipped = base + 0.8 * rng.standard_normal(base.shape)
    index = np.arange(600).reshape(300, 2)
    fold = np.repeat(np.arange(10), 30)
    values, roc = bin_set_metrics(embeddings, flipped, PairSet(index, same, fold))
    official = bin_verification_metrics(embeddings, same, flipped=flipped)
    summed = torch.nn.functional.normalize(torch.from_numpy(embeddings + flipped), dim=1)
    cosines = (summed[0::2] * summed[1::2]).sum(1).numpy()
    midpoint = verification_metrics(cosines, same, folds=fold)
    assert values["accuracy"] == official.accuracy
    assert values["accuracy_midpoint"] == pytest.approx(midpoint.accuracy)
    assert values["tar@far=1e-01"] == pytest.approx(midpoint.tar_at_far[0.1])
    assert roc.auc == pytest.approx(midpoint.auc)
