"""Fault injection on training runs (issue 13, "Nothing lost, nothing cryptic").

Real ``kill -9`` at the worst instants (just after the checkpoint is renamed into place and
before ``history.csv`` is rewritten; inside the atomic rewrite of ``history.csv`` by
``--resume``; at random instants of a real ``python -m marginface train``), temporaries of
killed writers, and flipped bytes in a checkpoint. After every kill the checkpoint loads,
``history.csv`` is a complete prefix of the checkpoint's history, and the next ``--resume``
finishes the run with nothing left behind.

The two targeted kills fork the test process (the child dies by SIGKILL where the fault is
injected; forking saves the ~3 s a fresh interpreter spends importing torch); the random kills
run the real command line in subprocesses.
"""

from __future__ import annotations

import os
import random
import runpy
import signal
import struct
import subprocess
import sys
import time
import traceback
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import marginface.train.history as history_module
import marginface.train.run_log as run_log_module
from marginface._atomic import atomic_write, remove_stale_temporaries
from marginface.cli import main
from marginface.train import (
    CheckpointError,
    Trainer,
    load_checkpoint,
    load_run,
    read_history,
    train,
)
from marginface.train.config import TrainConfig
from marginface.train.history import format_history
from marginface.train.state.checkpoint import CHECKPOINT_VERSION, state_digest
from marginface.train.state.layout import CHECKPOINT_NAME, HISTORY_NAME

SRC = Path(__file__).resolve().parents[2] / "src"
TINY_FLAGS = [
    "--limit", "120", "--batch-size", "60", "--threads", "1", "--device", "cpu",
    "--set", "model_options={widths=[4,4,8]}",
]  # fmt: skip

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")


def tiny(**changes: object) -> TrainConfig:
    values: dict[str, object] = dict(
        dataset="digits", limit=120, epochs=3, batch_size=60, threads=1, device="cpu"
    )
    values["model_options"] = {"widths": [4, 4, 8]}
    values.update(changes)
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> None:
    """One tiny run in this process first, so that forked children inherit the imports and
    the loaded data instead of each paying for them."""
    train(tiny(epochs=1), tmp_path_factory.mktemp("warm") / "run")


def temporaries(run: Path) -> list[str]:
    """Hidden files in the run folder (the atomic writer's temporaries are all hidden)."""
    return sorted(p.name for p in run.iterdir() if p.name.startswith("."))


def assert_consistent(run: Path) -> dict:
    """The run folder after a kill: the checkpoint loads (with its history of epochs 1..k)
    and ``history.csv`` is, byte for byte, the CSV of a prefix of that history: complete
    rows only, never more epochs than the checkpoint."""
    state = load_checkpoint(run / CHECKPOINT_NAME)
    epoch = int(state["epoch"])
    assert [row["epoch"] for row in state["history"]] == list(range(1, epoch + 1))
    path = run / HISTORY_NAME
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    rows = read_history(path) if text else []
    assert len(rows) <= epoch
    assert [row["epoch"] for row in rows] == list(range(1, len(rows) + 1))
    assert text == (format_history(state["history"][: len(rows)]) if rows else "")
    return state


def assert_completed(run: Path, epochs: int) -> dict:
    """The run folder after the final ``--resume``: every epoch, history.csv equal to the
    checkpoint's history, no temporary file left."""
    state = assert_consistent(run)
    assert state["epoch"] == epochs
    assert len(read_history(run / HISTORY_NAME)) == epochs
    assert temporaries(run) == []
    return state


def resume(run: Path, *extra: str) -> int:
    return main(["--quiet", "train", "--out", str(run), "--resume", *extra])


