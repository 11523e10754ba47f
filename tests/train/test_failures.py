"""What a training run raises when it cannot go on (train/failures.py): the translation of
Ctrl-C and of a failed collective around the epochs."""

from __future__ import annotations

import pytest

from marginface.train.distributed import RankFailureError
from marginface.train.failures import (
    TrainingDivergedError,
    TrainingInterrupted,
    training_failures,
)


def _failures(distributed: bool = False, asked: list[str] | None = None):
    def way_forward() -> str:
        if asked is not None:
            asked.append("asked")
        return "the checkpoint of epoch 2 is kept; continue with --resume"

    return training_failures(
        distributed=distributed, rank=1, timeout_s=30.0, way_forward=way_forward
    )


def test_ctrl_c_says_what_is_kept_without_the_keyboard_interrupt_context():
    expected = "^interrupted; the checkpoint of epoch 2"
    with pytest.raises(TrainingInterrupted, match=expected) as e, _failures():
        raise KeyboardInterrupt
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_a_failed_collective_names_the_rank_and_the_timeout():
    error = RuntimeError("Connection closed by peer\nmore detail")
    with pytest.raises(RankFailureError) as caught, _failures(distributed=True):
        raise error
    text = str(caught.value)
    assert text.startswith("rank 1: a collective failed") and "--dist-timeout = 30 s" in text
    assert "Connection closed by peer;" in text and "more detail" not in text
    assert "continue with --resume" in text and caught.value.__cause__ is error


@pytest.mark.parametrize(
    ("distributed", "error"),
    [
        (False, RuntimeError("one process: as raised")),
        (True, TrainingDivergedError("the loss became nan")),
        (True, ValueError("not a runtime error")),
    ],
)
def test_other_errors_pass_unchanged(distributed, error):
    with pytest.raises(type(error)) as caught, _failures(distributed):
        raise error
    assert caught.value is error


def test_the_way_forward_is_asked_only_when_a_failure_happens():
    asked: list[str] = []
    with _failures(asked=asked):
        pass
    assert asked == []
    with pytest.raises(TrainingInterrupted), _failures(asked=asked):
        raise KeyboardInterrupt
    assert asked == ["asked"]
