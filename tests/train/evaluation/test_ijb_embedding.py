"""A model's embeddings of the IJB crops and their cache
(:mod:`marginface.train.evaluation.ijb_embedding`), on the ORL-built IJB folder."""

from __future__ import annotations

import numpy as np
import pytest
from tests._ijb_folder import projection_embedder

from marginface.data.ijb import read_ijb_layout
from marginface.train.evaluation.ijb_embedding import embed_ijb_images

cv2 = pytest.importorskip("cv2")
sklearn_metrics = pytest.importorskip("sklearn.metrics")
PIL = pytest.importorskip("PIL.Image")


def test_layout_alignment_and_cache(ijb_folder, tmp_path):
    root, originals = ijb_folder
    layout = read_ijb_layout(root, "IJBC")
    assert len(layout.names) == 32 and layout.pair_label.sum() == 8
    assert set(layout.galleries) == {"G1", "G2"} and layout.probes[0].shape == (8,)
    crops = []
    embed = projection_embedder()

    def recording(x):
        crops.append(x)
        return embed(x)

    embeddings, flipped = embed_ijb_images(
        layout, recording, batch_size=16, cache=tmp_path / "f.npz"
    )
    assert embeddings.shape == (32, 37) and flipped.shape == (32, 37)
    # the aligned crop is the face the loose crop was made from (the known transform undone)
    first = ((crops[0][0].permute(1, 2, 0).numpy() * 0.5 + 0.5) * 255).round()
    original = originals[layout.names[0]].astype(np.float64)
    assert np.abs(first - original)[8:-8, 8:-8].mean() < 6.0

    # a second evaluation reads the cache and embeds nothing
    def refuse(x):
        raise AssertionError("embedded again")

    again, again_flipped = embed_ijb_images(layout, refuse, cache=tmp_path / "f.npz")
    np.testing.assert_array_equal(again, embeddings)
    np.testing.assert_array_equal(again_flipped, flipped)


def test_insightface_crops_cached_with_the_old_template_are_embedded_again(ijb_folder, tmp_path):
    """The "insightface" crops follow eval_ijbc.py's template now: features cached under the
    key they had before (``KEY|align=insightface``) are not read back for them."""
    root, _ = ijb_folder
    layout = read_ijb_layout(root, "IJBC")
    cache = tmp_path / "f.npz"
    embed = projection_embedder()
    # the file as the old code left it: written under the old key
    embed_ijb_images(
        layout, embed, cache=cache, cache_key="m|align=insightface", alignment="float64"
    )
    calls = []

    def counting(x):
        calls.append(x.shape[0])
        return embed(x)

    embed_ijb_images(layout, counting, cache=cache, cache_key="m", alignment="insightface")
    assert sum(calls) == 2 * len(layout.names)  # every image and its flip embedded again
    calls.clear()
    embed_ijb_images(layout, counting, cache=cache, cache_key="m", alignment="insightface")
    assert calls == []  # the new key reads back


def test_a_cache_of_the_earlier_format_is_still_read_back(ijb_folder, tmp_path):
    """A features file of the cache's earlier format (``embeddings``, ``flipped`` and
    ``names_digest``: SHA-256 of the key and the names, one a line) is read back, not embedded
    again: IJB-C's takes hours."""
    import hashlib

    layout = read_ijb_layout(ijb_folder[0], "IJBC")
    embeddings, flipped = embed_ijb_images(layout, projection_embedder())
    key = "m|align=insightface|template=eval_ijbc"
    digest = hashlib.sha256("\n".join([key, *layout.names]).encode()).hexdigest()
    cache = tmp_path / "f.npz"
    np.savez(cache, embeddings=embeddings + 1, flipped=flipped + 1, names_digest=digest)

    def refuse(x):
        raise AssertionError("embedded again")

    again, again_flipped = embed_ijb_images(layout, refuse, cache=cache, cache_key="m")
    np.testing.assert_array_equal(again, embeddings + 1)
    np.testing.assert_array_equal(again_flipped, flipped + 1)
    calls = []

    def counting(x):
        calls.append(x.shape[0])
        return projection_embedder()(x)

    embed_ijb_images(layout, counting, cache=cache, cache_key="other")  # other weights
    assert sum(calls) == 2 * len(layout.names)
