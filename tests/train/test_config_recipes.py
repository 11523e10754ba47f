"""The recipe a dataset chooses (issue 40): the face recipe on the photo sets, the sphere recipe
on the small demo sets, explicit values winning key by key, the resolved values saved and read
back unchanged, and the one line that names the recipe."""

from __future__ import annotations

import dataclasses

import pytest

from marginface.data import list_datasets
from marginface.train.config import (
    BY_RECIPE,
    PIPELINE_SCALE,
    RECIPE_KEYS,
    ConfigValueError,
    TrainConfig,
    config_from_dict,
    dataset_recipe,
    default_loss_options,
    describe_recipe,
    load_config,
    recipe_defaults,
)

FACE = ["insightface", "folder", "lfw", "orl", "yaleb"]
SPHERE = ["digits", "mnist", "fashion-mnist", "omniglot"]


def test_every_registered_dataset_has_a_decided_recipe():
    assert sorted(FACE + SPHERE) == list_datasets()  # a new dataset must be placed here
    assert [dataset_recipe(name) for name in FACE] == ["face"] * len(FACE)
    assert [dataset_recipe(name) for name in SPHERE] == ["sphere"] * len(SPHERE)
    assert dataset_recipe("Fashion_MNIST") == "sphere" and dataset_recipe("LFW") == "face"
    assert dataset_recipe("my-own-registered-set") == "sphere"


@pytest.mark.parametrize("dataset", FACE)
def test_face_recipe_on_the_photo_sets(dataset):
    config = TrainConfig(dataset=dataset)
    assert config.recipe == "face"
    assert (config.embedding_dim, config.loss) == (512, "arcface")
    assert (config.optimizer, config.lr, config.weight_decay) == ("sgd", 0.1, 5e-4)
    assert (config.momentum, config.schedule, config.poly_power) == (0.9, "polynomial", 1.0)
    # IResNet-50 for the large sets, IResNet-18 for the small ones (400 to 13k images)
    assert config.model == ("r18" if dataset in ("lfw", "orl", "yaleb") else "r50")
    # insightface records keep their own size (112 in insightface's sets)
    assert config.image_size == (None if dataset == "insightface" else 112)
    assert config.dataset_options == ({"rgb": True} if dataset == "folder" else {})
    assert config.resolved().loss_options == {"scale": 64.0}  # ArcFace's m = 0.5 is its own
    assert set(config.recipe_filled) == set(RECIPE_KEYS)


@pytest.mark.parametrize("dataset", SPHERE)
def test_sphere_recipe_on_the_demo_sets(dataset):
    config = TrainConfig(dataset=dataset)
    assert config.recipe == "sphere"
    assert (config.model, config.embedding_dim, config.loss) == ("seed-cnn", 3, "curricularface")
    assert (config.optimizer, config.lr, config.weight_decay) == ("adam", 1e-3, 0.0)
    assert (config.schedule, config.image_size, config.dataset_options) == ("constant", None, {})
    assert config.resolved().loss_options == {"scale": PIPELINE_SCALE}


def test_explicit_values_win_over_the_recipe_key_by_key():
    config = TrainConfig(dataset="lfw", embedding_dim=128, lr=0.02, image_size=None)
    assert (config.embedding_dim, config.lr, config.image_size) == (128, 0.02, None)
    assert (config.loss, config.optimizer, config.model) == ("arcface", "sgd", "r18")
    assert "embedding_dim" not in config.recipe_filled and "image_size" not in config.recipe_filled
    forced = TrainConfig(dataset="lfw", recipe="sphere")
    assert (forced.recipe, forced.embedding_dim, forced.optimizer) == ("sphere", 3, "adam")
    assert TrainConfig(dataset="digits", recipe="face").model == "r50"
    options = TrainConfig(dataset="folder", dataset_options={"test_fraction": 0.4})
    assert options.dataset_options == {"test_fraction": 0.4}  # a table replaces the recipe's


def test_explicit_scale_wins_and_the_face_scale_is_the_loss_own():
    config = TrainConfig(dataset="lfw", loss_options={"scale": 32.0, "margin": 0.4})
    assert config.resolved().loss_options == {"scale": 32.0, "margin": 0.4}
    assert TrainConfig(dataset="lfw", loss="am-softmax").resolved().loss_options == {"scale": 30.0}
    assert TrainConfig(dataset="lfw", loss="adacos").resolved().loss_options == {}
    assert default_loss_options("cosface", "face") == {"scale": 64.0}
    assert default_loss_options("cosface") == {"scale": PIPELINE_SCALE}


