"""Sub-center clean-up on a class-sharded head (2 gloo processes): each rank finds the dominant
sub-centers and outliers of its own classes, and drop_non_dominant_centers() turns its block
into K = 1, after which the sharded loss equals one process's ArcFace on the dominant centers."""

from __future__ import annotations

import torch
import torch.distributed as dist

import marginface
from marginface.subcenters import dominant_sub_centers, find_outliers, keep_dominant_centers

from .harness import run_distributed

C, K, D = 5, 2, 4


def _data():
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(C * K, D, generator=generator, dtype=torch.float64)
    labels = torch.arange(24) % C
    embeddings = torch.randn(24, D, generator=generator, dtype=torch.float64) * 2
    return embeddings, labels, weight


def _check(rank: int, world: int) -> None:
    x, labels, full = _data()
    head = marginface.SubCenterArcFaceLoss(
        C, D, sub_centers=K, process_group=dist.group.WORLD, dtype=torch.float64
    )
    head.load_state_dict({"weight": full})
    start, stop = head.class_range
    expected = dominant_sub_centers(x, labels, full, K)  # (C,), one process, all classes
    assert torch.equal(head.dominant_sub_centers(x, labels), expected[start:stop])
    found = head.find_outliers(x, labels, threshold_degrees=60)
    everything = find_outliers(x, labels, full, K, threshold_degrees=60)
    mine = (labels[everything.indices] >= start) & (labels[everything.indices] < stop)
    assert torch.equal(found.indices, everything.indices[mine])
    assert bool(torch.isnan(found.angles[(labels < start) | (labels >= stop)]).all())

    head.drop_non_dominant_centers(expected)  # the global vector: the head takes its block
    kept = keep_dominant_centers(full, expected, K)  # (C, D)
    assert head.sub_centers == 1 and torch.equal(head.weight.detach(), kept[start:stop])
    reference = marginface.ArcFaceLoss(C, D, dtype=torch.float64)
    reference.load_state_dict({"weight": kept})
    rows = slice(0, 10) if rank == 0 else slice(10, 24)
    torch.testing.assert_close(head(x[rows], labels[rows]), reference(x, labels))


def test_sharded_dominance_outliers_and_drop():
    run_distributed(_check, 2)
