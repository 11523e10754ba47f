"""AdaM-Softmax's learnable per-class margins in step checkpoints of a 2-rank class-sharded run
(gloo): their optimizer state (SGD's momentum, AdamW's two moments) is saved and restored like
the class centers' (issue 25).

* interrupted at a step checkpoint and resumed at 2 ranks, the run ends bit-identical to an
  uninterrupted one (margins, their optimizer state, centers, backbone);
* restored at 1 and 3 ranks, each rank holds its block of the margins and of their optimizer
  state as the 2 ranks held them when they saved (resharded);
* a one-process ``checkpoint.pt`` restored at 2 ranks cuts the margins' state to each block.

The expected states are what the saving ranks held in memory (dumped by a wrapper around the
save), not what the checkpoint code writes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from marginface.cli import main
from marginface.train import Trainer
from marginface.train.config import TrainConfig
from marginface.train.state.run_state import SavedRun, read_saved_run, save_run_state
from marginface.train.state.sharded_checkpoint import read_sidecar

from .harness import run_distributed

CLASSES = 10  # digits
ARGS = [
    "--dataset", "digits", "--limit", "120", "--batch-size", "20", "--threads", "1",
    "--device", "cpu", "--loss", "adam-softmax", "--lr", "0.05",
    "--set", "model_options={widths=[4,4,8]}", "--set", "augment={translate=1, hflip=0.5}",
]  # fmt: skip
OPTIMIZERS = ["sgd", "adamw"]


def _config(optimizer: str) -> TrainConfig:
    return TrainConfig(
        dataset="digits",
        limit=120,
        batch_size=20,
        threads=1,
        device="cpu",
        loss="adam-softmax",
        optimizer=optimizer,
        lr=0.05,
        model_options={"widths": [4, 4, 8]},
        augment={"translate": 1, "hflip": 0.5},
        epochs=2,
    )


def _command(run: str, optimizer: str) -> list[str]:
    return ["--quiet", "train", *ARGS, "--optimizer", optimizer, "--epochs", "2", "--out", run]


def _held_state(model, head, optimizer) -> dict[str, torch.Tensor]:
    """What this process holds: its block of the margins and their optimizer state, its block of
    the centers and theirs, the backbone."""
    margin = head.class_parameters["margin"]
    state = {"margin": margin.detach().clone(), "weight": head.weight.detach().clone()}
    for name, parameter in (("margin", margin), ("weight", head.weight)):
        for key, value in optimizer.state.get(parameter, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[f"{name}.{key}"] = value.detach().clone()
    state.update({f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()})
    return state


def _dump_saves(dumps: Path, rank: int) -> None:
    """Every checkpoint this rank writes, its held state first dumped to
    ``dumps/<epoch>-<step>-<rank>.pt``."""
    from marginface.train.state import sharded_checkpoint  # run_state imports it at each save

    original = sharded_checkpoint.save_sharded_checkpoint

    def save(run_dir, *, epoch, model, loss, optimizer, extra, **kwargs):
        step = (extra.get("position") or {}).get("step", 0)
        held = {**_held_state(model, loss, optimizer), "range": torch.tensor(loss.class_range)}
        torch.save(held, dumps / f"{epoch}-{step}-{rank}.pt")
        return original(
            run_dir, epoch=epoch, model=model, loss=loss, optimizer=optimizer, extra=extra, **kwargs
        )

    sharded_checkpoint.save_sharded_checkpoint = save


def _straight(rank: int, world: int, run: str, dumps: str, optimizer: str) -> None:
    _dump_saves(Path(dumps), rank)
    assert main(_command(run, optimizer)) == 0


def _crash(rank: int, world: int, run: str, dumps: str, optimizer: str) -> None:
    _dump_saves(Path(dumps), rank)
    original = Trainer._train_step

    def crashing(self, epoch, step, *args):
        if epoch * self.steps_per_epoch + step + 1 == 11:
            raise RuntimeError("injected crash at step 11")
        return original(self, epoch, step, *args)

    Trainer._train_step = crashing
    assert main([*_command(run, optimizer), "--checkpoint-every", "4"]) == 1


def _resume(rank: int, world: int, run: str, dumps: str, optimizer: str) -> None:
    _dump_saves(Path(dumps), rank)
    assert main([*_command(run, optimizer), "--checkpoint-every", "4", "--resume"]) == 0


def _restored_trainer(run: Path, optimizer: str) -> tuple[Trainer, SavedRun]:
    """A trainer in this process (in a group or not) with the run's checkpoint restored."""
    trainer = Trainer(_config(optimizer), run)
    trainer._init_distributed()
    trainer._setup()
    saved = read_saved_run(run)
    trainer._restore(saved)
    return trainer, saved


