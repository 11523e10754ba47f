"""A trained run loaded back (``train/state/loaded_run.py``): the backbone and head rebuilt from
the checkpoint, the same builder for a training run and a loaded one, and nothing of the
training loop imported to open a run folder (what lets ``inference/`` use it, issue 45)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from marginface.train import CheckpointError, train
from marginface.train.build import run_meta
from marginface.train.config import TrainConfig
from marginface.train.state.layout import CHECKPOINT_NAME
from marginface.train.state.loaded_run import (
    build_model_and_loss,
    load_run,
    model_and_loss_for_meta,
)

SRC = Path(__file__).resolve().parents[3] / "src"

LOOP = (
    "marginface.train.trainer",
    "marginface.train.build",
    "marginface.train.batches",
    "marginface.train.optim",
    "marginface.train.evaluation",
)
"""The training loop's modules: opening a run folder imports none of them."""


def tiny(**overrides: object) -> TrainConfig:
    values: dict[str, object] = {
        "limit": 120,
        "batch_size": 60,
        "threads": 1,
        "device": "cpu",
        "epochs": 1,
        "model_options": {"widths": [4, 4, 8]},
    }
    values.update(overrides)
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished one-epoch run (read only)."""
    run = tmp_path_factory.mktemp("loaded") / "run"
    train(tiny(), run)
    return run


def test_load_run_gives_the_checkpoints_weights_in_eval_mode(trained):
    run = load_run(trained)
    state = torch.load(trained / CHECKPOINT_NAME, weights_only=False)
    assert not run.model.training and not run.head.training and run.head is run.loss
    assert run.epoch == 1 and [row["epoch"] for row in run.history] == [1]
    assert run.config.to_dict() == tiny().resolved().to_dict()
    for key, value in state["model"].items():
        assert torch.equal(run.model.state_dict()[key], value), key
    assert torch.equal(run.head.weight.detach(), state["loss"]["weight"])


def test_load_run_names_a_folder_without_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match=rf"no checkpoint in {tmp_path}"):
        load_run(tmp_path)


def test_model_and_loss_for_meta_is_the_builder_sized_by_the_meta(trained):
    """A checkpoint's meta reads ``image_size`` back as a list; the tuple gives the same model."""
    run = load_run(trained)
    meta = dict(run.meta)
    size = meta["image_size"]
    as_tuple = tuple(size) if isinstance(size, list) else (size, size)  # (H, W)
    torch.manual_seed(3)
    model, head = model_and_loss_for_meta(run.config, {**meta, "image_size": list(as_tuple)})
    torch.manual_seed(3)
    direct_model, direct_head = build_model_and_loss(
        run.config,
        in_channels=meta["in_channels"],
        image_size=as_tuple,
        num_classes=meta["num_classes"],
    )
    assert model.state_dict().keys() == direct_model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert torch.equal(value, direct_model.state_dict()[key]), key
    assert torch.equal(head.weight, direct_head.weight)
    assert head.weight.shape[0] == meta["num_classes"]


def test_build_model_and_loss_passes_the_sample_rate_to_the_head():
    config = tiny(sample_rate=0.5).resolved()
    _, head = build_model_and_loss(config, in_channels=1, image_size=28, num_classes=10)
    assert head.sample_rate == 0.5
    assert head.weight.shape == (10, config.embedding_dim)


def test_run_meta_is_what_model_and_loss_for_meta_reads():
    """The meta a training run records (:func:`run_meta`) sizes the builder."""
    from marginface.train.build import load_bundle

    config = tiny().resolved()
    meta = run_meta(load_bundle(config))
    model, head = model_and_loss_for_meta(config, json.loads(json.dumps(meta)))
    assert head.weight.shape == (meta["num_classes"], config.embedding_dim)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_opening_a_run_folder_imports_nothing_of_the_training_loop(trained):
    """``open_model(RUN)`` (inference) and ``load_run`` rebuild the model without importing
    the trainer, the training setup, the batches, the optimizer or the evaluation."""
    code = (
        "import sys\n"
        "from marginface.inference import open_model\n"
        "module, description = open_model(sys.argv[1])\n"
        "assert description is not None\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(trained)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    modules = set(done.stdout.split())
    assert "marginface.train.state.loaded_run" in modules  # the check sees what was loaded
    loop = sorted(m for m in modules if m in LOOP or m.startswith(tuple(f"{x}." for x in LOOP)))
    assert loop == [], f"opening a run folder imported the training loop: {loop}"
