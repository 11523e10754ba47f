"""The softmax-form losses of FaceX-Zoo / face.evoLVe / OpenSphere (issue 25) on 2 gloo ranks,
in one spawn: the class-sharded head under DDP equals one process (float64 and float32), and
Partial FC (sampled classes read in place) equals the dense path on every rank's sampled
classes (float64, 1e-12)."""

from __future__ import annotations

from .harness import run_distributed
from .test_partial_fc_in_place_sharded import _check as _check_partial_fc
from .test_sharded_head import _check_invariant

NEW_LOSSES = ["mv-am-softmax", "mv-arc-softmax", "li-arcface", "circle", "arcnegface"]


def _check_all(rank: int, world: int) -> None:
    _check_invariant(rank, world, NEW_LOSSES, "sgd")
    for name in NEW_LOSSES:
        _check_partial_fc(rank, world, name)


def test_sharded_and_partial_fc_equal_one_process_on_2_ranks() -> None:
    run_distributed(_check_all, 2, deadline_s=240)
