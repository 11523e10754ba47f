"""benchmarks/bench_mnist_seed.py's recipes are the example configurations, read from them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from marginface.train.config import load_config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    path = REPO / "benchmarks" / "bench_mnist_seed.py"
    spec = importlib.util.spec_from_file_location("bench_mnist_seed_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("name", "example"), [("best", "mnist_best"), ("seed", "mnist_seed")])
def test_recipe_is_the_example_file(bench, name, example):
    example_config = load_config(REPO / "examples" / f"{example}.toml")
    config = bench.recipe(name, epochs=example_config.epochs, seed=0)
    expected = load_config(
        REPO / "examples" / f"{example}.toml", {"dataset_options": {"download": False}}
    )
    assert config == expected  # amp included: bf16 for best, none for seed
    assert config.amp == {"best": "bf16", "seed": "none"}[name]


def test_recipe_overrides(bench):
    config = bench.recipe("best", epochs=3, seed=2, amp="none", hidden=0, augment={}, lr=1e-3)
    assert (config.epochs, config.seed, config.amp, config.lr) == (3, 2, "none", 1e-3)
    assert config.model_options == {"dropout": 0.1} and config.augment == {}
    with pytest.raises(ValueError, match="recipe must be one of seed, best, got 'fast'"):
        bench.recipe("fast", epochs=1, seed=0)
