"""`marginface train` on 2 gloo processes (as torchrun would start it), resumed at another world
size: 2 → 1 and 1 → 2, restoring exactly what was saved."""

from __future__ import annotations

import pathlib
from pathlib import Path

import torch
import torch.distributed as dist

from marginface.cli import main
from marginface.train import Trainer, load_checkpoint, load_run, read_history
from marginface.train.config import TrainConfig
from marginface.train.state import sharded_checkpoint
from marginface.train.state.run_state import read_saved_run
from marginface.train.state.sharded_checkpoint import (
    INDEX_NAME,
    SHARDED_CHECKPOINT_NAME,
    center_state_position,
    read_sidecar,
)

from .harness import run_distributed

ARGS = [
    "--dataset", "digits", "--limit", "120", "--batch-size", "40", "--threads", "1",
    "--device", "cpu", "--loss", "arcface", "--optimizer", "sgd", "--lr", "0.05",
    "--set", "model_options={widths=[4,4,8]}",
]  # fmt: skip


def _config(epochs: int) -> TrainConfig:
    return TrainConfig(
        dataset="digits",
        limit=120,
        batch_size=40,
        threads=1,
        device="cpu",
        loss="arcface",
        optimizer="sgd",
        lr=0.05,
        model_options={"widths": [4, 4, 8]},
        epochs=epochs,
    )


def _gathered_state(trainer: Trainer) -> dict:
    """Model, full class centers and their full momentum, gathered from every rank."""
    weight = trainer.loss.weight.detach()
    momentum = trainer.optimizer.state[trainer.loss.weight]["momentum_buffer"]
    blocks = [None] * dist.get_world_size()
    dist.all_gather_object(blocks, (weight.clone(), momentum.clone()))
    return {
        "model": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "weight": torch.cat([b[0] for b in blocks]),
        "momentum": torch.cat([b[1] for b in blocks]),
    }


def _train_two_ranks(rank: int, world: int, run: str) -> None:
    assert main(["--quiet", "train", *ARGS, "--epochs", "2", "--out", run]) == 0
    trainer = Trainer(_config(2), run)  # what the ranks hold at the end, to compare
    trainer._init_distributed()
    trainer._setup()
    index_reads: list[Path] = []  # DCP's index, opened by this rank
    real_open = pathlib.Path.open

    def counting_open(self: Path, mode: str = "r", *args, **kwargs):
        if self.name == INDEX_NAME and "r" in mode:
            index_reads.append(self)
        return real_open(self, mode, *args, **kwargs)

    pathlib.Path.open = counting_open
    try:
        trainer._restore(read_saved_run(run))
    finally:
        pathlib.Path.open = real_open
    assert len(index_reads) == 1, index_reads  # verified, listed and loaded from one read
    state = _gathered_state(trainer)
    if rank == 0:
        torch.save(state, Path(run).parent / "two_ranks.pt")


def _resume_two_ranks(rank: int, world: int, run: str) -> None:
    saved = load_checkpoint(Path(run) / "checkpoint.pt")  # written by one process
    trainer = Trainer(_config(4), run)
    trainer._init_distributed()
    trainer._setup()
    assert trainer._restore(read_saved_run(run)) == 3
    start, stop = trainer.loss.class_range
    assert torch.equal(trainer.loss.weight.detach(), saved["loss"]["weight"][start:stop])
    index = center_state_position(trainer.optimizer, trainer.head)
    momentum = saved["optimizer"]["state"][index]["momentum_buffer"]
    restored = trainer.optimizer.state[trainer.loss.weight]["momentum_buffer"]
    assert torch.equal(restored, momentum[start:stop])
    for key, value in saved["model"].items():
        assert torch.equal(trainer.model.state_dict()[key], value), key
    assert main(["--quiet", "train", "--out", run, "--resume", "--epochs", "4"]) == 0


