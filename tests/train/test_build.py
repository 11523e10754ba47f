"""What a training configuration builds around the loop (train/build.py): the process's
threads and floating-point mode, and a fresh run's initial weights."""

from __future__ import annotations

import torch

from marginface.train.build import configure_process, flushes_denormals, load_initial_state


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
