"""head/executor_choice.py: which executor a head's batch runs on (``impl="auto"``: dense while
its N×C·K matrices fit the memory budget, else chunked; never an executor the margin cannot
run) and the memory figures that choice reads, through the head and through the functions."""

from __future__ import annotations

import pytest
import torch

import marginface
from marginface import head as head_module
from marginface.executors.choice import BINARY_DENSE_COPIES, DENSE_LOGIT_COPIES
from marginface.head.executor_choice import (
    dense_copies,
    head_dense_step_bytes,
    head_executor,
    head_row_block_rows,
)
from marginface.margins import ArcFaceMargin, Margin, SphereFace2Margin

D = 16


class _WholeMatrixMargin(Margin):
    """A margin that overrides ``apply`` (needs the full cosine matrix: dense only)."""

    def scale_for(self, norms):
        return 1.0

    def target_cosine(self, cos_target, norms, context):
        return cos_target

    def apply(self, cosine, labels, norms=None):
        return cosine - cosine.mean(dim=1, keepdim=True)


def test_auto_picks_by_memory() -> None:
    loss_fn = marginface.ArcFaceLoss(10, D, impl="auto")
    assert loss_fn.memory_budget == head_module.DEFAULT_MEMORY_BUDGET
    assert loss_fn.executor(4) == "dense"
    # 4 copies of N×C float32 logits: N = 4, C = 10 takes 640 bytes
    assert loss_fn.dense_step_bytes(4) == head_module.DENSE_LOGIT_COPIES * 4 * 10 * 4 == 640
    tight = marginface.ArcFaceLoss(10, D, impl="auto", memory_budget=639)
    assert tight.executor(4) == "chunked"
    assert tight.executor(3) == "dense"  # 480 bytes fit
    assert marginface.ArcFaceLoss(10, D, impl="auto", memory_budget=640).executor(4) == "dense"
    assert marginface.ArcFaceLoss(10, D, impl="auto", memory_budget=0).executor(1) == "chunked"
    wide = marginface.ArcFaceLoss(10, D, impl="auto", dtype=torch.float64, memory_budget=639)
    assert wide.dense_step_bytes(2) == 640 and wide.executor(2) == "chunked"  # float64: 8 bytes
    sub = marginface.SubCenterArcFaceLoss(10, D, impl="auto", sub_centers=3, memory_budget=639)
    assert sub.dense_step_bytes(2) == 960 and sub.executor(2) == "chunked"  # N·C·K logits
    # the default budget keeps the former size rule: chunked beyond N·C = 16M in float32
    big = marginface.ArcFaceLoss(32768, 2, impl="auto")
    assert big.executor(512) == "dense" and big.executor(513) == "chunked"
    assert head_module.AUTO_CHUNKED_MIN_LOGITS == 512 * 32768
    whole = marginface.MarginSoftmaxLoss(10, D, _WholeMatrixMargin(), impl="auto", memory_budget=0)
    assert whole.executor(100) == "dense"  # auto never picks an executor the margin cannot run
    assert marginface.ArcFaceLoss(10, D, impl="dense", memory_budget=0).executor(4) == "dense"
    x, labels = torch.randn(4, D) * 8, torch.tensor([0, 9, 3, 3])
    assert torch.isfinite(loss_fn(x, labels))


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-1, ValueError),
        (1.5e9, TypeError),
        (True, TypeError),
        ("1GB", TypeError),
        (None, TypeError),
    ],
)
def test_memory_budget_is_validated(value: object, error: type) -> None:
    with pytest.raises(error, match="memory_budget"):
        marginface.ArcFaceLoss(10, D, impl="auto", memory_budget=value)  # type: ignore[arg-type]


def test_auto_counts_the_binary_dense_step_larger_than_the_softmax_one() -> None:
    """A one-vs-all dense step holds BINARY_DENSE_COPIES N×C matrices, not the softmax's
    DENSE_LOGIT_COPIES: at a budget between the two estimates (N = 64, C = 100, float32: 102,400
    and 230,400 bytes) ArcFace stays dense and SphereFace2 / UniFace go chunked."""
    budget = 200_000
    arcface = marginface.create_loss("arcface", 100, 512, impl="auto", memory_budget=budget)
    assert arcface.dense_step_bytes(64) == DENSE_LOGIT_COPIES * 64 * 100 * 4
    assert arcface.executor(64) == "dense"
    for name in ("sphereface2", "uniface"):
        head = marginface.create_loss(name, 100, 512, impl="auto", memory_budget=budget)
        assert head.dense_step_bytes(64) == BINARY_DENSE_COPIES * 64 * 100 * 4
        assert head.executor(64) == "chunked"


def test_default_row_block() -> None:
    """Default rows per block: the fewest even blocks whose products fit 256 MiB."""
    head = marginface.ArcFaceLoss(100_000, 8, impl="row_block", device="meta")
    assert head.row_block_bytes(512) == 512 * 100_000 * 4
    assert head.row_block_rows(512) == 512  # 205 MB
    assert head.row_block_rows(2048) == 512  # 4 blocks of 512
    assert head.row_block_rows(700) == 350  # 2 blocks, not 671 + 29
    bf16 = marginface.ArcFaceLoss(100_000, 8, device="meta", dtype=torch.bfloat16)
    assert bf16.row_block_bytes(1) == 200_000
    assert marginface.ArcFaceLoss(10, 8, row_block=3).row_block_rows(512) == 3
    assert head_module.DEFAULT_ROW_BLOCK_BYTES == 1 << 28


# ------------------------------------------------------------------- the functions
def test_dense_copies_by_objective():
    assert dense_copies(ArcFaceMargin()) == DENSE_LOGIT_COPIES
    assert dense_copies(SphereFace2Margin()) == BINARY_DENSE_COPIES
    assert BINARY_DENSE_COPIES > DENSE_LOGIT_COPIES


def test_dense_step_bytes_are_copies_times_rows_times_classes_times_item_size():
    # the dense math runs in float32 (float64 for a float64 weight): 4 bytes for bfloat16 too
    for dtype, size in ((torch.float32, 4), (torch.float64, 8), (torch.bfloat16, 4)):
        got = head_dense_step_bytes(3, 7, dtype, ArcFaceMargin())
        assert got == DENSE_LOGIT_COPIES * 3 * 7 * size
    assert head_dense_step_bytes(3, 7, torch.float32, SphereFace2Margin()) == (
        BINARY_DENSE_COPIES * 3 * 7 * 4
    )


def test_row_block_rows_given_then_auto_then_the_default():
    assert head_row_block_rows("auto", 5, 100, 10, torch.float32) == 5
    assert head_row_block_rows("auto", None, 100, 10, torch.float32) == 100
    assert head_row_block_rows("row_block", None, 700, 100_000, torch.float32) == 350


def test_head_executor_follows_impl_and_the_budget():
    weight = torch.zeros(10, D)
    common = {"classes": 10, "embedding_dim": D, "weight": weight, "reduction": "mean"}
    assert head_executor("dense", 4, memory_budget=0, margin=ArcFaceMargin(), **common) == "dense"
    fits = DENSE_LOGIT_COPIES * 4 * 10 * 4
    auto = {"memory_budget": fits, "margin": ArcFaceMargin(), **common}
    assert head_executor("auto", 4, **auto) == "dense"
    assert head_executor("auto", 5, **auto) == "chunked"
    whole = {"memory_budget": 0, "margin": _WholeMatrixMargin(), **common}
    assert head_executor("auto", 5, **whole) == "dense"
