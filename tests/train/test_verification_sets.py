"""Verification sets evaluated during training: per-epoch columns and every-N-steps log."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marginface.data import load_dataset
from marginface.data.base import DatasetBundle, PairSet, VerificationSet
from marginface.evaluation import bin_verification_metrics
from marginface.train import Trainer, extract_embeddings, read_history
from marginface.train.config import TrainConfig
from marginface.train.evaluation.epoch_evaluation import EpochEvaluator


def _bundle_with_sets() -> tuple[DatasetBundle, VerificationSet]:
    bundle = load_dataset("digits", seed=0)
    test = bundle.test
    rng = np.random.default_rng(0)
    first = rng.integers(0, len(test), 200)
    second = rng.integers(0, len(test), 200)
    same = test.labels[first] == test.labels[second]
    index = np.stack([np.arange(200) * 2, np.arange(200) * 2 + 1], axis=1)
    images = np.empty((400, *test.images.shape[1:]), dtype=np.uint8)
    images[0::2] = np.round(test.images[first] * 255).astype(np.uint8)
    images[1::2] = np.round(test.images[second] * 255).astype(np.uint8)
    fold = np.arange(200) * 10 // 200
    verification = VerificationSet(images, PairSet(index, same, fold))
    train = bundle.train
    limited = type(train)(train.images[:120], train.labels[:120], train.class_names)
    return (
        DatasetBundle("digits", limited, test, verification={"digits_pairs": verification}),
        verification,
    )


def test_verification_sets_are_logged_each_epoch_and_every_n_steps(tmp_path):
    bundle, verification = _bundle_with_sets()
    config = TrainConfig(
        dataset="digits", epochs=2, batch_size=40, threads=1, device="cpu", verify_every=2
    )
    trainer = Trainer(config, tmp_path / "run", bundle=bundle)
    trainer.fit()
    rows = read_history(tmp_path / "run" / "history.csv")
    assert {"digits_pairs_accuracy", "digits_pairs_accuracy_std"} <= set(rows[0])
    # the same figure as insightface's rule on the same pairs (what `marginface evaluate`
    # reports for a .bin set), recomputed here from the images as they are and mirrored
    floats = verification.images.astype(np.float32) / 255
    as_is = extract_embeddings(trainer.model, floats, device="cpu").numpy()
    mirrored = np.ascontiguousarray(floats[..., ::-1])
    flipped = extract_embeddings(trainer.model, mirrored, device="cpu").numpy()
    order = verification.pairs.index.reshape(-1)
    expected = bin_verification_metrics(
        as_is[order], verification.pairs.same, flipped=flipped[order]
    )
    assert rows[-1]["digits_pairs_accuracy"] == pytest.approx(expected.accuracy)
    assert rows[-1]["digits_pairs_accuracy_std"] == pytest.approx(expected.accuracy_std)
    steps = read_history(tmp_path / "run" / "verification.csv")
    assert [row["step"] for row in steps] == [2, 4, 6]  # 3 steps per epoch, 2 epochs
    assert all(0 <= row["digits_pairs_accuracy"] <= 1 for row in steps)


def test_step_verification_rows_come_every_verify_every_steps_in_training_mode():
    bundle, _ = _bundle_with_sets()
    config = TrainConfig(dataset="digits", device="cpu", verify_every=3)
    evaluator = EpochEvaluator(bundle, config, device=torch.device("cpu"))
    seen = []

    def verification_sets(model):
        seen.append(model.training)
        model.eval()  # as the real evaluation leaves it
        return {"digits_pairs_accuracy": 0.75, "digits_pairs_accuracy_std": 0.1}

    evaluator.verification_sets = verification_sets
    model = torch.nn.Linear(2, 2)
    assert [evaluator.step_verification(model, step) for step in (1, 2, 4, 5)] == [None] * 4
    assert seen == []
    row = evaluator.step_verification(model, 6)
    assert row == {"step": 6, "digits_pairs_accuracy": 0.75, "digits_pairs_accuracy_std": 0.1}
    assert seen == [True] and model.training  # back in training mode
    without_sets = DatasetBundle("digits", bundle.train, bundle.test)
    plain = EpochEvaluator(without_sets, config, device=torch.device("cpu"))
    assert plain.step_verification(model, 6) is None
    unset = EpochEvaluator(bundle, TrainConfig(dataset="digits"), device=torch.device("cpu"))
    assert unset.step_verification(model, 6) is None
