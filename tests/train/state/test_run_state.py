"""Run state in one place: a checkpoint is read once per command, restored by one function, and
the policy of what a resume may change lives beside it."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

import marginface.train.distributed as distributed_module
from marginface.cli import main
from marginface.train import (
    RESUMABLE_KEYS,
    CheckpointError,
    Trainer,
    evaluate_run,
    load_checkpoint,
    load_run,
    train,
)
from marginface.train.build import load_bundle
from marginface.train.config import TrainConfig
from marginface.train.distributed import clip_gradient_norm
from marginface.train.evaluation.evaluate import evaluate_model
from marginface.train.state.run_state import (
    CHECKPOINT_NAME,
    check_resumable,
    describe_kept,
    read_saved_run,
    resumed_config,
)

TINY = [
    "--limit", "120", "--batch-size", "60", "--threads", "1", "--device", "cpu",
    "--set", "model_options={widths=[4,4,8]}",
]  # fmt: skip


def tiny(**overrides: object) -> TrainConfig:
    values: dict[str, object] = {
        "limit": 120,
        "batch_size": 60,
        "threads": 1,
        "device": "cpu",
        "epochs": 2,
        "model_options": {"widths": [4, 4, 8]},
    }
    values.update(overrides)
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished two-epoch run (copy it before changing it)."""
    run = tmp_path_factory.mktemp("state") / "run"
    assert main(["--quiet", "train", *TINY, "--epochs", "2", "--out", str(run)]) == 0
    return run


@pytest.fixture
def checkpoint_reads(monkeypatch) -> list[str]:
    """Every ``torch.load`` of a run's ``checkpoint.pt`` from now on (the path of each)."""
    reads: list[str] = []
    real = torch.load

    def counting_load(source, *args, **kwargs):
        if Path(str(source)).name == CHECKPOINT_NAME:
            reads.append(str(source))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    return reads


# ------------------------------------------------------------------ read once
def test_resume_reads_the_checkpoint_once(trained, tmp_path, checkpoint_reads, capsys):
    run = Path(shutil.copytree(trained, tmp_path / "run"))
    assert main(["--quiet", "train", "--out", str(run), "--resume", "--epochs", "3"]) == 0
    assert checkpoint_reads == [str(run / CHECKPOINT_NAME)]
    assert load_checkpoint(run / CHECKPOINT_NAME)["epoch"] == 3
    capsys.readouterr()


