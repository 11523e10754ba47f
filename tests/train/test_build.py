"""What a training configuration builds around the loop (train/build.py): the process's
threads and floating-point mode, and a fresh run's initial weights."""

from __future__ import annotations

import pytest
import torch

from marginface.train.build import (
    build_training,
    configure_process,
    flushes_denormals,
    load_bundle,
    load_initial_state,
)
from marginface.train.config import config_from_dict


def test_configure_process_sets_the_threads_and_flushes_denormals():
    threads, flushing = torch.get_num_threads(), flushes_denormals()
    try:
        torch.set_flush_denormal(False)
        configure_process(1)
        assert torch.get_num_threads() == 1 and flushes_denormals()
        torch.set_num_threads(2)
        configure_process(None)  # the threads as they are
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(flushing)


def _pair(seed: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 2), torch.nn.Linear(2, 4)


def test_load_initial_state_loads_the_model_and_the_head_when_given():
    model, head = _pair(0)
    source_model, source_head = _pair(1)
    load_initial_state(model, head, {"model": source_model.state_dict()})  # new class centers
    assert torch.equal(model.weight, source_model.weight)
    assert not torch.equal(head.weight, source_head.weight)
    state = {"model": source_model.state_dict(), "loss": source_head.state_dict()}
    load_initial_state(model, head, state)
    assert torch.equal(head.weight, source_head.weight)


def test_load_initial_state_none_leaves_the_weights():
    model, head = _pair(0)
    before = [p.clone() for p in (*model.parameters(), *head.parameters())]
    load_initial_state(model, head, None)
    after = [*model.parameters(), *head.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_an_exclude_that_leaves_no_training_image_is_named():
    """``exclude`` listing every position of the (limited) training set: the error says that
    ``exclude`` emptied it, not only that the dataset has no images."""
    config = config_from_dict({"dataset": "digits", "limit": 4, "exclude": [0, 1, 2, 3]})
    bundle = load_bundle(config)
    assert len(bundle.train) == 0
    with pytest.raises(ValueError, match="no training images left: exclude leaves out all 4"):
        build_training(config, bundle, device=torch.device("cpu"))
