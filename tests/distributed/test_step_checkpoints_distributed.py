"""Step checkpoints of a 2-rank sharded run (gloo): a crash mid-epoch resumed at 2 ranks ends
bit-identical to an uninterrupted run; resumed at 1 or 3 ranks, every sample of the epoch is
trained exactly once (issue 28)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from marginface.cli import main
from marginface.train import Trainer, read_history
from marginface.train.config import TrainConfig
from marginface.train.state.preemption import PREEMPTED_EXIT_CODE
from marginface.train.state.run_state import read_saved_run
from marginface.train.state.sharded_checkpoint import read_sidecar

from .harness import free_port, run_distributed

# 120 images, global batch 20: 6 steps per epoch; augmentation and dropout draw per rank
ARGS = [
    "--dataset", "digits", "--limit", "120", "--batch-size", "20", "--threads", "1",
    "--device", "cpu", "--loss", "arcface", "--optimizer", "sgd", "--lr", "0.05",
    "--set", "model_options={widths=[4,4,8]}", "--set", "augment={translate=1, hflip=0.5}",
]  # fmt: skip
STEPS = 6


def _config(epochs: int) -> TrainConfig:
    return TrainConfig(
        dataset="digits",
        limit=120,
        batch_size=20,
        threads=1,
        device="cpu",
        loss="arcface",
        optimizer="sgd",
        lr=0.05,
        model_options={"widths": [4, 4, 8]},
        augment={"translate": 1, "hflip": 0.5},
        epochs=epochs,
    )


def _command(run: str, epochs: int, *extra: str) -> list[str]:
    return ["--quiet", "train", *ARGS, "--epochs", str(epochs), "--out", run, *extra]


def _record_batches(log: Path, rank: int, crash_at: int | None = None) -> None:
    """Log ``(epoch, step, this rank's sample indices)`` of every step to ``log``; with
    ``crash_at``, raise at that global step (counted from 1)."""
    original_step, original_batch = Trainer._train_step, Trainer._batch

    def train_step(self, epoch, step, *args):
        if crash_at is not None and epoch * self.steps_per_epoch + step + 1 == crash_at:
            raise RuntimeError(f"injected crash at step {crash_at}")
        self._logged = (epoch, step)
        return original_step(self, epoch, step, *args)

    def batch(self, index, *args):
        with log.open("a") as handle:
            handle.write(json.dumps([*self._logged, rank, index.tolist()]) + "\n")
        return original_batch(self, index, *args)

    Trainer._train_step, Trainer._batch = train_step, batch


def _straight(rank: int, world: int, run: str, logs: str) -> None:
    _record_batches(Path(logs) / f"straight-{rank}.jsonl", rank)
    assert main(_command(run, 2)) == 0


def _crash(rank: int, world: int, run: str, logs: str, crash_at: int) -> None:
    _record_batches(Path(logs) / f"first-{rank}.jsonl", rank, crash_at)
    assert main(_command(run, 2, "--checkpoint-every", "4")) == 1  # the crash, one line


def _resume(rank: int, world: int, run: str, logs: str) -> None:
    _record_batches(Path(logs) / f"resumed-{world}-{rank}.jsonl", rank)
    assert main(_command(run, 2, "--checkpoint-every", "4", "--resume-if-exists")) == 0


def _final_state(run: Path) -> dict[str, torch.Tensor]:
    """The run's last checkpoint restored on one process: backbone, all class centers and
    their momentum."""
    trainer = Trainer(_config(2), run)
    trainer._init_distributed()
    trainer._setup()
    trainer._restore(read_saved_run(run))
    state = {f"model.{k}": v for k, v in trainer.model.state_dict().items()}
    state["loss.weight"] = trainer.head.weight.detach()
    state["momentum"] = trainer.optimizer.state[trainer.head.weight]["momentum_buffer"]
    return state


def _read_log(path: Path) -> list[tuple[int, int, int, list[int]]]:
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[Path, Path]:
    """An uninterrupted 2-epoch run on 2 ranks and the folder of its batch logs."""
    root = tmp_path_factory.mktemp("straight")
    run_distributed(_straight, 2, str(root / "run"), str(root), deadline_s=240)
    return root / "run", root


def _crashed_run(tmp_path: Path, crash_at: int) -> Path:
    run = tmp_path / "run"
    run_distributed(_crash, 2, str(run), str(tmp_path), crash_at, deadline_s=240)
    return run


def test_two_ranks_crash_mid_epoch_then_resume_bit_identical(straight, tmp_path):
    run = _crashed_run(tmp_path, 11)  # epoch 2, step 5; checkpoint after global step 8
    sidecar = read_sidecar(run)
    assert sidecar["epoch"] == 1 and sidecar["position"]["step"] == 2
    run_distributed(_resume, 2, str(run), str(tmp_path), deadline_s=240)
    expected, actual = _final_state(straight[0]), _final_state(run)
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key
    rows, straight_rows = (read_history(r / "history.csv") for r in (run, straight[0]))
    assert [row["epoch"] for row in rows] == [1, 2]
    assert [row["loss"] for row in rows] == [row["loss"] for row in straight_rows]


def _epoch_samples(logs: list[Path], epoch: int, steps: range) -> list[int]:
    """Every sample index trained in ``steps`` of ``epoch`` by the logged ranks."""
    seen = []
    for log in logs:
        for logged_epoch, step, _rank, indices in _read_log(log):
            if logged_epoch == epoch and step in steps:
                seen.extend(indices)
    return seen


@pytest.mark.parametrize("world", [1, 3])
def test_resumed_at_another_world_size_trains_each_sample_once(straight, tmp_path, world):
    run = _crashed_run(tmp_path, 5)  # epoch 1, step 5; checkpoint after step 4 (position 4)
    assert read_sidecar(run)["position"]["step"] == 4
    if world == 1:  # this process, no process group
        originals = Trainer._train_step, Trainer._batch
        try:
            _record_batches(tmp_path / "resumed-1-0.jsonl", 0)
            assert main(_command(str(run), 2, "--checkpoint-every", "4", "--resume")) == 0
        finally:
            Trainer._train_step, Trainer._batch = originals
    else:
        run_distributed(_resume, world, str(run), str(tmp_path), deadline_s=300)
    first = sorted(tmp_path.glob("first-*.jsonl"))
    resumed = sorted(tmp_path.glob(f"resumed-{world}-*.jsonl"))
    assert len(first) == 2 and len(resumed) == world
    epoch_one = _epoch_samples(first, 0, range(4)) + _epoch_samples(resumed, 0, range(4, STEPS))
    assert sorted(epoch_one) == list(range(120))  # each sample exactly once
    assert sorted(_epoch_samples(resumed, 1, range(STEPS))) == list(range(120))
    # the same global batches as the uninterrupted run, step by step
    straight_logs = sorted(straight[1].glob("straight-*.jsonl"))
    for step in range(4, STEPS):
        assert sorted(_epoch_samples(resumed, 0, range(step, step + 1))) == sorted(
            _epoch_samples(straight_logs, 0, range(step, step + 1))
        )
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]


def _sigterm_on_rank_one(rank: int, world: int, run: str, result: str) -> None:
    """Rank 1 alone gets SIGTERM during global step 8; both ranks must stop after that step."""
    if rank == 1:
        original = Trainer._train_step

        def signalling(self, epoch, step, *args):
            if epoch * self.steps_per_epoch + step + 1 == 8:
                os.kill(os.getpid(), signal.SIGTERM)
            return original(self, epoch, step, *args)

        Trainer._train_step = signalling
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = main(_command(run, 2, "--resume-if-exists"))
    Path(f"{result}-{rank}").write_text(f"{code}\n{stderr.getvalue()}")


def test_sigterm_to_one_rank_stops_both_at_the_same_step_then_resumes_exactly(straight, tmp_path):
    run, result = tmp_path / "run", tmp_path / "result"
    run_distributed(_sigterm_on_rank_one, 2, str(run), str(result), deadline_s=240)
    outputs = [Path(f"{result}-{rank}").read_text().splitlines() for rank in range(2)]
    assert [int(lines[0]) for lines in outputs] == [PREEMPTED_EXIT_CODE] * 2
    assert len(outputs[0]) == 2 and len(outputs[1]) == 1  # rank 0 says it, in one line
    assert "after step 2 of 6 of epoch 2" in outputs[0][1] and "--resume" in outputs[0][1]
    sidecar = read_sidecar(run)
    assert sidecar["epoch"] == 1 and sidecar["position"]["step"] == 2
    run_distributed(_resume_plain, 2, str(run), deadline_s=240)
    expected, actual = _final_state(straight[0]), _final_state(run)
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]


def _resume_plain(rank: int, world: int, run: str) -> None:
    assert main(_command(run, 2, "--resume-if-exists")) == 0


def _torchrun_command(run: Path, processes: int, max_restarts: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
        "--nproc-per-node", str(processes), "--max-restarts", str(max_restarts),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
        "--rdzv-id", "marginface-test", "--monitor-interval", "0.5",
        str(Path(__file__).with_name("torchrun_worker.py")),
        *_command(str(run), 2, "--resume-if-exists", "--dist-timeout", "60", *extra),
    ]  # fmt: skip


def _environment(env: dict[str, str]) -> dict[str, str]:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parents[2]), environment.get("PYTHONPATH", "")]
    )
    return environment


def _torchrun(
    run: Path, processes: int, *, max_restarts: int, env: dict[str, str], timeout_s: float = 300
) -> subprocess.CompletedProcess:
    """``torchrun`` (c10d rendezvous on 127.0.0.1, a free port) of the worker script with the
    training command line that starts and continues the run."""
    try:
        return subprocess.run(
            _torchrun_command(run, processes, max_restarts, "--checkpoint-every", "4"),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=_environment(env),
        )
    except subprocess.TimeoutExpired as error:
        stderr = error.stderr.decode(errors="replace") if error.stderr else ""
        pytest.fail(f"torchrun did not finish within {timeout_s} s:\n{stderr[-3000:]}")


@pytest.mark.slow
def test_torchrun_restarts_after_a_kill_9_and_ends_with_the_uninterrupted_weights(
    straight, tmp_path
):
    run = tmp_path / "run"
    kill = {"MARGINFACE_TEST_KILL_RANK": "1", "MARGINFACE_TEST_KILL_STEP": "10"}
    finished = _torchrun(run, 2, max_restarts=1, env=kill)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "exitcode: -9" in finished.stderr, finished.stderr[-3000:]  # the kill -9 happened
    expected, actual = _final_state(straight[0]), _final_state(run)
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]


@pytest.mark.slow
def test_torchrun_group_that_shrank_continues_on_one_rank(tmp_path):
    run = tmp_path / "run"
    kill = {"MARGINFACE_TEST_KILL_RANK": "1", "MARGINFACE_TEST_KILL_STEP": "10"}
    failed = _torchrun(run, 2, max_restarts=0, env=kill)
    assert failed.returncode != 0
    sidecar = read_sidecar(run)
    assert sidecar["epoch"] == 1 and sidecar["position"]["step"] == 2  # after global step 8
    finished = _torchrun(run, 1, max_restarts=0, env={})
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]
    saved = read_saved_run(run)
    assert saved.epoch == 2 and saved.meta["world_size"] == 1


def _killed_during_async_write(rank: int, world: int, run: str, markers: str) -> None:
    """Both ranks: the third background write (the step checkpoint after global step 8) is
    held in the middle; during step 11 each rank kills itself (kill -9) while it is."""
    import time

    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    marker = Path(markers) / f"writing-{rank}"
    real_write, calls = FileSystemWriter.write_data, []

    def slow_write(self, plan, planner):
        calls.append(1)
        if len(calls) == 3:
            marker.write_text("writing")
            time.sleep(120)
        return real_write(self, plan, planner)

    FileSystemWriter.write_data = slow_write
    original = Trainer._train_step

    def killing(self, epoch, step, *args):
        if epoch * self.steps_per_epoch + step + 1 == 11:
            while not marker.exists():
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, epoch, step, *args)

    Trainer._train_step = killing
    main(_command(run, 2, "--checkpoint-every", "4", "--async-checkpoint"))


def _resume_async(rank: int, world: int, run: str) -> None:
    assert main(_command(run, 2, "--checkpoint-every", "4", "--async-checkpoint", "--resume")) == 0


def test_a_kill_during_an_async_sharded_write_leaves_the_previous_checkpoint(straight, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(AssertionError, match=r"exited with \[-9, -9\]"):
        run_distributed(_killed_during_async_write, 2, str(run), str(tmp_path), deadline_s=240)
    sidecar = read_sidecar(run)  # verified: every file's sha256
    assert sidecar["epoch"] == 1 and sidecar["position"] is None  # the end of epoch 1
    assert (run / ".checkpoint.1.tmp").is_dir()  # the write cut short, never swapped in
    (run / ".checkpoint.7.tmp").mkdir()  # another write cut short, long ago
    run_distributed(_resume_async, 2, str(run), deadline_s=240)
    assert not list(run.glob(".checkpoint.*.tmp"))  # removed by the next write
    expected, actual = _final_state(straight[0]), _final_state(run)
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]


@pytest.mark.slow
def test_sigterm_to_torchrun_checkpoints_the_step_on_every_worker(tmp_path):
    """The cluster's SIGTERM reaches torchrun, which forwards it (twice) to its workers: each
    finishes its step, the group writes the step checkpoint, and the same command continues."""
    import time

    run, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    command = _torchrun_command(run, 2, 0, "--set", "limit=1200")  # 60 steps per epoch
    environment = _environment({"MARGINFACE_TEST_MARK_DIR": str(marks)})
    agent = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, env=environment, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # until both workers train (their signal handlers are in place)
        assert len(list(marks.iterdir())) == 2, "the workers did not start training in 120 s"
        agent.send_signal(signal.SIGTERM)  # inside epoch 1
        _, err = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)  # the agent's session: it and its workers
            agent.wait()
    assert agent.returncode != 0  # torchrun ends with the signal, whatever its workers did
    lines = [line for line in err.splitlines() if line.startswith("marginface train:")]
    assert len(lines) == 1 and "SIGTERM" in lines[0] and "--resume" in lines[0], err[-3000:]
    saved = read_saved_run(run)
    assert saved.position is not None and saved.meta["world_size"] == 2
    finished = subprocess.run(
        _torchrun_command(run, 2, 0, "--set", "limit=1200"),
        capture_output=True,
        text=True,
        timeout=300,
        env=_environment({}),
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]


def _crash_keeping(rank: int, world: int, run: str, logs: str) -> None:
    _record_batches(Path(logs) / f"kept-{rank}.jsonl", rank, crash_at=11)
    assert main(_command(run, 2, "--checkpoint-every", "2", "--keep", "3")) == 1


def test_keep_with_sharded_checkpoints_falls_back_past_a_damaged_newest(straight, tmp_path):
    from marginface.train.state.kept_checkpoints import kept_checkpoints

    run = tmp_path / "run"
    run_distributed(_crash_keeping, 2, str(run), str(tmp_path), deadline_s=240)
    # after steps 2, 4, 6 (epoch 1's end), 8, 10: checkpoint/ is step 10, 2 older kept
    assert read_sidecar(run)["position"]["step"] == 4
    kept = kept_checkpoints(run)
    assert [path.name for path in kept] == ["epoch-0001-step-0000002", "epoch-0001-step-0000000"]
    shard = next((run / "checkpoint").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    saved = read_saved_run(run)
    assert saved.source == kept[0] and saved.position.step == 2
    run_distributed(_resume, 2, str(run), str(tmp_path), deadline_s=240)
    expected, actual = _final_state(straight[0]), _final_state(run)
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key
    assert len(kept_checkpoints(run)) == 2  # and checkpoint/: the last 3