def test_two_ranks_then_one_then_two(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    run_distributed(_train_two_ranks, 2, str(run), deadline_s=180)
    sidecar = read_sidecar(run)
    assert sidecar["epoch"] == 2 and sidecar["meta"]["world_size"] == 2
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]
    assert not (run / "checkpoint.pt").exists()

    # 2 -> 1: one process restores exactly what the two ranks held
    expected = torch.load(tmp_path / "two_ranks.pt", weights_only=True)
    trainer = Trainer(_config(2), run)
    trainer._init_distributed()
    trainer._setup()
    assert trainer._restore(read_saved_run(run)) == 2
    assert torch.equal(trainer.loss.weight.detach(), expected["weight"])
    momentum = trainer.optimizer.state[trainer.loss.weight]["momentum_buffer"]
    assert torch.equal(momentum, expected["momentum"])
    for key, value in expected["model"].items():
        assert torch.equal(trainer.model.state_dict()[key], value), key
    assert [r["epoch"] for r in load_run(run).history] == [1, 2]  # evaluate/plot read it too
    sidecar_reads: list[Path] = []
    real_read_sharded_checkpoint = sharded_checkpoint.read_sharded_checkpoint

    def counting_read_sharded_checkpoint(run_dir, **options):
        sidecar_reads.append(Path(run_dir))
        return real_read_sharded_checkpoint(run_dir, **options)

    # run_state imports the reader where it reads (no torch.distributed.checkpoint otherwise)
    monkeypatch.setattr(
        sharded_checkpoint, "read_sharded_checkpoint", counting_read_sharded_checkpoint
    )
    assert main(["--quiet", "train", "--out", str(run), "--resume", "--epochs", "3"]) == 0
    assert sidecar_reads == [run]  # the sharded checkpoint is read once per resume
    monkeypatch.undo()
    assert (run / "checkpoint.pt").is_file() and not (run / SHARDED_CHECKPOINT_NAME).exists()
    assert load_checkpoint(run / "checkpoint.pt")["meta"]["world_size"] == 1

    # 1 -> 2
    run_distributed(_resume_two_ranks, 2, str(run), deadline_s=180)
    assert read_sidecar(run)["epoch"] == 4
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2, 3, 4]
    assert main(["--quiet", "evaluate", str(run), "--device", "cpu"]) == 0
    capsys.readouterr()


def _one_rank_hangs(rank: int, world: int, run: str, result: str) -> None:
    import os
    import time

    if rank == 1:
        original = Trainer._train_epoch

        def hang_in_epoch_two(self, epoch):
            if epoch == 1:
                time.sleep(12)  # hung: the other rank must not wait for it
                os._exit(0)
            return original(self, epoch)

        Trainer._train_epoch = hang_in_epoch_two
    import contextlib
    import io

    stderr = io.StringIO()
    began = time.monotonic()
    with contextlib.redirect_stderr(stderr):
        code = main(
            ["--quiet", "train", *ARGS, "--epochs", "3", "--out", run, "--dist-timeout", "5"]
        )
    Path(result).write_text(f"{code}\n{time.monotonic() - began:.1f}\n{stderr.getvalue()}")
    os._exit(0)  # the group is broken: skip its teardown


def test_a_hung_rank_stops_the_others_within_the_timeout(tmp_path):
    run, result = tmp_path / "run", tmp_path / "rank0.txt"
    run_distributed(
        _one_rank_hangs, 2, str(run), str(result), deadline_s=120, collective_timeout_s=5
    )
    code, seconds, *message = result.read_text().splitlines()
    assert code == "1"
    lines = [line for line in message if line.strip()]
    assert len(lines) == 1, lines
    assert "rank 0: a collective failed" in lines[0] and "--dist-timeout" in lines[0]
    assert "the checkpoint of epoch 1 is kept" in lines[0] and "--resume" in lines[0]
    assert read_sidecar(run)["epoch"] == 1  # the last completed epoch's checkpoint is intact
    assert float(seconds) < 60
