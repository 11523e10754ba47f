"""The one embedding cache (issue 45): a file is reused for the same key and only for it;
each part of the key changed embeds again; a damaged file embeds again with a warning naming
it. Every answer is compared with embeddings computed directly by the one embedder."""

from __future__ import annotations

import copy
import dataclasses
import zipfile

import numpy as np
import pytest
import torch

from marginface.inference.embedder import embed_batch
from marginface.inference.embedding_cache import (
    CachedEmbeddings,
    EmbeddingKey,
    cached_embeddings,
    file_fingerprint,
    model_fingerprint,
    names_fingerprint,
    preprocessing_of,
    read_embedding_cache,
    write_embedding_cache,
)
from marginface.inference.fingerprint import data_fingerprint
from marginface.models.description import ModelDescription


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(144, 5)
    )


IMAGES = np.random.default_rng(0).integers(0, 256, (6, 1, 8, 8), dtype=np.uint8)


def _direct(model: torch.nn.Module, flip: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """f(x) and f(flip_w(x)), computed by the one embedder, no cache."""
    with torch.no_grad():
        plain, mirrored = embed_batch(
            model.eval(), torch.from_numpy(IMAGES), normalise=lambda x: x.float() / 255, flip=flip
        )
    return plain.numpy(), None if mirrored is None else mirrored.numpy()


def _key(model: torch.nn.Module, flip: bool = True) -> EmbeddingKey:
    return EmbeddingKey(
        model_fingerprint(model),
        {"mean": [0.0], "std": [1.0]},
        "None",
        flip,
        data_fingerprint(IMAGES),
    )


class Counting:
    """``compute`` of the cache: the direct embeddings, counted."""

    def __init__(self, model: torch.nn.Module, flip: bool = True) -> None:
        self.model, self.flip, self.calls = model, flip, 0

    def __call__(self) -> CachedEmbeddings:
        self.calls += 1
        return CachedEmbeddings(*_direct(self.model, self.flip))


def test_the_same_key_reads_back_what_was_computed(tmp_path) -> None:
    model, path = _model(), tmp_path / "e.npz"
    first = Counting(model)
    cached_embeddings(path, _key(model), first)
    again = Counting(copy.deepcopy(model))  # a copy of the weights: the same key
    found = cached_embeddings(path, _key(again.model), again)
    assert (first.calls, again.calls) == (1, 0)
    plain, mirrored = _direct(model, True)
    np.testing.assert_array_equal(found.embeddings, plain)
    np.testing.assert_array_equal(found.flipped, mirrored)
    np.testing.assert_array_equal(found.averaged(), (plain + mirrored) / 2)  # float32 both


def test_a_flipped_file_answers_the_plain_request_too(tmp_path) -> None:
    model, path = _model(), tmp_path / "e.npz"
    cached_embeddings(path, _key(model, flip=True), Counting(model))
    plain = Counting(model, flip=False)
    found = cached_embeddings(path, _key(model, flip=False), plain)
    assert plain.calls == 0 and found.flipped is None
    np.testing.assert_array_equal(found.averaged(), _direct(model, False)[0])
    flipping = Counting(model, flip=True)  # a plain file does not answer the flip test
    cached_embeddings(tmp_path / "p.npz", _key(model, flip=False), Counting(model, flip=False))
    found = cached_embeddings(tmp_path / "p.npz", _key(model, flip=True), flipping)
    assert flipping.calls == 1
    np.testing.assert_array_equal(found.flipped, _direct(model, True)[1])


def _other_weights(key: EmbeddingKey) -> tuple[EmbeddingKey, torch.nn.Module]:
    model = _model()
    with torch.no_grad():
        model[2].bias += 0.5
    return dataclasses.replace(key, weights=model_fingerprint(model)), model


@pytest.mark.parametrize(
    "part", ["weights", "mean", "std", "colour", "input_size", "precision", "images"]
)
def test_each_part_of_the_key_changed_embeds_again(tmp_path, part) -> None:
    model, path = _model(), tmp_path / "e.npz"
    key = _key(model)
    cached_embeddings(path, key, Counting(model))
    other_model = model
    if part == "weights":
        other, other_model = _other_weights(key)
    elif part in ("mean", "std", "colour", "input_size"):
        other = dataclasses.replace(key, preprocessing={**key.preprocessing, part: "other"})
    elif part == "precision":
        other = dataclasses.replace(key, precision=str(torch.bfloat16))
    else:
        other = dataclasses.replace(key, images=data_fingerprint(IMAGES[::-1]))
    compute = Counting(other_model)
    found = cached_embeddings(path, other, compute)
    assert compute.calls == 1
    np.testing.assert_array_equal(found.embeddings, _direct(other_model, True)[0])
    back = Counting(model)  # the file now holds the other key's
    cached_embeddings(path, other, back)
    assert back.calls == 0


@pytest.mark.parametrize(
    "damage", ["truncated", "not_npz", "no_flipped", "wrong_rows", "nan", "bad_key"]
)
def test_a_damaged_file_embeds_again_with_a_warning_naming_it(tmp_path, damage) -> None:
    model, path = _model(), tmp_path / "e.npz"
    key = _key(model)
    cached_embeddings(path, key, Counting(model))
    plain, mirrored = _direct(model, True)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "not_npz":
        path.write_text("hello")
    else:
        with np.load(path) as stored:
            arrays = dict(stored)
        if damage == "no_flipped":
            del arrays["flipped"]
        elif damage == "wrong_rows":
            arrays["embeddings"], arrays["flipped"] = plain[:-1], mirrored[:-1]
        elif damage == "nan":
            arrays["flipped"] = np.full_like(mirrored, np.nan)
        else:
            arrays["__key__"] = np.asarray("[1, 2]")
        np.savez(path, **arrays)
    compute = Counting(model)
    with pytest.warns(UserWarning, match=rf"{path}: damaged embedding cache"):
        found = cached_embeddings(path, key, compute, rows=len(IMAGES))
    assert compute.calls == 1
    np.testing.assert_array_equal(found.embeddings, plain)
    with zipfile.ZipFile(path) as archive:  # rewritten whole
        assert {"__key__.npy", "embeddings.npy", "flipped.npy"} <= set(archive.namelist())
    assert read_embedding_cache(path, key, rows=len(IMAGES)) is not None


def test_no_path_computes_and_writes_nothing(tmp_path) -> None:
    compute = Counting(_model())
    found = cached_embeddings(None, _key(compute.model), compute)
    assert compute.calls == 1 and found.flipped is not None
    assert list(tmp_path.iterdir()) == []


def test_the_flip_of_the_key_must_match_the_halves(tmp_path) -> None:
    model = _model()
    with pytest.raises(ValueError, match="key.flip is True but flipped is None"):
        write_embedding_cache(tmp_path / "e.npz", _key(model), CachedEmbeddings(np.ones((1, 2))))


def test_the_key_parts_and_the_fingerprints() -> None:
    assert names_fingerprint(["a", "b"]) != names_fingerprint(["b", "a"])  # the rows' order
    description = ModelDescription(
        "seed-cnn", 3, in_channels=1, image_size=(8, 8), colour="grey", mean=0.4
    )
    assert preprocessing_of(description) == {
        "mean": [0.4],
        "std": [0.5],
        "colour": "grey",
        "in_channels": 1,
        "input_size": [8, 8],
        "face_crop": None,
    }
    model = _model()
    assert model_fingerprint(copy.deepcopy(model)) == model_fingerprint(model)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        model_fingerprint({"weight": torch.zeros(1)})


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_onnx_graph_is_keyed_by_its_file(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from marginface.models.pretrained import OnnxBackbone

    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 5)).eval()
        path = tmp_path / f"m{seed}.onnx"
        torch.onnx.export(
            net, (torch.zeros(1, 3, 4, 4),), str(path), input_names=["x"], dynamo=False
        )
        paths.append(path)
    first, second = (OnnxBackbone(p, image_size=4) for p in paths)
    assert model_fingerprint(first) != model_fingerprint(second)  # no state_dict: the bytes
    assert model_fingerprint(first).startswith("onnx:" + file_fingerprint(paths[0]))
