"""``--help`` shows every default (issue 40): each option of each subcommand that has a default
states it; the options whose default the dataset chooses say "by dataset" with both recipes'."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from marginface.cli import build_parser
from marginface.cli.options import _TRAIN_FLAGS, DefaultsHelpFormatter, config_default_text
from marginface.train.config import FINETUNE_KEYS, PLAIN_DEFAULTS, RECIPE_KEYS, RECIPES, TrainConfig


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _option_help(text: str, flag: str) -> str:
    """The help paragraph of ``flag`` in a ``--help`` text (its line and the indented ones
    after it), whitespace collapsed."""
    lines = text.splitlines()
    pattern = re.compile(rf"^  (?:-\w, )?{re.escape(flag)}\b")
    for start, line in enumerate(lines):
        if pattern.match(line):
            block = [line]
            for following in lines[start + 1 :]:
                if not following.startswith("   "):  # an option's line or a group title
                    break
                block.append(following)
            return " ".join(" ".join(block).split())
    raise AssertionError(f"{flag} not in the help text")


def _shown(default: object) -> list[str]:
    if isinstance(default, bool):
        return ["off", "on"] if not default else ["on"]
    if isinstance(default, float):
        return [f"{default:g}", str(default)]
    return [str(default)]


PARSER = build_parser()
COMMANDS = sorted(_subparsers(PARSER))


def test_every_subcommand_is_checked():
    assert {"train", "evaluate", "compare", "convert", "demo", "plot", "export"} <= set(COMMANDS)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_option_with_a_default_shows_it(command):
    parser = PARSER if command is None else _subparsers(PARSER)[command]
    text = parser.format_help()
    checked = 0
    for action in parser._actions:
        default = action.default
        if not action.option_strings or default in (None, argparse.SUPPRESS):
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        paragraph = _option_help(text, action.option_strings[0])
        assert "default" in paragraph.lower(), (command, action.option_strings, paragraph)
        after = paragraph.lower().split("default", 1)[1]
        assert any(value.lower() in after for value in _shown(default)), (command, paragraph)
        checked += 1
    assert checked or command in ("align", "gallery"), f"{command}: no option with a default?"


@pytest.mark.parametrize("command", ["train", "compare"])
def test_training_options_show_the_configuration_defaults(command):
    text = _subparsers(PARSER)[command].format_help()
    fields = {item.name: item for item in dataclasses.fields(TrainConfig)}
    for flag, key, _, _ in _TRAIN_FLAGS:
        paragraph = _option_help(text, flag)
        if key in RECIPE_KEYS:
            face, sphere = (RECIPES[name][key] for name in ("face", "sphere"))
            assert f"default: by dataset: face recipe {_shown(face)[0]}" in paragraph, paragraph
            if sphere is not None:
                assert f"/ sphere recipe {_shown(sphere)[0]})" in paragraph, paragraph
        elif key in FINETUNE_KEYS:  # the finetune recipe's keys: the others' value first
            assert f"(default: {_shown(PLAIN_DEFAULTS[key])[0]} (finetune recipe:" in paragraph
        else:
            value = fields[key].default
            shown = "none" if value is None else _shown(value)[0]
            assert f"(default: {shown})" in paragraph, paragraph


def test_recipe_dependent_defaults_read_from_the_tables():
    assert config_default_text("model") == (
        "default: by dataset: face recipe r50 (r18 on lfw, orl, yaleb) / sphere recipe seed-cnn"
    )
    assert config_default_text("lr") == "default: by dataset: face recipe 0.1 / sphere recipe 0.001"
    assert config_default_text("image_size") == (
        "default: by dataset: face recipe 112 (none on insightface) / sphere recipe the "
        "dataset's own"
    )
    assert config_default_text("epochs") == "default: 20 (finetune recipe: 10)"
    assert config_default_text("augment") == "default: {}"
    with pytest.raises(ValueError, match="unknown configuration key 'epoch'"):
        config_default_text("epoch")
    train = _subparsers(PARSER)["train"].format_help()
    assert "face recipe arcface / sphere recipe curricularface" in " ".join(train.split())


def test_formatter_states_a_default_once():
    parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--a", type=int, default=3, help="A")
    parser.add_argument("--b", type=float, default=0.5, help="B (default 0.5)")
    parser.add_argument("--c", action="store_true", help="C")
    parser.add_argument("--d", default="50%", help="D")
    parser.add_argument("--e", help="E")
    text = " ".join(parser.format_help().split())
    assert "A (default: 3)" in text and "B (default 0.5) --c" in text
    assert "C (default: off)" in text and "D (default: 50%)" in text and "E -" not in text


NO_DEFAULT = {
    ("train", "--config"), ("train", "--init-from"), ("compare", "--config"),
    ("evaluate", "--backbone"), ("evaluate", "--onnx"), ("evaluate", "--model"),
    ("evaluate", "--data-dir"), ("evaluate", "--pairs"), ("evaluate", "--out"),
    ("convert", "--pairs"), ("ijb", "--backbone"), ("ijb", "--onnx"), ("ijb", "--model"),
    ("ijb", "--data-dir"), ("convert", "--reindex"), ("align", "--out"), ("detect", "--out"),
}  # fmt: skip
"""Options that name an input or output the user supplies, with nothing in its absence."""


@pytest.mark.parametrize("command", COMMANDS)
def test_every_other_option_states_its_default(command):
    parser = _subparsers(PARSER)[command]
    text = parser.format_help()
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flag = action.option_strings[0]
        paragraph = _option_help(text, flag)
        if (command, flag) in NO_DEFAULT:
            assert "default" not in paragraph.lower(), paragraph  # keep the list true
        else:
            assert "default" in paragraph.lower(), (command, paragraph)
