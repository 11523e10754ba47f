"""A misspelled option or subcommand: one line naming the nearest valid ones, exit status 2."""

from __future__ import annotations

import argparse

import pytest

from marginface.cli import main
from marginface.cli.suggestions import SuggestingParser, nearest


def _error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "--los", "arcface"], "train: unknown option --los; did you mean --loss"),
        (["train", "--ephocs", "3"], "train: unknown option --ephocs; did you mean --epochs?"),
        (["evaluate", "--flp"], "evaluate: unknown option --flp; did you mean --flip?"),
        (["demo", "--epoch=3"], "demo: unknown option --epoch; did you mean --epochs?"),
        (["-q", "train", "--los", "x"], "train: unknown option --los; did you mean --loss"),
    ],
)
def test_a_misspelled_option_names_the_subcommand_s_nearest(argv, expected, capsys) -> None:
    assert _error(argv, capsys).startswith("marginface " + expected)


def test_the_suggestions_come_from_that_subcommand(capsys) -> None:
    """``--flip`` is an option of evaluate, not of plot: plot's error does not offer it."""
    line = _error(["plot", "run", "--flp"], capsys)
    assert line == "marginface plot: unknown option --flp; see marginface plot --help"


def test_an_abbreviation_is_not_expanded(capsys) -> None:
    line = _error(["train", "--drop"], capsys)
    assert line == (
        "marginface train: unknown option --drop; did you mean --drop-non-dominant or "
        "--drop-outliers?"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["trian"], "marginface: unknown command 'trian'; did you mean train?"),
        (["-v", "evalute", "x"], "marginface: unknown command 'evalute'; did you mean evaluate?"),
    ],
)
def test_a_misspelled_subcommand_names_the_nearest(argv, expected, capsys) -> None:
    assert _error(argv, capsys) == expected


def test_an_unknown_subcommand_far_from_all_lists_them(capsys) -> None:
    line = _error(["xyz"], capsys)
    assert line.startswith("marginface: unknown command 'xyz'; commands: align, compare,")


def test_an_option_before_the_subcommand_is_the_top_level_s(capsys) -> None:
    line = _error(["--quite", "train"], capsys)
    assert line == "marginface: unknown option --quite; did you mean --quiet?"


def test_an_extra_argument_and_other_errors_are_one_line(capsys) -> None:
    assert _error(["train", "extra"], capsys) == (
        "marginface train: unexpected argument 'extra' (see marginface train --help)"
    )
    assert _error(["train", "--epochs", "x"], capsys) == (
        "marginface train: error: argument --epochs: invalid int value: 'x' "
        "(see marginface train --help)"
    )


def test_nearest() -> None:
    options = ["--loss", "--lr", "--epochs", "--loss-option", "--limit"]
    assert nearest("--los", options) == ["--loss", "--loss-option"]
    assert nearest("--epohcs", options) == ["--epochs"]
    assert nearest("--zzzz", options) == []
    # a prefix of three letters or more is an abbreviation; a shorter one is not
    assert nearest("--dro", ["--drop-outliers", "--ga"]) == ["--drop-outliers"]
    assert nearest("--dr", ["--drop-outliers", "--ga"]) == []


def test_a_parser_without_subcommands_suggests_its_own_options(capsys) -> None:
    parser = SuggestingParser(prog="tool")
    parser.add_argument("--threshold", type=float)
    with pytest.raises(SystemExit):
        parser.parse_args(["--treshold", "1"])
    assert capsys.readouterr().err == "tool: unknown option --treshold; did you mean --threshold?\n"
    assert parser.parse_args(["--threshold", "2"]) == argparse.Namespace(threshold=2.0)
