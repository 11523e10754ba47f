"""cli/arguments.py: the shared whole-number checks, and the commands that use them."""

from __future__ import annotations

import argparse

import pytest

from marginface.cli.arguments import non_negative_int, positive_int


@pytest.mark.parametrize(("check", "low"), [(non_negative_int, 0), (positive_int, 1)])
def test_bounds(check, low):
    assert check(str(low)) == low
    assert check("17") == 17
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be >= {low}, got {low - 1}"):
        check(str(low - 1))
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be an integer >= {low}, got 2.5"):
        check("2.5")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["detect", "x.jpg", "--out", "f.jsonl", "--workers", "-1"], "--workers: must be >= 0"),
        (["align", "a", "--out", "b", "--workers", "-2"], "--workers: must be >= 0"),
        (["embed", "m", "x.jpg", "--batch-size", "0"], "--batch-size: must be >= 1"),
        (["search", "m", "g", "x.jpg", "--top-k", "0"], "--top-k: must be >= 1"),
    ],
)
def test_commands_share_the_checks(argv, message, capsys):
    from marginface.cli import main

    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err