def die(*_: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def killed_in_child(work: Callable[[], object], timeout: float = 120.0) -> None:
    """Run ``work`` in a forked child that must die by SIGKILL (``work`` injects the kill);
    fail if it returns, raises or hangs instead."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            work()
        except BaseException:
            traceback.print_exc()
        os._exit(70)
    give_up = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > give_up:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the child did not reach its kill within {timeout} s")
        time.sleep(0.01)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"the child was not killed where the fault is injected (status {status})"
    )


def kill_before_history_of_epoch(run: Path, epoch: int, epochs: int) -> None:
    """Train ``run`` in a child killed once the checkpoint of ``epoch`` is in place, before
    ``history.csv`` gets that epoch's row."""

    def work() -> None:
        real = run_log_module.write_history

        def write_history(path: Path, rows: list) -> Path:
            if len(rows) == epoch:
                die()
            return real(path, rows)

        run_log_module.write_history = write_history
        Trainer(tiny(epochs=epochs), run).fit()

    killed_in_child(work)


# ------------------------------------------------------------------ kill -9 at the worst instants
@needs_fork
def test_kill_after_the_checkpoint_is_renamed_before_history_is_rewritten(tmp_path, warm):
    run = tmp_path / "run"
    kill_before_history_of_epoch(run, epoch=2, epochs=3)
    state = assert_consistent(run)
    assert state["epoch"] == 2
    assert len(read_history(run / HISTORY_NAME)) == 1  # the kill landed between the two writes
    assert resume(run) == 0
    final = assert_completed(run, 3)
    # nothing lost: the same weights as a run that was never killed
    uninterrupted = train(tiny(epochs=3), tmp_path / "uninterrupted")
    for key, value in uninterrupted.model.state_dict().items():
        assert torch.equal(final["model"][key], value), key


@needs_fork
def test_plot_and_load_run_show_every_epoch_even_when_history_csv_lags(tmp_path, warm, capsys):
    run = tmp_path / "run"
    kill_before_history_of_epoch(run, epoch=2, epochs=3)
    assert len(read_history(run / HISTORY_NAME)) == 1  # the CSV lags the checkpoint
    assert [row["epoch"] for row in load_run(run).history] == [1, 2]
    assert main(["--quiet", "plot", str(run), "--device", "cpu"]) == 0
    assert (run / "plots").is_dir()
    capsys.readouterr()


@needs_fork
@pytest.mark.parametrize("instant", ["before-rename", "mid-write"])
def test_kill_while_resume_rewrites_history(tmp_path, warm, instant):
    run = tmp_path / "run"
    kill_before_history_of_epoch(run, epoch=2, epochs=3)
    before = (run / HISTORY_NAME).read_bytes()

    def work() -> None:
        if instant == "before-rename":  # the temporary is complete and fsync'd
            real_replace = os.replace

            def replace(source, target, **kwargs):
                if Path(target).name == HISTORY_NAME:
                    die()
                return real_replace(source, target, **kwargs)

            os.replace = replace
        else:  # half of the new CSV is in the temporary file

            def half_then_die(path, text: str) -> None:
                with atomic_write(path) as stream:
                    stream.write(text.encode("utf-8")[: len(text) // 2])
                    stream.flush()
                    die()

            history_module.atomic_write_text = half_then_die
        resume(run)

    killed_in_child(work)
    left = temporaries(run)
    assert len(left) == 1 and left[0].startswith(f".{HISTORY_NAME}.")  # killed inside the write
    assert (run / HISTORY_NAME).read_bytes() == before
    assert assert_consistent(run)["epoch"] == 2
    assert resume(run) == 0
    assert_completed(run, 3)


class _ForkedCommand:
    """``python -m marginface ARGS`` in a forked child of the (warm) test process: the
    command line's own ``__main__``, in a process of its own, without a fresh interpreter's
    imports. Popen's ``poll``/``send_signal``/``wait``."""

    def __init__(self, args: list[str]) -> None:
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:
            code = 70
            try:
                sys.argv = ["marginface", *args]
                runpy.run_module("marginface", run_name="__main__")
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
            except BaseException:
                traceback.print_exc()
            os._exit(code)

    def _status(self, flags: int) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, flags)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self._status(os.WNOHANG)

    def send_signal(self, number: int) -> None:
        os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self) -> int:
        return self._status(0)


def _train_command(run: Path, epochs: int) -> list[str]:
    return ["--quiet", "train", *TINY_FLAGS, "--epochs", str(epochs), "--out", str(run)]


def _spawn(how: str, run: Path, epochs: int) -> subprocess.Popen | _ForkedCommand:
    if how == "fork":
        return _ForkedCommand(_train_command(run, epochs))
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "marginface", *_train_command(run, epochs)],
        env={**os.environ, "PYTHONPATH": path},
        stdout=subprocess.DEVNULL,
        stderr=(run.parent / f"{run.name}.err").open("w"),
    )


def _rows_on_disk(run: Path) -> int:
    try:
        return max((run / HISTORY_NAME).read_text(encoding="utf-8").count("\n") - 1, 0)
    except (OSError, UnicodeDecodeError):
        return 0


@pytest.fixture
def processes() -> Iterator[list]:
    started: list = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.mark.parametrize(
    "how, count, seed",
    [pytest.param("python -m", 1, 13, id="python-m"), pytest.param("fork", 4, 31, id="fork")],
)
def test_kill_9_at_random_instants_of_the_train_command(
    tmp_path, processes, warm, how, count, seed
):
    """A real ``python -m marginface train`` process (and, cheaper, the same command line in
    forked children, side by side), each killed at a seeded random instant: after a random
    number of epochs plus a random part of an epoch (training, evaluation, checkpoint or
    history write). Then the next --resume finishes each run."""
    if how == "fork" and not hasattr(os, "fork"):
        pytest.skip("needs os.fork (POSIX)")
    epochs = 15
    rng = random.Random(seed)
    plan = [(rng.randint(1, 7), rng.uniform(0.0, 0.03)) for _ in range(count)]
    runs = [tmp_path / f"run{i}" for i in range(count)]
    processes += [_spawn(how, run, epochs) for run in runs]
    kill_at: list[float | None] = [None] * count
    killed = [False] * count
    give_up = time.monotonic() + 120
    while not all(killed):
        assert time.monotonic() < give_up, "the training processes did not get going"
        now = time.monotonic()
        for i, (run, process) in enumerate(zip(runs, processes, strict=True)):
            if killed[i]:
                continue
            err = run.parent / f"{run.name}.err"
            assert process.poll() is None, (
                f"{run} ended before its kill: {err.read_text() if err.exists() else ''}"
            )
            if kill_at[i] is None and _rows_on_disk(run) >= plan[i][0]:
                kill_at[i] = now + plan[i][1]
            if kill_at[i] is not None and now >= kill_at[i]:
                process.send_signal(signal.SIGKILL)
                assert process.wait() == -signal.SIGKILL
                killed[i] = True
        time.sleep(0.002)
    for run in runs:
        state = assert_consistent(run)
        assert 1 <= state["epoch"] < epochs
        assert resume(run) == 0
        assert_completed(run, epochs)


