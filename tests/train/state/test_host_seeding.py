"""A run seeds Python's ``random`` and NumPy's global generator from its seed and rank, so host
draws (a user's augmentation or callback) repeat from one launch to the next, and a resumed run
continues the same streams (train/state/step_position.py, ``seed_host_generators``)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from marginface.cli import main
from marginface.train import Trainer, load_checkpoint
from marginface.train.state.layout import CHECKPOINT_NAME
from marginface.train.state.step_position import host_seed, seed_host_generators

TINY = [
    "--dataset", "digits", "--limit", "60", "--batch-size", "20", "--threads", "1",
    "--device", "cpu", "--embedding-dim", "3",
]  # fmt: skip


def _drawing_steps(monkeypatch: pytest.MonkeyPatch, draws: list[tuple[float, float]]) -> None:
    """Every step draws once from each host generator, as a user's augmentation would."""
    original = Trainer._train_step

    def drawing(self, *args):
        draws.append((random.random(), float(np.random.random())))
        return original(self, *args)

    monkeypatch.setattr(Trainer, "_train_step", drawing)


def _train(run: Path, *extra: str) -> int:
    return main(["--quiet", "train", *TINY, "--epochs", "2", "--out", str(run), *extra])


def _host_state(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / CHECKPOINT_NAME)["host_rng"]


def test_host_seed_is_per_rank_and_checks_its_arguments():
    assert host_seed(0, 0) != host_seed(0, 1) != host_seed(1, 0)
    assert 0 <= host_seed(2**40, 3) < 2**32
    with pytest.raises(TypeError, match="seed"):
        host_seed(1.5, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank"):
        host_seed(0, -1)


def test_seeding_repeats_the_draws():
    seed_host_generators(7, 1)
    first = (random.random(), np.random.random())
    random.random(), np.random.random()
    seed_host_generators(7, 1)
    assert (random.random(), np.random.random()) == first
    seed_host_generators(7, 0)
    assert (random.random(), np.random.random()) != first


def test_two_runs_of_one_command_draw_the_same_host_numbers(tmp_path, monkeypatch):
    draws: list[tuple[float, float]] = []
    _drawing_steps(monkeypatch, draws)
    random.seed(1)  # whatever the process drew before must not matter
    assert _train(tmp_path / "a") == 0
    first, draws[:] = list(draws), []
    random.seed(2)
    np.random.seed(3)
    assert _train(tmp_path / "b") == 0
    assert draws == first and len(first) == 6
    for name, value in _host_state(tmp_path / "a").items():
        assert torch.equal(value, _host_state(tmp_path / "b")[name]), name
    draws[:] = []
    assert _train(tmp_path / "c", "--seed", "5") == 0
    assert draws != first


def test_a_resumed_run_continues_the_host_streams(tmp_path, monkeypatch):
    draws: list[tuple[float, float]] = []
    _drawing_steps(monkeypatch, draws)
    assert _train(tmp_path / "straight") == 0
    straight = list(draws)
    draws[:] = []
    run = tmp_path / "run"
    assert main(["--quiet", "train", *TINY, "--epochs", "1", "--out", str(run)]) == 0
    random.seed(11)  # the process's state between the two launches must not matter
    assert _train(run, "--resume") == 0
    assert draws == straight
    for name, value in _host_state(run).items():
        assert torch.equal(value, _host_state(tmp_path / "straight")[name]), name
