"""A sharded checkpoint swap cut short between its two renames is repaired once, whichever
ranks of a restarted job look at the run folder at the same time (issue 28)."""

from __future__ import annotations

import multiprocessing
import traceback
from pathlib import Path

from marginface.train.state.layout import SHARDED_CHECKPOINT_NAME, SIDECAR_NAME
from marginface.train.state.sharded_folder import has_sharded_checkpoint

OLD = ".checkpoint.old"  # where the swap sets the previous checkpoint aside
RANKS = 3
ROUNDS = 60
TIMEOUT = 60.0


def _half_swapped(run: Path, *, partial_current: bool) -> None:
    """The folder a kill between the swap's renames leaves: the complete previous checkpoint
    set aside, and no (or a half-written) ``checkpoint/``."""
    old = run / OLD
    old.mkdir(parents=True)
    for index in range(8):
        (old / f"__{index}_0.distcp").write_bytes(bytes([index]) * 4096)
    (old / SIDECAR_NAME).write_text('{"epoch": 3}')
    if partial_current:
        current = run / SHARDED_CHECKPOINT_NAME
        current.mkdir()
        (current / "__0_0.distcp").write_bytes(b"half")


def _rank(run: str, barrier, errors) -> None:
    try:
        barrier.wait(TIMEOUT)
        found = has_sharded_checkpoint(run)  # repairs, then looks
        if not found:
            errors.put(f"{run}: no checkpoint found")
    except BaseException:
        errors.put(traceback.format_exc())


def test_ranks_repairing_at_once_keep_the_only_complete_checkpoint(tmp_path):
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    for round_ in range(ROUNDS):
        run = tmp_path / f"run{round_}"
        _half_swapped(run, partial_current=round_ % 2 == 1)
        barrier = context.Barrier(RANKS)
        ranks = [
            context.Process(target=_rank, args=(str(run), barrier, errors), daemon=True)
            for _ in range(RANKS)
        ]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join(TIMEOUT)
            assert process.exitcode == 0, f"round {round_}: a rank hung or died"
        assert errors.empty(), f"round {round_}: {errors.get()}"
        current = run / SHARDED_CHECKPOINT_NAME
        assert (current / SIDECAR_NAME).read_text() == '{"epoch": 3}', f"round {round_}"
        assert sorted(p.name for p in current.iterdir()) == sorted(
            [SIDECAR_NAME, *(f"__{index}_0.distcp" for index in range(8))]
        ), f"round {round_}"
        assert not (run / OLD).exists(), f"round {round_}"
