"""train/state/class_state.py: which checkpoint entries hold the optimizer state of a head's
per-class parameters in the layout of its parameter, and which (a block of one rank, the layout
of checkpoints written before that state was sharded by class) cannot be resharded."""

from __future__ import annotations

import torch

import marginface
from marginface.train.state.class_state import class_state_positions, class_state_targets

C, D = 10, 4


def _head_and_optimizer():
    head = marginface.create_loss("adam-softmax", C, D)
    extra = torch.nn.Parameter(torch.zeros(3))  # not per-class: position 0
    optimizer = torch.optim.Adam([{"params": [extra]}, {"params": list(head.parameters())}])
    return head, optimizer


def test_positions_name_the_per_class_parameters_in_optimizer_order():
    head, optimizer = _head_and_optimizer()
    positions = class_state_positions(optimizer, head)
    names = [name for name, _ in head.named_parameters()]
    expected = {1 + i: name for i, name in enumerate(names) if name in positions.values()}
    assert positions == expected
    assert set(positions.values()) == {"weight", "class_parameters.margin"}


def test_entries_in_the_parameter_layout_get_holders_and_a_one_rank_block_is_stale():
    head, optimizer = _head_and_optimizer()
    positions = {
        name: position for position, name in class_state_positions(optimizer, head).items()
    }
    margin, weight = positions["class_parameters.margin"], positions["weight"]
    targets = {
        "loss/weight": torch.empty(C, D),
        "loss/class_parameters.margin": torch.empty(C),
    }
    entries = {
        f"optimizer/{weight}/exp_avg": (torch.Size([C, D]), torch.float32),
        f"optimizer/{weight}/step": (torch.Size([]), torch.float32),  # replicated scalar
        f"optimizer/{margin}/exp_avg": (torch.Size([C]), torch.float32),
        f"optimizer/{margin}/exp_avg_sq": (torch.Size([C]), torch.float64),
    }
    holders, stale = class_state_targets(entries, targets, optimizer, head)
    assert stale == {}
    assert set(holders) == {
        f"optimizer/{weight}/exp_avg",
        f"optimizer/{margin}/exp_avg",
        f"optimizer/{margin}/exp_avg_sq",
    }
    assert holders[f"optimizer/{margin}/exp_avg_sq"].dtype == torch.float64
    assert targets[f"optimizer/{weight}/exp_avg"].shape == (C, D)  # the class-rows view
    assert targets[f"optimizer/{margin}/exp_avg"].shape == (C,)

    # rank 0's block of 5 margins, as checkpoints wrote it before: stale, no holder or target
    old = {f"optimizer/{margin}/exp_avg": (torch.Size([C // 2]), torch.float32)}
    targets = {"loss/weight": torch.empty(C, D), "loss/class_parameters.margin": torch.empty(C)}
    holders, stale = class_state_targets(old, targets, optimizer, head)
    assert stale == {margin: "class_parameters.margin"} and holders == {}
    assert f"optimizer/{margin}/exp_avg" not in targets