def _save_back(run: Path, trainer: Trainer, saved: SavedRun, *, distributed: bool) -> None:
    """Write the restored state back into ``run`` as a new checkpoint of the same position."""
    save_run_state(
        run,
        trainer._objects(),
        epoch=saved.epoch,
        config=trainer.config,
        meta=trainer.meta,
        history=saved.history,
        position=saved.position,
        distributed=distributed,
    )


def _restored(run: Path, optimizer: str) -> dict[str, torch.Tensor]:
    """The run's checkpoint restored by a trainer in this process (in a group or not)."""
    trainer, _ = _restored_trainer(run, optimizer)
    held = _held_state(trainer.model, trainer.head, trainer.optimizer)
    return {**held, "range": torch.tensor(trainer.head.class_range)}


def _restore_and_dump(rank: int, world: int, run: str, out: str, optimizer: str) -> None:
    torch.save(_restored(Path(run), optimizer), Path(out) / f"restored-{world}-{rank}.pt")


def _saved_blocks(dumps: Path, epoch: int, step: int) -> list[dict[str, torch.Tensor]]:
    held = [torch.load(dumps / f"{epoch}-{step}-{rank}.pt") for rank in range(2)]
    assert [tuple(h["range"].tolist()) for h in held] == [(0, 5), (5, 10)]
    return held


def _assert_block(restored: dict[str, torch.Tensor], saved: list[dict], what: str) -> None:
    """``restored`` (one rank's) holds its classes' slice of the saving ranks' margins, their
    optimizer state and the centers' state; the backbone as rank 0 saved it."""
    start, stop = restored["range"].tolist()
    per_class = [k for k in saved[0] if k.startswith(("margin", "weight"))]
    assert {"margin", "weight"} < set(per_class)
    assert set(per_class) == {k for k in restored if k.startswith(("margin", "weight"))}, what
    for key in per_class:
        full = torch.cat([block[key] for block in saved])  # (C, ...) by class
        if key.startswith("weight"):  # (C·K, D) rows, K = 1
            assert full.shape[0] == CLASSES
        assert torch.equal(restored[key], full[start:stop]), f"{what}: {key}"
    for key in saved[0]:
        if key.startswith("model."):
            assert torch.equal(restored[key], saved[0][key]), f"{what}: {key}"


