"""train/config_values.py called directly: each out-of-range value and each option the recipe
line formats is a KeyValueError naming its configuration key."""

from __future__ import annotations

import pytest

from marginface.train.config import TrainConfig
from marginface.train.config_values import KeyValueError, check_shown_options, check_values


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"lr": -1.0}, "lr"),
        ({"sample_rate": 1.5}, "sample_rate"),
        ({"workers": -1}, "workers"),
        ({"exclude": [3, -2]}, "exclude"),
        ({"optimizer": "lion"}, "optimizer"),
        ({"grad_accumulation": 10_000}, "grad_accumulation"),
    ],
)
def test_an_out_of_range_value_names_its_key(change, key):
    config = TrainConfig()
    for name, value in change.items():
        object.__setattr__(config, name, value)
    with pytest.raises(KeyValueError) as caught:
        check_values(config)
    assert caught.value.key == key and key in str(caught.value)


def test_exclude_is_sorted_and_deduplicated():
    config = TrainConfig()
    config.exclude = [5, 1, 5]
    check_values(config)
    assert config.exclude == [1, 5]


@pytest.mark.parametrize(
    ("loss_options", "dataset_options", "key"),
    [
        ({"scale": "big"}, {}, "loss_options"),
        ({"scale": float("nan")}, {}, "loss_options"),
        ({"scale": 0}, {}, "loss_options"),
        ({}, {"rgb": "yes"}, "dataset_options"),
    ],
)
def test_the_shown_options_name_their_key(loss_options, dataset_options, key):
    with pytest.raises(KeyValueError) as caught:
        check_shown_options(loss_options, dataset_options)
    assert caught.value.key == key


def test_sphereface_feature_norm_scale_and_a_bool_rgb_pass():
    check_shown_options({"scale": None}, {"rgb": False})
    check_shown_options({"scale": 30}, {})
