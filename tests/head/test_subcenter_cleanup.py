"""head/subcenter_cleanup.py: a head's sub-center clean-up (its dominant sub-centers, outliers,
and the step to one center per class) against the plain functions of marginface.subcenters
(tested by hand in tests/test_subcenters.py), and the mapping of a class block onto them."""

from __future__ import annotations

import pytest
import torch

import marginface
from marginface.head.subcenter_cleanup import dominant_only, outliers_of_all, own_samples
from marginface.subcenters import dominant_sub_centers, find_outliers

C, K, D = 4, 3, 5


def _problem(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(C * K, D, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, C, (40,), generator=generator)
    embeddings = torch.randn(40, D, generator=generator, dtype=torch.float64) * 3
    return embeddings, labels, weight


def test_drop_non_dominant_centers_turns_the_head_into_k_equals_one():
    embeddings, labels, _ = _problem(2)
    head = marginface.SubCenterArcFaceLoss(C, D, sub_centers=K, dtype=torch.float64)
    before = head.weight.detach().clone()
    dominant = head.dominant_sub_centers(embeddings, labels)
    assert torch.equal(dominant, dominant_sub_centers(embeddings, labels, before, K))
    head.drop_non_dominant_centers(dominant)
    assert head.sub_centers == 1 and tuple(head.weight.shape) == (C, D)
    assert head.weight.requires_grad and head.weight.dtype == torch.float64
    expected = torch.stack([before[c * K + int(k)] for c, k in enumerate(dominant)])
    assert torch.equal(head.weight.detach(), expected)
    # the K = 1 head is an ArcFace head on the dominant centers
    arc = marginface.ArcFaceLoss(C, D, dtype=torch.float64)
    with torch.no_grad():
        arc.weight.copy_(expected)
    torch.testing.assert_close(head(embeddings, labels), arc(embeddings, labels))
    assert "sub_centers" not in repr(head)
    with pytest.raises(ValueError, match=r"one center per class already \(sub_centers = 1\)"):
        head.drop_non_dominant_centers(dominant)


def test_head_find_outliers_matches_the_function():
    embeddings, labels, _ = _problem(3)
    head = marginface.SubCenterArcFaceLoss(C, D, sub_centers=K, dtype=torch.float64)
    found = head.find_outliers(embeddings, labels, threshold_degrees=60)
    direct = find_outliers(embeddings, labels, head.weight, K, threshold_degrees=60)
    assert torch.equal(found.indices, direct.indices) and found.indices.numel() > 0
    torch.testing.assert_close(found.angles, direct.angles)


def test_a_head_with_no_sample_in_its_classes_names_its_block():
    embeddings, _, _ = _problem()
    head = marginface.SubCenterArcFaceLoss(C, D, sub_centers=K, dtype=torch.float64)
    head.class_range = (0, 2)  # as a sharded head holding classes 0 and 1
    with pytest.raises(ValueError, match=r"no sample has a label in this head's classes \[0, 2\)"):
        head.dominant_sub_centers(embeddings[:3], torch.tensor([2, 3, 3]))


# ------------------------------------------------------------------- the functions
def test_own_samples_unsharded_is_every_sample_without_a_copy():
    embeddings, labels, _ = _problem()
    positions, x, local = own_samples(
        embeddings, labels, embedding_dim=D, class_range=(0, C), num_classes=C
    )
    assert positions.tolist() == list(range(40)) and x is embeddings
    assert local.tolist() == labels.tolist()


def test_own_samples_of_a_block_are_its_labels_shifted_to_local():
    embeddings, labels, _ = _problem(1)
    positions, x, local = own_samples(
        embeddings, labels, embedding_dim=D, class_range=(2, 4), num_classes=C
    )
    expected = [i for i, y in enumerate(labels.tolist()) if 2 <= y < 4]
    assert positions.tolist() == expected and 0 < len(expected) < 40
    assert torch.equal(x, embeddings[expected])
    assert local.tolist() == [labels[i].item() - 2 for i in expected]


def test_outliers_of_all_reports_against_every_sample_with_nan_elsewhere():
    embeddings, labels, weight = _problem(2)
    positions, x, local = own_samples(
        embeddings, labels, embedding_dim=D, class_range=(2, 4), num_classes=C
    )
    block = weight[2 * K : 4 * K]
    found = outliers_of_all(positions, x, local, block, K, total=40, threshold_degrees=60)
    direct = find_outliers(x, local, block, K, threshold_degrees=60)
    assert found.angles.shape == (40,) and found.angles.dtype == torch.float64
    others = [i for i in range(40) if i not in positions.tolist()]
    assert torch.isnan(found.angles[others]).all()
    torch.testing.assert_close(found.angles[positions], direct.angles)
    assert found.indices.tolist() == positions[direct.indices].tolist()


def test_dominant_only_takes_the_block_of_a_global_vector_when_sharded():
    _, _, weight = _problem(3)
    block = weight[2 * K : 4 * K]  # classes 2 and 3
    dominant = torch.tensor([0, 1, 2, 1])  # every class's
    kept = dominant_only(block, dominant, K, class_range=(2, 4), num_classes=C, sharded=True)
    assert torch.equal(kept, torch.stack([block[0 * K + 2], block[1 * K + 1]]))
    local = dominant_only(block, dominant[2:], K, class_range=(2, 4), num_classes=C, sharded=True)
    assert torch.equal(local, kept)
    with pytest.raises(ValueError, match=r"one center per class already \(sub_centers = 1\)"):
        dominant_only(weight[:C], dominant, 1, class_range=(0, C), num_classes=C, sharded=False)
    with pytest.raises(ValueError, match=r"dominant must have shape \(2,\)"):
        dominant_only(block, dominant, K, class_range=(2, 4), num_classes=C, sharded=False)