def test_command_line_and_toml_values_win(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('dataset = "insightface"\noptimizer = "adamw"\n')
    config = load_config(path, {"embedding_dim": 256, "loss": None})
    assert (config.optimizer, config.embedding_dim, config.loss) == ("adamw", 256, "arcface")
    assert config_from_dict({"dataset": "orl", "recipe": "sphere"}).model == "seed-cnn"


def test_saved_values_read_back_unchanged():
    config = TrainConfig(dataset="folder", embedding_dim=64).resolved()
    saved = config.to_dict()
    assert saved["recipe"] == "face" and BY_RECIPE not in saved.values()
    again = config_from_dict(saved)
    assert again == config and again.recipe_filled == ()
    # a run saved before recipes existed (no "recipe" key, the sphere values on a face set)
    old = TrainConfig(dataset="lfw", recipe="sphere").to_dict()
    del old["recipe"]
    restored = config_from_dict(old)
    assert [getattr(restored, key) for key in RECIPE_KEYS] == [old[key] for key in RECIPE_KEYS]
    assert dataclasses.replace(TrainConfig(dataset="lfw")).recipe_filled == ()


def test_recipe_defaults_returns_fresh_tables():
    first = recipe_defaults("auto", "folder")
    first["dataset_options"]["rgb"] = False
    assert recipe_defaults("face", "folder")["dataset_options"] == {"rgb": True}
    assert recipe_defaults("sphere", "folder")["dataset_options"] == {}


@pytest.mark.parametrize("bad", ["faces", "", "AUTO"])
def test_bad_recipe_is_named(bad):
    with pytest.raises(
        ConfigValueError, match=f"recipe must be one of auto, face, sphere, finetune, got {bad!r}"
    ):
        TrainConfig(recipe=bad)
    with pytest.raises(ValueError, match="recipe must be one of"):
        recipe_defaults(bad, "lfw")


def test_bad_recipe_and_dataset_types_are_named():
    with pytest.raises(ConfigValueError, match="recipe must be one of .* got 3"):
        TrainConfig(recipe=3)
    with pytest.raises(TypeError, match="config key 'dataset' must be str, got 3"):
        TrainConfig(dataset=3)


def test_describe_recipe_names_the_recipe_and_the_overrides():
    line = describe_recipe(TrainConfig(dataset="insightface"))
    assert line == (
        "recipe: face (dataset insightface): r50, 512-D, arcface scale=64, sgd lr 0.1 poly, "
        "the records' own size; override with --model/--embedding-dim/--loss/--optimizer/--lr/"
        "--weight-decay/--schedule or --recipe sphere"
    )
    folder = describe_recipe(TrainConfig(dataset="folder", embedding_dim=8), spell=str.upper)
    assert "r50, 8-D, arcface scale=64, sgd lr 0.1 poly, 112x112 RGB;" in folder
    assert "override with MODEL/LOSS/OPTIMIZER/LR/WEIGHT_DECAY/SCHEDULE/IMAGE_SIZE/" in folder
    assert folder.endswith("DATASET_OPTIONS or --recipe sphere")
    digits = describe_recipe(TrainConfig())
    assert digits.startswith("recipe: sphere (dataset digits): seed-cnn, 3-D, curricularface ")
    assert "scale=30, adam lr 0.001 constant, the dataset's own size;" in digits
    assert digits.endswith("or --recipe face")
    explicit = dict.fromkeys(RECIPE_KEYS)
    explicit.update(TrainConfig(dataset="lfw").to_dict())
    assert describe_recipe(config_from_dict(explicit)) is None
    # the sphere recipe's only other choices are no-ops: no resize, no loader options
    chosen = {"model": "seed-cnn", "embedding_dim": 3, "loss": "arcface", "optimizer": "sgd"}
    chosen |= {"lr": 0.1, "weight_decay": 0.0, "schedule": "cosine"}
    config = TrainConfig(**chosen)
    assert config.recipe_filled == ("image_size", "dataset_options")
    assert describe_recipe(config) is None
    line = describe_recipe(TrainConfig(**{**chosen, "dataset": "folder"}))
    assert line.endswith("override with --image-size/--dataset-options or --recipe sphere")
