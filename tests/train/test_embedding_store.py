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
from marginface.inference.embedding_cache import CachedEmbeddings
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


def _key(store: EmbeddingStore, **changes):
    options = {"flip": False, "amp_dtype": None, "data": (np.arange(6).reshape(2, 3),)}
    return store.key(**{**options, **changes})


def test_kept_arrays_come_back_only_for_the_same_weights_and_key(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.inference.embedding_cache")
    embeddings = np.arange(12, dtype=np.float32).reshape(4, 3)
    store = EmbeddingStore(tmp_path, "a" * 32, epoch=3)
    store.save("test", _key(store), CachedEmbeddings(embeddings))
    found = store.load("test", _key(store))
    assert found is not None and np.array_equal(found.embeddings, embeddings)
    assert found.embeddings.dtype == np.float32
    other = EmbeddingStore(tmp_path, "b" * 32)
    assert other.load("test", _key(other)) is None
    assert store.load("test", _key(store, flip=True)) is None
    assert store.load("test", _key(store, amp_dtype=torch.bfloat16)) is None
    assert store.load("test", _key(store, data=(np.zeros((2, 3)),))) is None
    assert store.load("bin_lfw", _key(store)) is None  # missing
    said = [r.getMessage() for r in caplog.records]
    assert any("embeddings reused" in m for m in said)
    assert any("(weights differ)" in m for m in said)
    assert any("(flip differ)" in m for m in said)
    assert any("(precision differ)" in m for m in said)
    assert any("(images differ)" in m for m in said)


def test_a_file_written_before_the_one_cache_is_embedded_again_once(tmp_path) -> None:
    """RUN/embeddings files of the store's earlier format (its own key) are not read back:
    embedded again, then the rewritten file is reused."""
    import json

    store = EmbeddingStore(tmp_path, "a" * 32)
    key = _key(store)
    old = {"name": "test", "weights": "a" * 32, "flip": False, "amp": "None", "data": key.images}
    old_key = json.dumps({**old, "epoch": 1, "arrays": ["embeddings"]})
    np.savez(store.path("test"), __key__=np.asarray(old_key), embeddings=np.ones((2, 3)))
    calls: list[int] = []

    def compute() -> CachedEmbeddings:
        calls.append(1)
        return CachedEmbeddings(np.zeros((2, 3), np.float32))

    assert np.array_equal(store.get_or_compute("test", key, compute).embeddings, np.zeros((2, 3)))
    assert np.array_equal(store.get_or_compute("test", key, compute).embeddings, np.zeros((2, 3)))
    assert calls == [1]


@pytest.mark.parametrize("damage", [b"not a zip file", None])
def test_a_damaged_file_is_embedded_again_and_rewritten(tmp_path, damage, caplog) -> None:
    store = EmbeddingStore(tmp_path, "a" * 32)
    key = _key(store)
    store.save("test", key, CachedEmbeddings(np.ones((2, 3), dtype=np.float32)))
    path = store.path("test")
    path.write_bytes(damage if damage is not None else path.read_bytes()[:40])  # truncated
    assert store.load("test", key) is None
    assert f"{path}: damaged embedding cache, cannot be read" in caplog.text
    assert caplog.records[-1].levelno == logging.WARNING
    computed = store.get_or_compute(
        "test", key, lambda: CachedEmbeddings(np.zeros((2, 3), np.float32))
    )
    assert np.array_equal(computed.embeddings, np.zeros((2, 3)))
    again = store.load("test", key)
    assert again is not None and np.array_equal(again.embeddings, np.zeros((2, 3)))


def test_a_store_that_cannot_write_warns_and_goes_on(tmp_path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    store = EmbeddingStore(blocker / EMBEDDINGS_NAME, "a" * 32)
    computed = store.get_or_compute("test", _key(store), lambda: CachedEmbeddings(np.ones((1, 2))))
    assert np.array_equal(computed.embeddings, np.ones((1, 2)))
    assert "could not keep the embeddings in" in caplog.text


def test_a_write_only_store_never_reads(tmp_path) -> None:
    writer = EmbeddingStore(tmp_path, "a" * 32, read=False)
    key = _key(writer)
    writer.save("test", key, CachedEmbeddings(np.ones((1, 2), np.float32)))
    computed = writer.get_or_compute("test", key, lambda: CachedEmbeddings(np.zeros((1, 2))))
    assert np.array_equal(computed.embeddings, np.zeros((1, 2)))  # computed though kept
    reader = EmbeddingStore(tmp_path, "a" * 32)
    assert np.array_equal(reader.load("test", key).embeddings, np.zeros((1, 2)))


def test_no_store_computes() -> None:
    kept = stored_embeddings(
        None,
        "test",
        lambda: CachedEmbeddings(np.ones((1, 1))),
        flip=False,
        amp_dtype=None,
        data=(np.ones(1),),
    )
    assert np.array_equal(kept.embeddings, np.ones((1, 1)))


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


@pytest.mark.parametrize("flip", [True, False])
def test_the_test_set_through_the_store_equals_the_direct_embeddings(tmp_path, flip) -> None:
    """Computed or read back, the test embeddings are bit for bit extract_embeddings'."""
    from marginface.train.embeddings import extract_embeddings

    bundle, _ = _bundle_with_sets()
    model = small_model()
    model(torch.zeros(1, 1, 8, 8))
    direct = extract_embeddings(model, bundle.test.images, batch_size=64, flip=flip).numpy()
    store = EmbeddingStore.for_model(tmp_path, model)
    from marginface import ArcFaceLoss

    head = ArcFaceLoss(num_classes=len(bundle.test.class_names), embedding_dim=3)
    options = dict(flip=flip, batch_size=64, device="cpu", store=store)
    for _ in range(2):  # computed, then read back
        evaluation = evaluate_model(model, head, bundle, **options)
        assert np.array_equal(evaluation.embeddings, direct)
    assert store.path("test").is_file()
