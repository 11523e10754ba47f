"""marginface._progress: the one helper every long loop shows its progress with (a tqdm bar
on a terminal, a log line every interval seconds elsewhere, nothing outside a
progress_output block or in "none" mode)."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest

from marginface import _progress
from marginface._progress import (
    Progress,
    counting,
    progress_callback,
    progress_output,
    progress_settings,
    track,
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeClock:
    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += self.step


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "marginface.progress"]


def run(clock: FakeClock, items, desc: str = "lfw (flipped)", **kwargs) -> list:
    seen = []
    for item in track(items, desc, clock=clock, **kwargs):
        clock.tick()  # the item's work takes one step of the fake clock
        seen.append(item)
    return seen


def test_lines_every_interval_then_a_last_line(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.progress")
    clock = FakeClock(6.0)
    with progress_output("lines", 10):
        assert run(clock, range(4), unit="batches") == [0, 1, 2, 3]
    assert messages(caplog) == [
        "lfw (flipped): 2/4 batches (50%)  0:00:12 elapsed  eta 0:00:12",
        "lfw (flipped): 4/4 batches (100%)  0:00:24 elapsed  eta 0:00:00",
        "lfw (flipped): 4/4 batches (100%)  0:00:24 elapsed  done",
    ]


def test_a_loop_shorter_than_the_interval_says_nothing(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.progress")
    with progress_output("lines", 30):
        run(FakeClock(1.0), range(5))
    assert messages(caplog) == []


def test_an_unknown_total_counts_items(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.progress")
    with progress_output("lines", 0):
        run(FakeClock(1.0), (i for i in range(2)), "reading", unit="images")
    assert messages(caplog) == [
        "reading: 1 images  0:00:01 elapsed  eta ?",
        "reading: 2 images  0:00:02 elapsed  eta ?",
        "reading: 2 images  0:00:02 elapsed  done",
    ]


def test_nothing_outside_a_block_or_in_none_mode(caplog, monkeypatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(_progress, "BAR_DELAY_SECONDS", 0.0)
    caplog.set_level(logging.INFO, logger="marginface.progress")
    assert progress_settings().mode == "none"  # the library's default
    run(FakeClock(100.0), range(3))
    with progress_output("none", 0):
        run(FakeClock(100.0), range(3))
    assert messages(caplog) == [] and terminal.getvalue() == ""


def test_a_bar_on_a_terminal(monkeypatch, caplog) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(_progress, "BAR_DELAY_SECONDS", 0.0)
    caplog.set_level(logging.INFO, logger="marginface.progress")
    with progress_output("auto", 0):  # stderr is a terminal: a bar, no log lines
        run(FakeClock(1.0), range(3), "test set", unit="batches")
    assert "\r" in terminal.getvalue() and "test set" in terminal.getvalue()
    assert "0/3" in terminal.getvalue()  # the total, drawn at the start
    assert messages(caplog) == []


def test_a_short_loop_shows_no_bar(monkeypatch) -> None:
    """The bar waits BAR_DELAY_SECONDS (2 s) before it appears."""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress_output("bar", 0):
        list(track(range(3), "quick"))
    assert terminal.getvalue() == ""


def test_blocks_nest_and_restore_the_settings() -> None:
    before = progress_settings()
    with progress_output("lines", 5) as outer:
        assert progress_settings() == outer and outer.interval == 5.0
        with progress_output("none"):
            assert progress_settings().mode == "none"
        assert progress_settings() == outer
    assert progress_settings() == before
    with pytest.raises(RuntimeError), progress_output("lines", 1):
        raise RuntimeError("the block failed")
    assert progress_settings() == before


@pytest.mark.parametrize(
    ("mode", "interval", "match"),
    [("fancy", 1, "progress must be"), ("lines", -1, "progress_seconds"), (True, "2", "got '2'")],
)
def test_bad_settings_are_errors_naming_them(mode, interval, match) -> None:
    with pytest.raises(ValueError, match=match), progress_output(mode, interval):
        pass


def test_a_callback_counts_and_closes_at_the_total(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.progress")
    with progress_output("lines", 0):
        callback = progress_callback("IJBC images", unit="images")
        for done in (4, 8, 10):
            callback(done, 10)
    found = messages(caplog)
    assert [m.split("  ")[0] for m in found] == [
        "IJBC images: 4/10 images (40%)",
        "IJBC images: 8/10 images (80%)",
        "IJBC images: 10/10 images (100%)",
        "IJBC images: 10/10 images (100%)",
    ]
    assert found[-1].endswith("done")


def test_counting_closes_when_its_block_ends_an_error_included(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.progress")
    with (
        pytest.raises(RuntimeError),
        progress_output("lines", 0),
        counting("embedding", unit="images") as progress,
    ):
        for done in (3, 6):
            progress(done, 12)
        raise RuntimeError("an unreadable image")
    found = messages(caplog)
    assert [m.split("  ")[0] for m in found] == [
        "embedding: 3/12 images (25%)",
        "embedding: 6/12 images (50%)",
        "embedding: 6/12 images (50%)",
    ]
    assert found[-1].endswith("done")  # closed by the block, not by reaching the total
    caplog.clear()
    with progress_output("lines", 0), counting("embedding") as progress:
        pass  # never called: no display made, nothing said
    assert messages(caplog) == []


def test_progress_counts_by_update_and_set(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.progress")
    clock = FakeClock(1.0)
    with progress_output("lines", 0), Progress("converting", 100, unit="images", clock=clock) as p:
        clock.tick()
        p.update(25)
        clock.tick()
        p.set(50)
    assert messages(caplog)[:2] == [
        "converting: 25/100 images (25%)  0:00:01 elapsed  eta 0:00:03",
        "converting: 50/100 images (50%)  0:00:02 elapsed  eta 0:00:02",
    ]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"desc": None}, TypeError, "desc must be a string, got None"),
        ({"unit": 3}, TypeError, "unit must be a string, got 3"),
        ({"total": -1}, ValueError, "total must be None or an int >= 0, got -1"),
        ({"total": 2.5}, ValueError, "got 2.5"),
        ({"total": True}, ValueError, "got True"),
    ],
)
def test_bad_progress_arguments_are_named(kwargs, error, match) -> None:
    arguments = {"desc": "x", "total": 3, **kwargs}
    with pytest.raises(error, match=re.escape(match)):
        Progress(arguments.pop("desc"), arguments.pop("total"), **arguments)
