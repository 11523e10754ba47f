"""The trainer on digits: determinism, bit-identical resume, NaN handling, run directories."""

from __future__ import annotations

import math

import pytest
import torch

from marginface.train import (
    CheckpointError,
    OutputExistsError,
    Trainer,
    TrainingDivergedError,
    evaluate_run,
    load_checkpoint,
    load_run,
    read_history,
    save_checkpoint,
    train,
)
from marginface.train.config import TrainConfig


def quick(**overrides: object) -> TrainConfig:
    values: dict[str, object] = {
        "limit": 256,
        "epochs": 3,
        "batch_size": 64,
        "threads": 1,
        "lr": 3e-3,
        "loss": "curricularface",
    }
    values.update(overrides)
    return TrainConfig(**values)


def state_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_history_has_loss_state_columns_and_checkpoint_has_buffers(tmp_path):
    trainer = train(quick(), tmp_path / "run")
    rows = read_history(tmp_path / "run" / "history.csv")
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    assert {"loss", "val_loss", "accuracy", "lr", "seconds", "t"} <= set(rows[0])
    # CurricularFace's t is the margin's buffer, advanced by training.
    assert rows[-1]["t"] == pytest.approx(float(trainer.loss.margin.t))
    assert rows[-1]["t"] != 0.0
    state = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert "margin.t" in state["loss"] and state["epoch"] == 3
    assert (tmp_path / "run" / "config.toml").is_file()


def test_adacos_logs_its_scale(tmp_path):
    trainer = train(quick(loss="adacos", epochs=1), tmp_path / "run")  # no scale passed
    assert trainer.history[0]["scale"] == pytest.approx(float(trainer.loss.margin.scale))


def test_same_seed_same_weights_other_seed_differs(tmp_path):
    a = train(quick(epochs=2), tmp_path / "a").model.state_dict()
    b = train(quick(epochs=2), tmp_path / "b").model.state_dict()
    c = train(quick(epochs=2, seed=1), tmp_path / "c").model.state_dict()
    assert state_equal(a, b)
    assert not state_equal(a, c)


@pytest.mark.parametrize("augment", [{}, {"translate": 1.0, "rotate": 8.0, "hflip": 0.5}])
def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, augment):
    config = quick(
        epochs=4, schedule="cosine", warmup_epochs=1.0, model="seed-cnn-bn", augment=augment
    )
    full = train(config, tmp_path / "full")

    def interrupt(row: dict) -> None:
        if row["epoch"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Trainer(config, tmp_path / "cut", callbacks=[interrupt]).fit()
    assert load_checkpoint(tmp_path / "cut" / "checkpoint.pt")["epoch"] == 2
    resumed = train(config, tmp_path / "cut", resume=True)
    assert state_equal(full.model.state_dict(), resumed.model.state_dict())
    assert state_equal(full.loss.state_dict(), resumed.loss.state_dict())
    rows = read_history(tmp_path / "cut" / "history.csv")
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["loss"] == pytest.approx(full.history[-1]["loss"], rel=0, abs=0)


def test_augmentation_changes_training_and_is_seeded(tmp_path):
    augment = {"translate": 1.0, "rotate": 10.0}
    plain = train(quick(epochs=1), tmp_path / "plain").model.state_dict()
    a = train(quick(epochs=1, augment=augment), tmp_path / "a").model.state_dict()
    b = train(quick(epochs=1, augment=augment), tmp_path / "b").model.state_dict()
    assert state_equal(a, b)
    assert not state_equal(a, plain)


def test_resume_refuses_a_checkpoint_from_another_configuration(tmp_path):
    train(quick(epochs=1), tmp_path / "run")
    with pytest.raises(CheckpointError, match=r"another configuration.*embedding_dim"):
        train(quick(epochs=2, embedding_dim=2), tmp_path / "run", resume=True)


def test_resume_without_a_run_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="cannot resume"):
        train(quick(epochs=1), tmp_path / "missing", resume=True)


def test_existing_output_directory_is_refused_unless_overwrite(tmp_path):
    train(quick(epochs=1), tmp_path / "run")
    before = (tmp_path / "run" / "checkpoint.pt").read_bytes()
    with pytest.raises(OutputExistsError, match=r"--resume.*--overwrite"):
        train(quick(epochs=1), tmp_path / "run")
    assert (tmp_path / "run" / "checkpoint.pt").read_bytes() == before
    train(quick(epochs=1, seed=5), tmp_path / "run", overwrite=True)
    assert (tmp_path / "run" / "checkpoint.pt").read_bytes() != before


