"""Fine-tuning (issue 46): the finetune recipe read from a pretrained model's description,
conflicting options, frozen stages, class centers at the class means, the model's own pixel
normalisation in training and in the run's description (train/finetune.py, finetune_recipe.py,
model_input.py; train/config.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from marginface.data.base import DatasetBundle, ImageSet
from marginface.models.catalogue import find_pretrained
from marginface.models.dlib_resnet import DlibResNet
from marginface.models.iresnet import IResNet
from marginface.registry import create_loss
from marginface.train.build import build_training
from marginface.train.config import ConfigValueError, TrainConfig, describe_recipe
from marginface.train.finetune import (
    class_mean_centers,
    freeze_stages,
    init_centers_from_class_means,
    model_stages,
    stage_count,
)

DLIB = find_pretrained("dlib-resnet-v1").description


def _dlib_file_present() -> bool:
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        return False
    folder = Path(spec.submodule_search_locations[0]) / "models"
    return (folder / "dlib_face_recognition_resnet_model_v1.dat").is_file()


# ------------------------------------------------------------------ the recipe
def test_init_from_a_pretrained_name_chooses_the_finetune_recipe_and_the_models_input():
    config = TrainConfig(dataset="orl", init_from="dlib-resnet-v1")
    assert config.recipe == "finetune"
    assert (config.model, config.embedding_dim, config.image_size) == ("dlib-resnet-v1", 128, 150)
    assert config.model_input == {
        "mean": list(DLIB.mean),
        "std": DLIB.std,
        "colour": "rgb",
        "face_crop": "dlib-chip",
    }
    assert (config.optimizer, config.lr, config.weight_decay, config.schedule) == (
        "sgd", 3e-5, 0.0, "cosine",
    )  # fmt: skip
    assert (config.epochs, config.freeze_stages, config.center_init) == (10, 3, "class-mean")
    assert config.resolved().loss_options == {"scale": 30.0}
    assert TrainConfig(dataset="folder", init_from="dlib").dataset_options == {"rgb": True}


def test_the_other_recipes_keep_their_defaults():
    config = TrainConfig(dataset="lfw")
    assert (config.epochs, config.freeze_stages, config.center_init) == (20, 0, "random")
    assert "epochs" not in config.recipe_filled and config.model_input == {}


def test_the_recipe_line_names_the_model_input_and_the_fine_tuning_choices():
    line = describe_recipe(TrainConfig(dataset="yaleb", init_from="dlib-resnet-v1"))
    assert line == (
        "recipe: finetune (from dlib-resnet-v1, dataset yaleb): dlib-resnet-v1, 128-D, 150x150 "
        "rgb (x/255 - (0.4815, 0.4588, 0.409)) / 1.004, dlib-chip crops; arcface scale=30, sgd "
        "lr 3e-05 cosine, 10 epochs, 3 of 6 stages frozen, centers from class means; override "
        "with --loss/--optimizer/--lr/--weight-decay/--schedule/--epochs/--freeze-stages/"
        "--center-init or --recipe face"
    )
    explicit = TrainConfig(dataset="yaleb", init_from="dlib", lr=0.003, freeze_stages=0)
    line = describe_recipe(explicit)
    assert "lr 0.003" in line and "0 of 6 stages frozen" in line
    assert "--lr" not in line and "--freeze-stages" not in line


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("model", "r18", ["model = 'r18'", "'dlib-resnet-v1'"]),
        ("embedding_dim", 512, ["embedding_dim = 512", "128"]),
        ("image_size", 112, ["image_size = 112", "150"]),
        ("model_input", {"mean": 0.5}, ["model_input.mean = 0.5", "0.481498"]),
        ("model_input", {"face_crop": "arcface"}, ["'arcface'", "'dlib-chip'"]),
    ],
)
def test_an_explicit_option_that_conflicts_with_the_model_is_one_line_naming_both(
    option, value, words
):
    with pytest.raises(ConfigValueError) as error:
        TrainConfig(dataset="orl", init_from="dlib-resnet-v1", **{option: value})
    text = str(error.value)
    assert "\n" not in text and error.value.key == option
    for word in words:
        assert word[:20] in text, (word, text)


def test_an_explicit_value_equal_to_the_models_is_accepted():
    config = TrainConfig(dataset="orl", init_from="dlib", model="dlib-resnet-v1", image_size=150)
    assert config.recipe == "finetune" and config.recipe_filled.count("model") == 0


@pytest.mark.parametrize(
    ("values", "key", "words"),
    [
        ({"freeze_stages": -1}, "freeze_stages", "must be >= 0, got -1"),
        ({"freeze_stages": 7}, "freeze_stages", "dlib-resnet-v1 has 6 stages"),
        ({"center_init": "means"}, "center_init", "random, class-mean, got 'means'"),
        ({"init_from": "dlib-resnet-v2"}, "init_from", "did you mean"),
        ({"model_input": {"gamma": 2.2}}, "model_input", "unknown key(s) gamma"),
    ],
)
def test_bad_fine_tuning_values_are_one_line(values, key, words):
    values = {"dataset": "orl", "init_from": "dlib-resnet-v1", **values}
    with pytest.raises(ConfigValueError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
        TrainConfig(**values)
    assert e.value.key == key and "\n" not in str(e.value)


def test_freezing_a_model_without_stages_and_finetune_without_a_model_are_refused():
    with pytest.raises(ConfigValueError, match="'seed-cnn' defines no stages"):
        TrainConfig(dataset="digits", freeze_stages=1)
    with pytest.raises(ConfigValueError, match="recipe finetune needs init_from"):
        TrainConfig(dataset="orl", recipe="finetune")
    with pytest.raises(ConfigValueError, match="ONNX graph"):
        TrainConfig(dataset="orl", init_from="insightface-buffalo-l")


# ------------------------------------------------------------------ stages
def test_stages_of_dlib_resnet_and_iresnet():
    assert (stage_count("dlib-resnet-v1"), stage_count("r18"), stage_count("r50")) == (6, 5, 5)
    assert stage_count("seed-cnn") is None and stage_count("no-such-model") is None
    dlib = DlibResNet()
    stages = model_stages(dlib)
    assert len(stages) == 6 and stages[0] == [dlib.stem] and stages[5] == [dlib.stages[4]]
    iresnet = IResNet(18, 8, image_size=16)
    stages = model_stages(iresnet)
    assert len(stages) == 5 and stages[1] == [iresnet.layer1] and stages[4] == [iresnet.layer4]
    with pytest.raises(ValueError, match="not for Linear"):
        model_stages(torch.nn.Linear(2, 2))


def _step(model, images, frozen_ids):
    parameters = [p for p in model.parameters() if id(p) not in frozen_ids]
    optimizer = torch.optim.SGD(parameters, lr=0.1)
    model.train()
    model(images).pow(2).sum().backward()
    optimizer.step()


def test_frozen_dlib_stages_get_no_gradient_and_do_not_change():
    torch.manual_seed(0)
    model = DlibResNet()
    frozen = freeze_stages(model, 3)
    names = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert names == {
        name
        for name, _ in model.named_parameters()
        if name.startswith(("stem.", "stages.0.", "stages.1."))
    }
    assert len(frozen) == len(names)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    _step(model, torch.randn(2, 3, 150, 150), {id(p) for p in frozen})
    for name, p in model.named_parameters():
        if name in names:
            assert p.grad is None and torch.equal(p, before[name]), name
    assert not torch.equal(model.fc.weight, before["fc.weight"])
    assert not torch.equal(model.stages[2][0].conv1.weight, before["stages.2.0.conv1.weight"])


def test_frozen_iresnet_stages_keep_their_batchnorm_statistics():
    torch.manual_seed(0)
    model = IResNet(18, 8, image_size=16)
    frozen = freeze_stages(model, 2)
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    _step(model, torch.randn(4, 3, 16, 16), {id(p) for p in frozen})
    after = model.state_dict()
    for key, value in stats.items():
        kept = key.startswith(("bn1.", "layer1."))
        assert torch.equal(after[key], value) == kept, key
    assert all(p.grad is None for p in model.layer1.parameters())
    assert model.layer2[0].conv1.weight.grad is not None


def _bundle(images: np.ndarray, labels: np.ndarray) -> DatasetBundle:
    train = ImageSet(images.astype(np.float32), labels.astype(np.int64), ("a", "b", "c"))
    return DatasetBundle("folder", train, train)


def test_build_training_leaves_frozen_parameters_out_of_the_optimizer():
    config = TrainConfig(
        dataset="folder", model="r18", embedding_dim=8, image_size=16, freeze_stages=3,
        device="cpu", channels_last=False,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    bundle = _bundle(rng.random((6, 3, 16, 16)), np.array([0, 0, 1, 1, 2, 2]))
    setup = build_training(config, bundle, device=torch.device("cpu"))
    model = setup.objects.model
    in_optimizer = {id(p) for g in setup.objects.optimizer.param_groups for p in g["params"]}
    stem_and_two = [model.conv1, model.bn1, model.prelu, model.layer1, model.layer2]
    frozen = [p for module in stem_and_two for p in module.parameters()]
    assert frozen and all(not p.requires_grad and id(p) not in in_optimizer for p in frozen)
    assert id(model.layer3[0].conv1.weight) in in_optimizer
    assert id(model.fc.weight) in in_optimizer


# ------------------------------------------------------------------ class-mean centers
def test_class_mean_centers_are_the_normalised_means_of_the_normalised_embeddings():
    embeddings = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 1.0], [-5.0, 0.0]])
    labels = torch.tensor([0, 0, 1, 1])
    centers, present = class_mean_centers(embeddings, labels, 3)
    s = 2**-0.5
    expected0 = F.normalize(torch.tensor([[0.5, 0.5]]), dim=1)[0]  # mean of (1,0), (0,1)
    expected1 = F.normalize(torch.tensor([[(s - 1) / 2, s / 2]]), dim=1)[0]
    assert torch.allclose(centers[0], expected0) and torch.allclose(centers[1], expected1)
    assert present.tolist() == [True, True, False] and torch.equal(centers[2], torch.zeros(2))


def test_the_heads_centers_start_at_the_class_means_of_the_models_embeddings():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 4))
    head = create_loss("arcface", 3, 4, sub_centers=2)
    rng = np.random.default_rng(1)
    images = rng.random((7, 3, 2, 2)).astype(np.float32)
    labels = np.array([0, 0, 0, 1, 1, 2, 2])
    before = head.weight.detach().clone()
    init_centers_from_class_means(model, head, ImageSet(images, labels))
    with torch.no_grad():
        unit = F.normalize(model(torch.as_tensor(images)), dim=1)
    for k in range(3):
        expected = F.normalize(unit[labels == k].mean(0), dim=0)
        assert torch.allclose(head.weight[2 * k], expected, atol=1e-6)
        assert torch.equal(head.weight[2 * k + 1], before[2 * k + 1])  # the other sub-center