def test_resume_without_out_reads_the_checkpoint_once(
    trained, tmp_path, checkpoint_reads, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "digits-curricularface"  # the default --out
    shutil.copytree(trained, run)
    assert main(["--quiet", "train", *TINY, "--resume", "--epochs", "3"]) == 0
    assert len(checkpoint_reads) == 1
    capsys.readouterr()


def test_a_failed_resumed_run_names_its_checkpoint_without_reading_it_again(
    trained, tmp_path, checkpoint_reads, monkeypatch, capsys
):
    run = Path(shutil.copytree(trained, tmp_path / "run"))

    def interrupted(self: Trainer, epoch: int) -> float:
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_train_epoch", interrupted)
    code = main(["--quiet", "train", "--out", str(run), "--resume", "--epochs", "3"])
    err = capsys.readouterr().err
    assert code == 130 and "the checkpoint of epoch 2" in err and "--resume" in err
    assert len(checkpoint_reads) == 1


def test_library_resume_reads_the_checkpoint_once(tmp_path, checkpoint_reads):
    train(tiny(epochs=1), tmp_path / "run")
    assert checkpoint_reads == []
    trainer = train(tiny(epochs=2), tmp_path / "run", resume=True)
    assert len(checkpoint_reads) == 1
    assert [row["epoch"] for row in trainer.history] == [1, 2]


@pytest.mark.parametrize("command", ["plot", "evaluate", "export"])
def test_commands_that_use_a_run_load_it_once(trained, tmp_path, checkpoint_reads, command):
    run = Path(shutil.copytree(trained, tmp_path / "run"))
    extra = ["--device", "cpu"] if command != "export" else []
    assert main(["--quiet", command, str(run), *extra]) == 0
    assert checkpoint_reads == [str(run / CHECKPOINT_NAME)]


def test_process_group_set_up_once_per_fit(tmp_path, monkeypatch):
    calls: list[str] = []
    real = distributed_module.init_from_environment

    def counting(device_type: str, timeout_s: float) -> bool:
        calls.append(device_type)
        return real(device_type, timeout_s)

    monkeypatch.setattr(distributed_module, "init_from_environment", counting)
    train(tiny(epochs=1), tmp_path / "run")
    assert calls == ["cpu"]
    train(tiny(epochs=2), tmp_path / "run", resume=True)
    assert calls == ["cpu", "cpu"]


# ------------------------------------------------------------------ what was read
def test_saved_run_holds_what_the_checkpoint_holds(trained):
    saved = read_saved_run(trained)
    state = load_checkpoint(trained / CHECKPOINT_NAME)
    assert not saved.sharded and saved.source == trained / CHECKPOINT_NAME
    assert saved.epoch == state["epoch"] == 2
    assert saved.history == state["history"] and [r["epoch"] for r in saved.history] == [1, 2]
    assert saved.config == state["config"] and saved.meta == state["meta"]
    assert saved.train_config().to_dict() == state["config"]


def test_reading_a_folder_without_a_checkpoint_names_it(tmp_path):
    with pytest.raises(CheckpointError, match=rf"no checkpoint in {tmp_path}.*checkpoint\.pt"):
        read_saved_run(tmp_path)


def test_load_run_from_a_saved_run_rebuilds_the_weights(trained):
    saved = read_saved_run(trained)
    run = load_run(trained, saved=saved)
    assert run.head is run.loss and not run.head.training and run.epoch == 2
    state = load_checkpoint(trained / CHECKPOINT_NAME)
    for key, value in state["model"].items():
        assert torch.equal(run.model.state_dict()[key], value), key
    assert torch.equal(run.head.weight.detach(), state["loss"]["weight"])


def test_restore_puts_back_weights_optimizer_schedule_and_rng(trained):
    saved = read_saved_run(trained)
    state = load_checkpoint(trained / CHECKPOINT_NAME)
    trainer = Trainer(tiny(), trained)
    trainer._init_distributed()
    trainer._setup()
    torch.manual_seed(12345)  # something else than the saved generator state
    assert trainer._restore(saved) == 2
    assert torch.equal(torch.get_rng_state(), state["rng"])
    assert torch.equal(trainer.head.weight.detach(), state["loss"]["weight"])
    assert trainer.scheduler.state_dict() == state["scheduler"]
    restored = trainer.optimizer.state_dict()
    assert restored["param_groups"] == state["optimizer"]["param_groups"]
    for index, entries in state["optimizer"]["state"].items():
        for key, value in entries.items():
            assert torch.equal(torch.as_tensor(restored["state"][index][key]), value), key
    assert trainer.history == saved.history


# ------------------------------------------------------------------ the resume policy
def test_resumed_config_takes_only_resumable_options(trained):
    saved = read_saved_run(trained)
    config = resumed_config(saved, {"epochs": 5, "threads": 2, "lr": saved.config["lr"]})
    assert config.epochs == 5 and config.threads == 2
    assert config.to_dict() | {"epochs": 2, "threads": 1} == saved.train_config().to_dict()


def test_resumed_config_names_every_conflict_and_what_may_change(trained):
    saved = read_saved_run(trained)
    with pytest.raises(ValueError) as caught:
        resumed_config(saved, {"lr": 0.5, "batch_size": 7}, spell=lambda key: f"--{key}")
    message = str(caught.value)
    assert f"--lr 0.5 (the run has {saved.config['lr']!r})" in message
    assert "--batch_size 7 (the run has 60)" in message
    for key in RESUMABLE_KEYS:
        assert f"--{key}" in message


def test_check_resumable_refuses_a_changed_configuration(trained):
    saved = read_saved_run(trained)
    check_resumable(saved, saved.train_config())  # the same configuration: fine
    check_resumable(saved, tiny(epochs=9, flip=True).resolved())  # only resumable keys differ
    with pytest.raises(CheckpointError, match=r"another configuration \(embedding_dim: 3 -> 2\)"):
        check_resumable(saved, tiny(embedding_dim=2).resolved())


def test_describe_kept_is_true_to_the_disk(tmp_path, trained):
    assert "no epoch was completed" in describe_kept(tmp_path, None)
    kept = describe_kept(trained, 2)
    assert "the checkpoint of epoch 2" in kept and f"--out {trained} --resume" in kept


# ------------------------------------------------------------------ one evaluation
def test_the_epoch_row_and_evaluate_are_one_evaluation(tmp_path):
    trainer = train(tiny(epochs=1, loss="arcface"), tmp_path / "run")
    row = trainer.history[-1]
    run = load_run(tmp_path / "run")
    summary = evaluate_model(
        run.model,
        run.head,
        load_bundle(run.config),
        flip=False,
        batch_size=run.config.eval_batch_size,
        device="cpu",
        summary=True,
    ).metrics
    assert summary["accuracy"] == row["accuracy"]
    assert summary["val_loss"] == pytest.approx(row["val_loss"], rel=1e-6)
    full = evaluate_run(run).metrics
    assert full["accuracy"] == row["accuracy"] and "val_loss" not in full
    assert math.isfinite(full["verification_accuracy"]) and full["pairs"] > 0


def test_trainer_holds_the_head_as_head_and_loss(tmp_path):
    trainer = train(tiny(epochs=1), tmp_path / "run")
    assert trainer.head is trainer.loss and hasattr(trainer.head, "weight")


# ------------------------------------------------------------------ gradient clipping
def test_clip_gradient_norm_on_one_process_is_torchs():
    torch.manual_seed(0)
    first = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(2)]
    second = [torch.nn.Parameter(p.detach().clone()) for p in first]
    for a, b in zip(first, second, strict=True):
        a.grad = torch.randn_like(a) * 10
        b.grad = a.grad.clone()
    clip_gradient_norm(first, 1.0, sharded=first[0])
    torch.nn.utils.clip_grad_norm_(second, 1.0)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a.grad, b.grad)
    assert float(torch.cat([p.grad.flatten() for p in first]).norm()) == pytest.approx(1.0, 1e-5)