def test_nan_loss_stops_clearly_and_keeps_the_last_good_checkpoint(tmp_path):
    def poison(row: dict) -> None:
        if row["epoch"] == 1:
            with torch.no_grad():
                trainer.model.fc.weight.fill_(math.nan)

    trainer = Trainer(quick(), tmp_path / "run", callbacks=[poison])
    expected = r"model\.fc\.weight became non-finite at epoch 2, step 1.*epoch 1 is kept.*--resume"
    with pytest.raises(TrainingDivergedError, match=expected):
        trainer.fit()
    state = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert state["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    assert len(read_history(tmp_path / "run" / "history.csv")) == 1


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    train(quick(epochs=1), tmp_path / "run")
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_run(tmp_path / "run")


def test_checkpoint_that_does_not_fit_its_configuration(tmp_path):
    train(quick(epochs=1), tmp_path / "run")
    path = tmp_path / "run" / "checkpoint.pt"
    state = load_checkpoint(path)
    state["config"]["embedding_dim"] = 2
    save_checkpoint(state, path)
    with pytest.raises(CheckpointError, match="does not match"):
        load_run(tmp_path / "run")


def test_a_checkpoint_edited_behind_its_checksum_is_refused(tmp_path):
    train(quick(epochs=1), tmp_path / "run")
    path = tmp_path / "run" / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    state["config"]["embedding_dim"] = 2
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt is damaged.*sha256"):
        load_run(tmp_path / "run")


def test_training_learns_digits_and_evaluation_agrees(tmp_path):
    config = quick(limit=None, epochs=6, model="seed-cnn-bn", model_options={"dropout": 0.1})
    trainer = train(config, tmp_path / "run")
    assert trainer.history[-1]["accuracy"] > 0.8
    result = evaluate_run(tmp_path / "run", device="cpu")
    # Closed-set accuracy from the evaluation module equals the trainer's own (same argmax).
    assert result.metrics["accuracy"] == pytest.approx(trainer.history[-1]["accuracy"])
    assert result.metrics["verification_accuracy"] > 0.8
    assert 0.5 < result.metrics["auc"] <= 1.0
    assert result.embeddings.shape == (360, 3)


def test_flip_averaged_embeddings_differ_but_keep_shape(tmp_path):
    train(quick(epochs=1), tmp_path / "run")
    plain = evaluate_run(tmp_path / "run", device="cpu", flip=False).embeddings
    flipped = evaluate_run(tmp_path / "run", device="cpu", flip=True).embeddings
    assert plain.shape == flipped.shape
    assert not (plain == flipped).all()


def test_fp16_on_cpu_is_refused(tmp_path):
    with pytest.raises(ValueError, match="fp16"):
        train(quick(amp="fp16", device="cpu"), tmp_path / "run")


def test_bf16_autocast_and_grad_clip_train(tmp_path):
    trainer = train(quick(amp="bf16", grad_clip=1.0, epochs=1), tmp_path / "run")
    assert math.isfinite(trainer.history[0]["loss"])


def test_overwrite_never_deletes_an_unrelated_folder(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(OutputExistsError, match="refusing to delete"):
        train(quick(epochs=1), tmp_path / "mine", overwrite=True)
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


def test_evaluation_with_pairs_of_a_single_fold(tmp_path):
    """LFW with one test fold: every pair has the same fold id; evaluation must still work."""
    import dataclasses

    import numpy as np

    from marginface.data import PairSet, load_dataset
    from marginface.data.pairs import sample_pairs

    train(quick(epochs=1), tmp_path / "run")
    bundle = load_dataset("digits")
    sampled = sample_pairs(bundle.test.labels, 400, seed=0)
    one_fold = PairSet(sampled.index, sampled.same, np.full(len(sampled), 3, dtype=np.int64))
    result = evaluate_run(
        tmp_path / "run", device="cpu", bundle=dataclasses.replace(bundle, pairs=one_fold)
    )
    assert 0.0 <= result.metrics["verification_accuracy"] <= 1.0
    assert result.metrics["pairs"] == 400


def test_open_set_runs_log_verification_of_their_test_pairs_each_epoch(tmp_path):
    """Open-set data (test identities unseen in training) has no closed-set accuracy: each
    epoch logs the verification accuracy and AUC of the test pairs, which agree with
    ``evaluate_run`` on the final checkpoint."""
    import dataclasses

    from marginface.data import load_dataset
    from marginface.data.pairs import sample_pairs

    bundle = load_dataset("digits")
    pairs = sample_pairs(bundle.test.labels, 600, seed=0)
    open_set = dataclasses.replace(bundle, pairs=pairs, open_set=True)
    trainer = Trainer(quick(epochs=2, flip=True), tmp_path / "run", bundle=open_set)
    history = trainer.fit()
    for row in history:
        assert math.isnan(row["accuracy"]) and math.isnan(row["val_loss"])
        assert 0.5 < row["verification_accuracy"] <= 1.0
        assert 0.5 < row["auc"] <= 1.0
    logged = read_history(tmp_path / "run" / "history.csv")
    assert logged[-1]["verification_accuracy"] == pytest.approx(
        history[-1]["verification_accuracy"]
    )
    final = evaluate_run(tmp_path / "run", device="cpu", bundle=open_set)  # the run's flip
    assert final.metrics["verification_accuracy"] == pytest.approx(
        history[-1]["verification_accuracy"], abs=1e-9
    )
    assert final.metrics["auc"] == pytest.approx(history[-1]["auc"], abs=1e-6)


@pytest.mark.parametrize("before", [False, True])
def test_fit_restores_the_floating_point_mode_it_found(tmp_path, before):
    """The trainer flushes denormals while it trains (faster CPU convolutions) and leaves the
    process as it found it: a later subnormal float is still representable (hypothesis checks
    exactly this) unless the caller had asked for flushing."""
    from marginface.train.trainer import flushes_denormals

    torch.set_flush_denormal(before)
    try:
        seen: list[bool] = []
        trainer = Trainer(quick(epochs=1, limit=64), tmp_path / "run", progress="none")
        trainer.callbacks.append(lambda *args, **kwargs: seen.append(flushes_denormals()))
        trainer.fit()
        assert seen == [True]  # during training
        assert flushes_denormals() is before
        tiny = torch.full((1,), 1e-39)
        assert (tiny * 1.0).item() == (0.0 if before else tiny.item())
    finally:
        torch.set_flush_denormal(False)