@pytest.fixture(scope="module", params=OPTIMIZERS)
def crashed(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """``(optimizer, run, dumps)``: a 2-rank run crashed at global step 11, its newest step
    checkpoint after step 8 (epoch 2, step 2), its ranks' state at every save dumped."""
    optimizer = request.param
    root = tmp_path_factory.mktemp(f"crashed-{optimizer}")
    run, dumps = root / "run", root / "dumps"
    dumps.mkdir()
    run_distributed(_crash, 2, str(run), str(dumps), optimizer, deadline_s=240)
    sidecar = read_sidecar(run)
    assert sidecar["epoch"] == 1 and sidecar["position"]["step"] == 2
    return optimizer, run, dumps


def test_resumed_at_two_ranks_ends_bit_identical(crashed, tmp_path):
    optimizer, crashed_run, _ = crashed
    straight, straight_dumps = tmp_path / "straight", tmp_path / "straight-dumps"
    straight_dumps.mkdir()
    run_distributed(_straight, 2, str(straight), str(straight_dumps), optimizer, deadline_s=240)
    run, dumps = tmp_path / "run", tmp_path / "dumps"
    shutil.copytree(crashed_run, run)
    dumps.mkdir()
    run_distributed(_resume, 2, str(run), str(dumps), optimizer, deadline_s=240)
    for rank in range(2):
        expected = torch.load(straight_dumps / f"2-0-{rank}.pt")
        actual = torch.load(dumps / f"2-0-{rank}.pt")
        assert expected.keys() == actual.keys()
        assert any(k.startswith("margin.") for k in expected)  # the margins' optimizer state
        for key, value in expected.items():
            assert torch.equal(actual[key], value), f"{optimizer} rank {rank}: {key}"


@pytest.mark.parametrize("world", [1, 3])
def test_restored_at_another_world_size_holds_the_resharded_state(crashed, tmp_path, world):
    optimizer, crashed_run, dumps = crashed
    run = tmp_path / "run"
    shutil.copytree(crashed_run, run)
    saved = _saved_blocks(dumps, 1, 2)
    if world == 1:
        restored = [_restored(run, optimizer)]
    else:
        run_distributed(_restore_and_dump, world, str(run), str(tmp_path), optimizer)
        restored = [torch.load(tmp_path / f"restored-{world}-{r}.pt") for r in range(world)]
    ranges = [tuple(r["range"].tolist()) for r in restored]
    assert ranges == ([(0, 10)] if world == 1 else [(0, 4), (4, 8), (8, 10)])
    for rank, held in enumerate(restored):
        _assert_block(held, saved, f"{optimizer} at {world} ranks, rank {rank}")


def _save_single_file(run: Path, optimizer: str) -> None:
    """Restore the sharded checkpoint on one process and write it back as ``checkpoint.pt``."""
    trainer, saved = _restored_trainer(run, optimizer)
    _save_back(run, trainer, saved, distributed=False)


def test_single_file_checkpoint_restored_at_two_ranks_cuts_the_margins_state(crashed, tmp_path):
    optimizer, crashed_run, dumps = crashed
    run = tmp_path / "run"
    shutil.copytree(crashed_run, run)
    _save_single_file(run, optimizer)
    assert (run / "checkpoint.pt").is_file() and not (run / "checkpoint").exists()
    run_distributed(_restore_and_dump, 2, str(run), str(tmp_path), optimizer)
    saved = _saved_blocks(dumps, 1, 2)
    for rank in range(2):
        held = torch.load(tmp_path / f"restored-2-{rank}.pt")
        _assert_block(held, saved, f"{optimizer} checkpoint.pt at 2 ranks, rank {rank}")


def _save_in_the_old_layout(rank: int, world: int, run: str, optimizer: str) -> None:
    """Restore the run at 2 ranks and write it back as checkpoints did before the margins'
    optimizer state was sharded by class: each rank's block as a plain (replicated) tensor."""
    from marginface.train.state import sharded_checkpoint

    trainer, saved = _restored_trainer(Path(run), optimizer)
    sharded = sharded_checkpoint.class_state_view

    def centers_only(value, head, name):
        return sharded(value, head, name) if name == "weight" else value

    sharded_checkpoint.class_state_view = centers_only
    _save_back(Path(run), trainer, saved, distributed=True)


def _restore_logging_warnings(rank: int, world: int, run: str, out: str, optimizer: str) -> None:
    import logging

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("marginface.train.state.run_state").addHandler(handler)
    restored = _restored(Path(run), optimizer)
    torch.save({**restored, "warnings": records}, Path(out) / f"restored-{world}-{rank}.pt")


def test_margins_state_saved_as_one_ranks_block_restarts_from_zero_with_a_warning(
    crashed, tmp_path
):
    """A checkpoint that holds the margins' optimizer state as one rank's block (the layout of
    checkpoints written before it was sharded by class) cannot be resharded: restoring it warns,
    names the parameter, and starts that state from zero; the margins, the centers and their
    optimizer state are restored."""
    optimizer, crashed_run, dumps = crashed
    run = tmp_path / "run"
    shutil.copytree(crashed_run, run)
    run_distributed(_save_in_the_old_layout, 2, str(run), optimizer)
    entries = read_saved_run(run)._sharded().entries()
    blocks = [
        key
        for key, (size, _) in entries.items()
        if key.startswith("optimizer/") and tuple(size) == (CLASSES // 2,)
    ]
    assert blocks  # the margins' state is there, as rank 0's block of 5 classes
    run_distributed(_restore_logging_warnings, 2, str(run), str(tmp_path), optimizer)
    saved = _saved_blocks(dumps, 1, 2)
    for rank in range(2):
        held = torch.load(tmp_path / f"restored-2-{rank}.pt", weights_only=False)
        warnings = held.pop("warnings")
        assert len(warnings) == 1 and "class_parameters.margin" in warnings[0], warnings
        assert "restarts from zero" in warnings[0]
        assert not any(k.startswith("margin.") for k in held), sorted(held)
        start, stop = held["range"].tolist()
        for key in [k for k in saved[0] if k == "margin" or k.startswith("weight")]:
            full = torch.cat([block[key] for block in saved])
            assert torch.equal(held[key], full[start:stop]), f"rank {rank}: {key}"
