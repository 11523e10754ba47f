"""train/loader_errors.py: an error raised in a DataLoader worker comes back as its own last
line, with its type; the same error in the main process passes unchanged (a worker run with a
corrupt record: tests/train/test_cleaning_streamed.py)."""

from __future__ import annotations

import pytest

from marginface.train.loader_errors import next_batch

WORKER = (
    "Caught ValueError in DataLoader worker process 0.\n"
    "Original Traceback (most recent call last):\n"
    '  File "x.py", line 1, in <module>\n'
    "ValueError: record 7 of train.rec does not decode\n"
)


def _raising(error: Exception):
    raise error
    yield  # a generator: next() raises the error


def test_a_worker_error_is_its_last_line_with_its_type():
    with pytest.raises(ValueError, match=r"^record 7 of train.rec does not decode$"):
        next_batch(_raising(ValueError(WORKER)))
    with pytest.raises(OSError, match=r"^disk gone$"):
        next_batch(
            _raising(
                OSError(
                    WORKER.replace(
                        "ValueError: record 7 of train.rec does not decode", "OSError: disk gone"
                    )
                )
            )
        )


def test_other_errors_and_batches_pass_unchanged():
    assert next_batch(iter([1, 2])) == 1
    error = ValueError("plain message\nsecond line")
    with pytest.raises(ValueError) as raised:
        next_batch(_raising(error))
    assert raised.value is error
    with pytest.raises(StopIteration):
        next_batch(iter([]))
