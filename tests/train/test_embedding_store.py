"""The run's evaluation embeddings kept in RUN/embeddings: reused when they are the
checkpoint's weights', embedded again when missing, stale or damaged."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from tests.train.test_verification_sets import _bundle_with_sets

from marginface.data.base import DatasetBundle
from marginface.train import Trainer, evaluate_model, evaluate_run
from marginface.train.config import TrainConfig
from marginface.train.embedding_store import (
    EmbeddingStore,
    data_fingerprint,
    stored_embeddings,
    weights_fingerprint,
)
from marginface.train.evaluation import evaluate as evaluate_module
from marginface.train.state.layout import EMBEDDINGS_NAME


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(3),
    )


@pytest.fixture
def spy(monkeypatch) -> list[int]:
    """Counts the calls of the embedding functions the evaluation uses (the test set's, and the
    verification sets' flip test kept apart: one pass for both halves)."""
    calls: list[int] = []

    def counting(original):
        def count(*args, **kwargs):
            calls.append(1)
            return original(*args, **kwargs)

        return count

    for name in ("extract_embeddings", "extract_embeddings_and_flipped"):
        monkeypatch.setattr(evaluate_module, name, counting(getattr(evaluate_module, name)))
    return calls


def test_the_weights_fingerprint_follows_every_weight_and_buffer() -> None:
    model = small_model()
    model(torch.zeros(1, 1, 8, 8))  # materialize the lazy layer
    copied = copy.deepcopy(model)
    assert weights_fingerprint(copied) == weights_fingerprint(model)
    copied.to(memory_format=torch.channels_last)  # the same numbers, another layout
    assert weights_fingerprint(copied) == weights_fingerprint(model)
    with torch.no_grad():
        weight = copied[0].weight
        weight[0, 0, 0, 0] = torch.nextafter(weight[0, 0, 0, 0], torch.tensor(2.0))  # one ulp
    assert weights_fingerprint(copied) != weights_fingerprint(model)
    other = copy.deepcopy(model)
    other[1].running_mean += 1  # a buffer, not a parameter
    assert weights_fingerprint(other) != weights_fingerprint(model)


def test_the_weights_fingerprint_wants_a_module() -> None:
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got dict"):
        weights_fingerprint({"weight": torch.zeros(1)})


def test_the_data_fingerprint_sees_the_images_and_the_labels() -> None:
    images = np.arange(1000 * 4, dtype=np.uint8).reshape(1000, 4)
    labels = np.arange(1000) % 7
    base = data_fingerprint(images, labels)
    assert data_fingerprint(images.copy(), labels.copy()) == base
    assert data_fingerprint(images[:-1], labels[:-1]) != base
    changed = labels.copy()
    changed[500] += 1
    assert data_fingerprint(images, changed) != base
    other = images.copy()
    other[0, 0] += 1  # row 0 is always among the sampled rows
    assert data_fingerprint(other, labels) != base


def test_kept_arrays_come_back_only_for_the_same_weights_and_key(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.train.embedding_store")
    arrays = {"embeddings": np.arange(12, dtype=np.float32).reshape(4, 3)}
    store = EmbeddingStore(tmp_path, "a" * 32, epoch=3)
    key = {"flip": False, "amp": "None", "data": "d"}
    store.save("test", key, arrays)
    found = store.load("test", key)
    assert found is not None and np.array_equal(found["embeddings"], arrays["embeddings"])
    assert found["embeddings"].dtype == np.float32
    assert EmbeddingStore(tmp_path, "b" * 32).load("test", key) is None
    assert store.load("test", {**key, "flip": True}) is None
    assert store.load("bin_lfw", key) is None  # missing
    said = [r.getMessage() for r in caplog.records]
    assert any("embeddings of epoch 3, reused" in m for m in said)
    assert any("other weights (epoch 3): embedding again" in m for m in said)
    assert any("a different flip (epoch 3)" in m for m in said)


@pytest.mark.parametrize("damage", [b"not a zip file", None])
def test_a_damaged_file_is_embedded_again_and_rewritten(tmp_path, damage, caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.train.embedding_store")
    store = EmbeddingStore(tmp_path, "a" * 32)
    key = {"flip": False}
    store.save("test", key, {"embeddings": np.ones((2, 3), dtype=np.float32)})
    path = store.path("test")
    path.write_bytes(damage if damage is not None else path.read_bytes()[:40])  # truncated
    assert store.load("test", key) is None
    assert "cannot be read" in caplog.text
    computed = store.get_or_compute("test", key, lambda: {"embeddings": np.zeros((2, 3))})
    assert np.array_equal(computed["embeddings"], np.zeros((2, 3)))
    again = store.load("test", key)
    assert again is not None and np.array_equal(again["embeddings"], np.zeros((2, 3)))


def test_a_store_that_cannot_write_warns_and_goes_on(tmp_path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    store = EmbeddingStore(blocker / EMBEDDINGS_NAME, "a" * 32)
    computed = store.get_or_compute("test", {}, lambda: {"x": np.ones(2)})
    assert np.array_equal(computed["x"], np.ones(2))
    assert "could not keep the embeddings in" in caplog.text


def test_a_write_only_store_never_reads(tmp_path) -> None:
    writer = EmbeddingStore(tmp_path, "a" * 32, read=False)
    writer.save("test", {}, {"x": np.ones(2)})
    computed = writer.get_or_compute("test", {}, lambda: {"x": np.zeros(2)})
    assert np.array_equal(computed["x"], np.zeros(2))  # computed although a match is kept
    assert np.array_equal(EmbeddingStore(tmp_path, "a" * 32).load("test", {})["x"], np.zeros(2))


def test_no_store_computes() -> None:
    arrays = stored_embeddings(
        None, "test", lambda: {"x": np.ones(1)}, flip=False, amp_dtype=None, data=(np.ones(1),)
    )
    assert np.array_equal(arrays["x"], np.ones(1))


def test_a_training_run_keeps_what_evaluate_and_plot_read(tmp_path, spy) -> None:
    bundle, _ = _bundle_with_sets()
    config = TrainConfig(dataset="digits", epochs=1, batch_size=40, threads=1, device="cpu")
    Trainer(config, tmp_path / "run", bundle=bundle).fit()
    kept = sorted(p.name for p in (tmp_path / "run" / EMBEDDINGS_NAME).iterdir())
    assert kept == ["bin_digits_pairs.npz", "test.npz"]
    spy.clear()
    fresh = evaluate_run(tmp_path / "run", bundle=bundle)
    assert len(spy) == 1  # without reuse: the test set embedded
    spy.clear()
    reused = evaluate_run(tmp_path / "run", bundle=bundle, reuse_embeddings=True)
    assert spy == []  # the run's own embeddings
    assert reused.metrics == fresh.metrics
    assert np.array_equal(reused.embeddings, fresh.embeddings)


def test_bin_sets_are_read_back_with_the_same_numbers(tmp_path, spy) -> None:
    bundle, _ = _bundle_with_sets()
    test = bundle.test
    empty = type(test)(test.images[:0], test.labels[:0], test.class_names)
    only_bins = DatasetBundle("digits", bundle.train, empty, verification=bundle.verification)
    model = small_model()
    model(torch.zeros(1, 1, 8, 8))
    head = torch.nn.Identity()
    store = EmbeddingStore.for_model(tmp_path, model)

    def evaluate():
        return evaluate_model(
            model, head, only_bins, flip=True, batch_size=64, device="cpu", store=store
        )

    first = evaluate()
    assert len(spy) == 1  # as is and flipped, in one pass
    assert store.path("bin_digits_pairs").is_file()
    spy.clear()
    second = evaluate()
    assert spy == [] and second.metrics == first.metrics
    with torch.no_grad():
        model[0].bias += 0.1  # new weights: the kept embeddings are stale
    store = EmbeddingStore.for_model(tmp_path, model)
    third = evaluate()
    assert len(spy) == 1 and third.metrics != first.metrics
