"""The configuration values the recipe line (and the command's messages) format are checked
when the configuration is built, so that a bad value is named with its key instead of failing
inside the formatting ("Unknown format code 'g' for object of type 'str'", issue 49)."""

from __future__ import annotations

import math

import pytest

from marginface.cli import main
from marginface.train.config import ConfigValueError, TrainConfig, describe_recipe

BAD_SCALES = [
    ("big", r"loss_options scale must be a real number, got 'big' \(str\)"),
    ([1, 2], r"loss_options scale must be a real number, got \[1, 2\] \(list\)"),
    (True, r"loss_options scale must be a real number, got True \(bool\)"),
    ({"a": 1}, r"loss_options scale must be a real number, got \{'a': 1\} \(dict\)"),
    (math.nan, r"loss_options scale must be finite, got nan"),
    (math.inf, r"loss_options scale must be finite, got inf"),
    (0, r"loss_options scale must be > 0, got 0"),
    (-2.5, r"loss_options scale must be > 0, got -2.5"),
]


@pytest.mark.parametrize(("scale", "pattern"), BAD_SCALES)
def test_a_bad_scale_is_named_with_its_value(scale, pattern):
    with pytest.raises(ConfigValueError, match=pattern) as caught:
        TrainConfig(dataset="lfw", loss_options={"scale": scale})
    assert caught.value.key == "loss_options"


@pytest.mark.parametrize(
    ("rgb", "shown"),
    [("yes", "'yes'"), (1, "1"), ([True], r"\[True\]"), (math.nan, "nan"), ("true", "'true'")],
)
def test_a_colour_that_is_not_a_bool_is_named(rgb, shown):
    with pytest.raises(
        ConfigValueError, match=f"dataset_options rgb must be true or false, got {shown}"
    ):
        TrainConfig(dataset="folder", dataset_options={"rgb": rgb})


def test_good_values_are_shown():
    line = describe_recipe(TrainConfig(dataset="lfw", loss_options={"scale": 32}))
    assert "arcface scale=32," in line
    none = describe_recipe(
        TrainConfig(dataset="lfw", loss="sphereface", loss_options={"scale": None})
    )
    assert "sphereface scale=‖x‖," in none  # SphereFace's feature-norm scale


def test_the_toml_config_of_the_issue_names_the_option(tmp_path, capsys):
    """``loss_options.scale = "big"`` in a TOML file: one line naming the key and the value,
    exit 2, no run folder."""
    config = tmp_path / "c.toml"
    config.write_text('loss = "arcface"\nepochs = 1\n[loss_options]\nscale = "big"\n')
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "scale must be a real number, got 'big' (str)" in err, err
    assert "Unknown format code" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("scale=big", "--loss-option scale must be a real number, got 'big' (str)"),
        ("scale=[1,2]", "--loss-option scale must be a real number, got [1, 2] (list)"),
        ("scale=true", "--loss-option scale must be a real number, got True (bool)"),
        ("scale=nan", "--loss-option scale must be finite, got nan"),
    ],
)
def test_the_command_line_names_the_flag(tmp_path, capsys, option, expected):
    args = ["train", "--dataset", "lfw", "--loss-option", option, "--out", str(tmp_path / "r")]
    assert main(args) == 2
    assert f"marginface train: error: {expected}" in capsys.readouterr().err
