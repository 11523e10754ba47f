"""Typed config: defaults, TOML, overrides, unknown keys, round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from marginface.train.config import (
    PIPELINE_SCALE,
    TrainConfig,
    config_from_dict,
    default_loss_options,
    dump_toml,
    load_config,
    resolve_loss_options,
    save_config,
)


def test_toml_then_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('loss = "arcface"\nepochs = 7\n[loss_options]\nscale = 16.0\n')
    config = load_config(path, {"epochs": 9, "lr": None})
    assert config.loss == "arcface"
    assert config.epochs == 9  # override wins
    assert config.lr == 1e-3  # None means "not given"
    assert config.loss_options == {"scale": 16.0}


def test_unknown_key_names_the_valid_ones(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("epoch = 3\n")
    with pytest.raises(
        ValueError, match=r"unknown key\(s\) in .*c.toml: epoch; valid keys:.*epochs"
    ):
        load_config(path)
    with pytest.raises(ValueError, match=r"unknown key.*lossy"):
        load_config(None, {"lossy": "x"})


def test_bad_types_and_values_name_the_key():
    with pytest.raises(TypeError, match="'epochs' must be int"):
        config_from_dict({"epochs": "3"})
    with pytest.raises(TypeError, match="'channels_last' must be bool"):
        config_from_dict({"channels_last": 1})
    with pytest.raises(ValueError, match="optimizer must be one of adam, adamw, sgd"):
        TrainConfig(optimizer="lamb")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        TrainConfig(batch_size=0)
    assert TrainConfig(lr=1).lr == 1.0  # an int where a float is expected is fine


def test_invalid_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("epochs = = 3")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing.toml")


def test_saved_config_round_trips(tmp_path):
    config = TrainConfig(loss="cosface", loss_options={"margin": 0.2}, grad_clip=5.0, limit=10)
    path = save_config(config, tmp_path / "config.toml")
    assert config_from_dict(tomllib.loads(path.read_text())) == config
    assert "grad_clip = 5.0" in dump_toml(config.to_dict())


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parents[2] / "examples").glob("*.toml")), ids=lambda p: p.name
)
def test_every_example_configuration_loads(path):
    config = load_config(path)
    assert config.epochs >= 1


def test_pipeline_loss_defaults_are_per_loss():
    assert TrainConfig().loss_options == {}
    assert default_loss_options("arcface") == {"scale": PIPELINE_SCALE} == {"scale": 30.0}
    assert default_loss_options("adacos") == {}  # AdaCos takes no scale
    assert default_loss_options("AM-Softmax") == {"scale": 30.0}  # aliases resolve
    with pytest.raises(ValueError, match="unknown loss 'bogus'"):
        default_loss_options("bogus")


def test_explicit_loss_options_win_key_by_key():
    options = {"margin": 0.2}
    assert resolve_loss_options("cosface", options) == {"scale": 30.0, "margin": 0.2}
    assert options == {"margin": 0.2}  # not modified
    assert resolve_loss_options("cosface", {"scale": 64.0}) == {"scale": 64.0}
    config = TrainConfig(loss="cosface", loss_options={"margin": 0.2})
    resolved = config.resolved()
    assert resolved.loss_options == {"scale": 30.0, "margin": 0.2}
    assert config.loss_options == {"margin": 0.2}
    assert resolved.resolved() == resolved  # idempotent
    assert TrainConfig(loss="adacos", loss_options={"dynamic": False}).resolved().loss_options == {
        "dynamic": False
    }


def test_exclude_lists_training_positions():
    from marginface.train.config import ConfigValueError, TrainConfig

    assert TrainConfig(exclude=[5, 1, 5]).exclude == [1, 5]
    for bad in ([-1], [1.5], [True], ["3"]):
        with pytest.raises(ConfigValueError, match="exclude"):
            TrainConfig(exclude=bad)
    with pytest.raises(TypeError, match="exclude"):
        TrainConfig(exclude=3)


def test_exclude_beyond_the_training_set_is_a_clear_error():
    from marginface.train import load_bundle
    from marginface.train.config import ConfigValueError, TrainConfig

    with pytest.raises(ConfigValueError, match="position 99 but the training set has 50"):
        load_bundle(TrainConfig(limit=50, exclude=[3, 99]))
    assert len(load_bundle(TrainConfig(limit=50, exclude=[0, 49])).train) == 48
