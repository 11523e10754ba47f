"""The finetune recipe's own checks (train/finetune_recipe.py), called directly: each bad value
is a RecipeError naming its configuration key."""

from __future__ import annotations

import pytest

from marginface.models.catalogue import find_pretrained
from marginface.train.config_values import KeyValueError
from marginface.train.finetune_recipe import (
    CENTER_INITS,
    RecipeError,
    check_finetune_keys,
    finetune_description,
)


def test_a_pretrained_name_gives_its_description():
    assert finetune_description("dlib-resnet-v1", "auto") == find_pretrained("dlib").description


@pytest.mark.parametrize(
    ("init_from", "recipe", "key", "message"),
    [
        (None, "finetune", "recipe", "recipe finetune needs init_from"),
        ("no-such-model-or-file", "auto", "init_from", "no-such-model-or-file"),
    ],
)
def test_what_the_recipe_cannot_start_from_names_the_key(init_from, recipe, key, message):
    with pytest.raises(RecipeError, match=message) as caught:
        finetune_description(init_from, recipe)
    assert caught.value.key == key and isinstance(caught.value, KeyValueError)


@pytest.mark.parametrize(
    ("model", "center_init", "freeze", "key", "message"),
    [
        ("dlib-resnet-v1", "middle", 0, "center_init", "center_init must be one of"),
        ("dlib-resnet-v1", "class-mean", -1, "freeze_stages", "freeze_stages must be >= 0"),
        ("dlib-resnet-v1", "class-mean", 7, "freeze_stages", "has 6 stages"),
        ("seed-cnn", "class-mean", 1, "freeze_stages", "defines no stages"),
    ],
)
def test_bad_finetune_keys_name_the_key(model, center_init, freeze, key, message):
    with pytest.raises(RecipeError, match=message) as caught:
        check_finetune_keys(model, {}, center_init, freeze)
    assert caught.value.key == key


def test_good_keys_pass():
    assert "class-mean" in CENTER_INITS
    check_finetune_keys("dlib-resnet-v1", {}, "class-mean", 6)
    check_finetune_keys("seed-cnn", {}, "random", 0)
