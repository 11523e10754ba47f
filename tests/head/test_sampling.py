"""head/sampling.py: Partial FC's classes of a step, as a plain function (no head needed).

insightface's rule restated: every positive of the batch is kept, then uniformly drawn
negatives up to ``⌊rate·c⌋`` classes; the targets are positions in the sorted sample.
"""

from __future__ import annotations

import torch

from marginface.head.sampling import classes_of_step, sampled_centers

CPU = torch.device("cpu")


def test_every_class_at_rate_one_and_minus_one_outside_the_block():
    labels = torch.tensor([0, 4, 5, 9, 7])
    targets, sampled = classes_of_step(labels, (5, 10), 1.0, CPU)
    assert sampled is None
    assert targets.tolist() == [-1, -1, 0, 4, 2]


def test_positives_first_then_negatives_up_to_the_rate():
    torch.manual_seed(0)
    labels = torch.tensor([3, 3, 8])
    targets, sampled = classes_of_step(labels, (0, 10), 0.5, CPU)
    assert sampled is not None and sampled.numel() == 5  # ⌊0.5·10⌋
    assert sampled.tolist() == sorted(set(sampled.tolist()))  # sorted, no repeats
    assert {3, 8} <= set(sampled.tolist())
    assert sampled[targets].tolist() == labels.tolist()  # targets are positions in the sample


def test_more_positives_than_the_rate_keeps_the_positives_only():
    labels = torch.tensor([1, 2, 5, 6])
    targets, sampled = classes_of_step(labels, (0, 8), 0.25, CPU)  # ⌊0.25·8⌋ = 2 < 4
    assert sampled.tolist() == [1, 2, 5, 6]
    assert targets.tolist() == [0, 1, 2, 3]


def test_a_sharded_block_samples_its_own_classes_only():
    torch.manual_seed(1)
    labels = torch.tensor([0, 6, 9, 2])
    targets, sampled = classes_of_step(labels, (5, 10), 0.6, CPU)  # 3 of the block's 5
    assert sampled.numel() == 3 and {1, 4} <= set(sampled.tolist())
    assert targets[0] == -1 and targets[3] == -1
    assert (sampled[targets[1:3]] + 5).tolist() == [6, 9]


def test_sampled_centers_are_the_rows_of_the_sample_with_their_sub_centers():
    weight = torch.arange(6 * 2 * 3, dtype=torch.float32).reshape(12, 3)  # C = 6, K = 2, D = 3
    assert sampled_centers(weight, None, 2) is weight
    picked = sampled_centers(weight, torch.tensor([1, 4]), 2)
    assert torch.equal(picked, torch.cat([weight[2:4], weight[8:10]]))