# ------------------------------------------------------------------ temporaries of killed writers
@pytest.fixture
def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def test_resume_removes_temporaries_of_dead_writers_only(tmp_path, dead_pid, live_pid):
    run = tmp_path / "run"
    train(tiny(epochs=1), run)
    stale = [
        f".{CHECKPOINT_NAME}.{dead_pid}.k3j4h5g6.tmp",  # killed inside save_checkpoint
        f".{HISTORY_NAME}.{dead_pid}.abcdefgh.tmp",
        f".{CHECKPOINT_NAME}.tmp-{dead_pid}",  # the name versions before _atomic used
    ]
    kept = [
        f".{CHECKPOINT_NAME}.{live_pid}.zzzzzzzz.tmp",  # a writer that is still running
        f".{CHECKPOINT_NAME}.tmp-{live_pid}",
        f".{CHECKPOINT_NAME}.99999999999999999999.abcdefgh.tmp",  # no process id at all
        ".notes.txt",  # not a temporary
    ]
    for name in stale + kept:
        (run / name).write_bytes(b"partial")
    assert resume(run, "--epochs", "2") == 0
    assert temporaries(run) == sorted(kept)
    assert load_checkpoint(run / CHECKPOINT_NAME)["epoch"] == 2


def test_remove_stale_temporaries_can_be_limited_to_one_target(tmp_path, dead_pid):
    names = [f".a.pt.{dead_pid}.abcdefgh.tmp", f".a.pt.tmp-{dead_pid}", f".b.csv.{dead_pid}.x.tmp"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    removed = remove_stale_temporaries(tmp_path, "a.pt")
    assert sorted(p.name for p in removed) == sorted(names[:2])
    assert [p.name for p in tmp_path.iterdir()] == [names[2]]


# ------------------------------------------------------------------ flipped bytes
def _tensor_data_spans(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of each tensor's bytes (the ``data/N`` records of torch's zip)."""
    data = path.read_bytes()
    spans = []
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if "/data/" in info.filename and info.file_size:
                name_length, extra_length = struct.unpack(
                    "<HH", data[info.header_offset + 26 :][:4]
                )
                start = info.header_offset + 30 + name_length + extra_length
                spans.append((start, info.file_size))
    return spans


def test_a_flipped_byte_anywhere_in_a_checkpoint_is_refused_naming_it(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny(epochs=1), run)
    intact = (run / CHECKPOINT_NAME).read_bytes()
    spans = _tensor_data_spans(run / CHECKPOINT_NAME)
    assert len(spans) >= 8
    spread = {len(intact) * i // 39 for i in range(39)} | {len(intact) - 1}
    in_tensors = {start + size * j // 3 for start, size in spans[:8] for j in range(3)}
    positions = sorted(spread | in_tensors)
    assert len(positions) >= 60
    damaged = tmp_path / "damaged" / CHECKPOINT_NAME
    damaged.parent.mkdir()
    for position in positions:
        data = bytearray(intact)
        data[position] ^= 0x01
        damaged.write_bytes(bytes(data))
        with pytest.raises(CheckpointError) as caught:
            load_checkpoint(damaged)
        assert str(damaged) in str(caught.value), position
    # and every command says so in one line
    assert main(["--quiet", "evaluate", str(damaged.parent), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "damaged" in err and str(damaged) in err and len(err.strip().splitlines()) == 1


def test_a_format_2_checkpoint_without_a_seal_still_loads_and_resumes(tmp_path):
    """Checkpoints written before the seal (format 2: a digest of the contents only) load as
    they are; a format-3 file without its seal is refused."""
    run = tmp_path / "run"
    train(tiny(epochs=1), run)
    state = torch.load(run / CHECKPOINT_NAME, weights_only=True)
    state["format_version"] = 2
    state["sha256"] = state_digest(state)
    torch.save(state, run / CHECKPOINT_NAME)  # what format 2 wrote: no seal
    assert load_checkpoint(run / CHECKPOINT_NAME)["epoch"] == 1
    assert resume(run, "--epochs", "2") == 0
    assert load_checkpoint(run / CHECKPOINT_NAME)["format_version"] == CHECKPOINT_VERSION
    state = torch.load(run / CHECKPOINT_NAME, weights_only=True)
    torch.save(state, run / CHECKPOINT_NAME)  # format 3 contents, seal lost
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt is damaged.*does not"):
        load_checkpoint(run / CHECKPOINT_NAME)