# ------------------------------------------------------------------ which history is read
FIXTURE_RUN = Path(__file__).resolve().parents[2] / "fixtures" / "run_v1"


def test_the_checkpoints_own_history_wins_over_history_csv(trained, tmp_path):
    run = Path(shutil.copytree(trained, tmp_path / "run"))
    lines = (run / "history.csv").read_text().splitlines()
    (run / "history.csv").write_text("\n".join(lines[:2]) + "\n")  # a kill left one row
    saved = read_saved_run(run)
    assert [row["epoch"] for row in saved.history] == [1, 2]
    assert saved.history == load_checkpoint(run / CHECKPOINT_NAME)["history"]


def test_a_format_1_run_takes_its_history_from_the_csv_cut_to_its_epochs(tmp_path):
    run = Path(shutil.copytree(FIXTURE_RUN, tmp_path / "old"))
    with (run / "history.csv").open("a") as csv:  # a row beyond the checkpoint's epochs
        csv.write("3,1.0,1.0,0.5,0.001,0.5,0.001\n")
    saved = read_saved_run(run)
    assert saved.epoch == 2 and "history" not in saved.contents
    assert [row["epoch"] for row in saved.history] == [1, 2]
    assert saved.history[1]["loss"] == pytest.approx(31.411428451538086)


def test_a_sharded_checkpoint_is_read_from_its_folder(trained, tmp_path):
    import json

    from marginface.train.state.layout import SHARDED_CHECKPOINT_NAME, SIDECAR_NAME
    from marginface.train.state.sharded_checkpoint import _digests

    run = Path(shutil.copytree(trained, tmp_path / "run"))
    real = load_checkpoint(run / CHECKPOINT_NAME)
    (run / CHECKPOINT_NAME).unlink()
    folder = run / SHARDED_CHECKPOINT_NAME
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"shard")
    sidecar = {"format": "marginface-sharded-checkpoint", "version": 1, "epoch": 2}
    sidecar.update({"config": real["config"], "meta": real["meta"], "history": real["history"]})
    sidecar.update({"optimizer": {}, "scheduler": real["scheduler"], "files": _digests(folder)})
    (folder / SIDECAR_NAME).write_text(json.dumps(sidecar))
    saved = read_saved_run(run)
    assert saved.sharded and saved.source == folder and saved.epoch == 2
    assert saved.history == real["history"] and saved.config == real["config"]
