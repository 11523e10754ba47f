"""head/state.py: the checkpoint layout of an unsharded head, one row per class ``[C, K·D]``
sharing storage with the weight, and the load hook that accepts either layout (the sharded
DTensor layout, saved at one world size and loaded at another, runs under torchrun in
tests/distributed/test_sharded_extras.py)."""

from __future__ import annotations

import pytest
import torch

import marginface
from marginface.head.state import (
    class_rows,
    class_state_view,
    per_class_parameters,
    reshardable_state_dict,
)

C, K, D = 5, 3, 4


def test_reshardable_state_dict_views_the_weight_one_row_per_class():
    head = marginface.SubCenterArcFaceLoss(C, D, sub_centers=K)
    state = reshardable_state_dict(head)
    rows = state["weight"]
    assert tuple(rows.shape) == (C, K * D)
    assert rows.data_ptr() == head.weight.data_ptr()  # shares storage: a load writes in place
    for c in range(C):  # class c's K sub-centers side by side
        assert torch.equal(rows[c], head.weight.detach()[c * K : (c + 1) * K].reshape(-1))
    with torch.no_grad():
        rows.zero_()
    assert not head.weight.detach().any()


def test_a_k_equals_one_head_is_its_state_dict():
    head = marginface.ArcFaceLoss(C, D)
    state, plain = reshardable_state_dict(head), head.state_dict()
    assert state.keys() == plain.keys()
    assert all(torch.equal(state[key], plain[key]) for key in plain)


def test_reshardable_state_dict_refuses_what_is_not_a_head():
    with pytest.raises(TypeError, match="loss must be a MarginSoftmaxLoss, got Linear"):
        reshardable_state_dict(torch.nn.Linear(2, 2))


def test_class_rows_and_class_state_view_of_optimizer_state():
    head = marginface.create_loss("adam-softmax", C, D)
    momentum = torch.arange(C * D, dtype=torch.float32).reshape(C, D)
    rows = class_rows(momentum, head)
    assert tuple(rows.shape) == (C, D) and rows.data_ptr() == momentum.data_ptr()
    assert class_state_view(momentum, head, "weight").data_ptr() == momentum.data_ptr()
    parameters = per_class_parameters(head)
    assert set(parameters) == {"weight", "class_parameters.margin"}
    assert parameters["weight"] is head.weight
    vector = class_state_view(torch.ones(C, 1), head, "class_parameters.margin")
    assert tuple(vector.shape) == (C,)


def test_a_load_accepts_the_per_class_layout_and_the_plain_one():
    source = marginface.SubCenterArcFaceLoss(C, D, sub_centers=K)
    target = marginface.SubCenterArcFaceLoss(C, D, sub_centers=K)
    rows = {key: value.clone() for key, value in reshardable_state_dict(source).items()}
    target.load_state_dict(rows)  # [C, K·D] back to [C·K, D]
    assert torch.equal(target.weight.detach(), source.weight.detach())
    other = marginface.SubCenterArcFaceLoss(C, D, sub_centers=K)
    other.load_state_dict(source.state_dict())  # the plain layout
    assert torch.equal(other.weight.detach(), source.weight.detach())
