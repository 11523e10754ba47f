"""The value checks of the loss API (finite embeddings, labels in range): one read back to the
host per step, and none after ``set_value_checks(False)``, so that a step on a GPU never waits
for the device (``_validation.set_value_checks``, ``check_values``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import marginface
from marginface._validation import (
    check_embeddings,
    check_labels,
    check_values,
    set_value_checks,
    value_checks_enabled,
)
from tests._host_reads import counted_reads


@pytest.fixture()
def unchecked() -> Iterator[None]:
    previous = set_value_checks(False)
    yield
    set_value_checks(previous)


def test_switch_returns_previous_and_restores() -> None:
    assert value_checks_enabled()
    assert set_value_checks(False) is True
    try:
        assert not value_checks_enabled()
        assert set_value_checks(False) is False
    finally:
        set_value_checks(True)
    assert value_checks_enabled()


def test_switch_rejects_a_non_bool() -> None:
    with pytest.raises(TypeError, match=r"enabled must be a bool, got 0 \(int\)"):
        set_value_checks(0)
    assert value_checks_enabled()


def test_one_read_for_a_batch() -> None:
    x, labels = torch.randn(6, 3), torch.tensor([0, 4, 2, 1, 3, 0])
    with counted_reads() as reads:
        check_values(x, labels, 5)
    assert reads == ["tolist"]


def test_a_head_step_reads_once_then_never() -> None:
    """The dense executor reads nothing else; the cuBLAS chunk loop (``kernels="torch"``, the
    CPU's) reads its own data-dependent branches, which the switch leaves alone."""
    torch.manual_seed(0)
    for impl in ("dense", "chunked"):
        head = marginface.ArcFaceLoss(7, 4, impl=impl)
        x = torch.randn(5, 4, requires_grad=True)
        labels = torch.tensor([0, 6, 2, 2, 5])
        with counted_reads() as checked:
            expected = head(x, labels)
            expected.backward()
        previous = set_value_checks(False)
        try:
            with counted_reads() as unchecked:
                loss = head(x, labels)
                loss.backward()
        finally:
            set_value_checks(previous)
        assert checked[0] == "tolist" and unchecked == checked[1:], (impl, checked, unchecked)
        if impl == "dense":
            assert unchecked == []
        torch.testing.assert_close(loss, expected, rtol=0, atol=0)


def test_the_joint_check_raises_the_same_errors() -> None:
    x = torch.randn(3, 2)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\] for num_classes = 4, got 4"):
        check_values(x, torch.tensor([0, 4, 1]), 4)
    with pytest.raises(ValueError, match="got -2"):
        check_values(x, torch.tensor([0, -2, 1]), 4)
    bad = x.clone()
    bad[1, 0] = float("nan")
    bad[2, 1] = float("inf")
    with pytest.raises(ValueError, match=r"non-finite values \(NaN or inf\) in 2 row\(s\)"):
        check_values(bad, torch.tensor([0, 9, 1]), 4)  # the embeddings' error first
    with pytest.raises(ValueError, match="in 2 row"):
        check_values(bad, torch.zeros(0, dtype=torch.int64), 4)
    check_values(x, torch.tensor([3, 0, 2]), 4)


def test_unchecked_skips_values_not_types_or_shapes(unchecked) -> None:
    nan = torch.full((2, 3), float("nan"))
    assert check_embeddings(nan, 3) is nan
    assert check_labels(torch.tensor([0, 9]), 2, 4).tolist() == [0, 9]
    check_values(nan, torch.tensor([0, 9]), 4)
    with pytest.raises(TypeError, match="labels must have an integer dtype"):
        check_labels(torch.tensor([0.0, 1.0]), 2, 4)
    with pytest.raises(ValueError, match=r"embedding_dim = 3.*got shape \(2, 4\)"):
        check_embeddings(torch.zeros(2, 4), 3)
    head = marginface.ArcFaceLoss(5, 3)
    assert torch.isnan(head(nan, torch.tensor([0, 1])))  # the NaN reaches the loss


def test_label_range_read_once() -> None:
    with counted_reads() as reads:
        assert check_labels(torch.tensor([2, 0, 1], dtype=torch.uint8), 3, 3).dtype == torch.int64
    assert reads == ["tolist"]
