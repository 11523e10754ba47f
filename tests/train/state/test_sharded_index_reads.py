"""A sharded checkpoint's index (DCP's ``.metadata``) is read from disk once per restore: the
bytes hashed to check the sidecar's sha256 are the ones parsed, and the listing of the tensors
and DCP's load reuse that parse.

The sharded checkpoint is written by the trainer's own save path (``save_run_state(...,
distributed=True)``) in one process: ``torch.distributed`` is told it is rank 0 of 1, and
DCP then saves without collectives (its documented single-process mode)."""

from __future__ import annotations

import builtins
import pathlib
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from marginface.cli import main
from marginface.train import load_checkpoint, load_run, train
from marginface.train.config import TrainConfig
from marginface.train.state.run_state import (
    CHECKPOINT_NAME,
    read_saved_run,
    save_run_state,
)
from marginface.train.state.sharded_checkpoint import (
    INDEX_NAME,
    SHARDED_CHECKPOINT_NAME,
    read_sharded_checkpoint,
)


def tiny(epochs: int) -> TrainConfig:
    return TrainConfig(
        limit=120,
        batch_size=60,
        threads=1,
        device="cpu",
        epochs=epochs,
        loss="arcface",
        optimizer="sgd",
        lr=0.05,
        model_options={"widths": [4, 4, 8]},
    )


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory) -> Path:
    """A one-epoch run whose checkpoint is the sharded folder (copy it before changing it)."""
    run = tmp_path_factory.mktemp("sharded") / "run"
    trainer = train(tiny(1), run)
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():  # rank 0 of 1
        patch.setattr(dist, "get_rank", lambda *args, **kwargs: 0)
        patch.setattr(dist, "get_world_size", lambda *args, **kwargs: 1)
        patch.setattr(dist, "barrier", lambda *args, **kwargs: None)
        warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
        save_run_state(
            run,
            trainer._objects(),
            epoch=1,
            config=trainer.config,
            meta=trainer.meta,
            history=trainer.history,
            distributed=True,
        )
    assert (run / SHARDED_CHECKPOINT_NAME / INDEX_NAME).is_file()
    assert not (run / CHECKPOINT_NAME).exists()
    return run


@pytest.fixture
def index_reads(monkeypatch) -> list[str]:
    """Every opening for reading of a file named ``.metadata`` from now on (its path), through
    ``pathlib.Path.open`` (``read_bytes``, DCP's file system) or ``open``."""
    reads: list[str] = []
    real_path_open, real_open = pathlib.Path.open, builtins.open

    def note(file: object, mode: str) -> None:
        if Path(str(file)).name == INDEX_NAME and "r" in mode and "+" not in mode:
            reads.append(str(file))

    def path_open(self, mode="r", *args, **kwargs):
        note(self, mode)
        return real_path_open(self, mode, *args, **kwargs)

    def plain_open(file, mode="r", *args, **kwargs):
        note(file, mode)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", path_open)
    monkeypatch.setattr(builtins, "open", plain_open)
    return reads


def test_the_counter_sees_every_way_the_index_is_read(sharded_run, index_reads):
    index = sharded_run / SHARDED_CHECKPOINT_NAME / INDEX_NAME
    index.read_bytes()
    with open(index, "rb"):
        pass
    with index.open("rb"):
        pass
    assert index_reads == [str(index)] * 3


def test_restoring_a_sharded_checkpoint_reads_its_index_once(sharded_run, tmp_path, index_reads):
    run = Path(shutil.copytree(sharded_run, tmp_path / "run"))
    index = str(run / SHARDED_CHECKPOINT_NAME / INDEX_NAME)
    assert main(["--quiet", "train", "--out", str(run), "--resume", "--epochs", "2"]) == 0
    assert index_reads == [index]  # verification, listing and the resharded load: one read
    assert load_checkpoint(run / CHECKPOINT_NAME)["epoch"] == 2
    # what was restored is what was saved: the same weights as a run never interrupted
    uninterrupted = train(tiny(2), tmp_path / "uninterrupted")
    resumed = load_checkpoint(run / CHECKPOINT_NAME)
    for key, value in uninterrupted.model.state_dict().items():
        assert torch.equal(resumed["model"][key], value), key
    assert torch.equal(resumed["loss"]["weight"], uninterrupted.head.weight.detach())


def test_loading_a_sharded_run_reads_its_index_once(sharded_run, index_reads):
    index = str(sharded_run / SHARDED_CHECKPOINT_NAME / INDEX_NAME)
    loaded = load_run(sharded_run)
    assert index_reads == [index]
    assert [row["epoch"] for row in loaded.history] == [1]


def test_a_saved_run_lists_and_loads_from_the_index_it_verified(sharded_run, index_reads):
    saved = read_saved_run(sharded_run)
    assert len(index_reads) == 1
    checkpoint = saved.sharded_checkpoint
    assert checkpoint is not None and checkpoint.sidecar is saved.contents
    entries = checkpoint.entries()
    size, dtype = entries["loss/weight"]  # [C, K·D], K = 1
    assert tuple(size) == (saved.meta["num_classes"], saved.train_config().embedding_dim)
    assert dtype == torch.float32
    assert checkpoint.index() is checkpoint.index()  # parsed once
    filled = checkpoint.load({}, distributed=False)
    assert set(filled) == set(entries) and len(index_reads) == 1


def test_an_index_changed_after_verification_is_not_read(sharded_run, tmp_path, index_reads):
    """The bytes parsed are the bytes verified: replacing ``.metadata`` afterwards changes
    nothing (it is not read again)."""
    run = Path(shutil.copytree(sharded_run, tmp_path / "run"))
    checkpoint = read_sharded_checkpoint(run)
    (run / SHARDED_CHECKPOINT_NAME / INDEX_NAME).write_bytes(b"not an index")
    assert "loss/weight" in checkpoint.entries()
    assert len(index_reads) == 1
