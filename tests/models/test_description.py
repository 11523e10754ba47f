"""Self-describing weights: the description's validation, what a run's checkpoint makes of it,
and every format marginface writes (``.pt``, ``.safetensors``, TorchScript, ONNX) carrying it,
so that ``load_backbone(FILE)`` needs no other option."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from torch import nn

from marginface.export import (
    export_onnx,
    export_safetensors,
    export_state_dict,
    export_torchscript,
)
from marginface.models import IResNet
from marginface.models.description import (
    DESCRIPTION_FORMAT_VERSION,
    DESCRIPTION_KEY,
    ModelDescription,
    describe_run,
    read_description,
    sidecar_path,
)
from marginface.models.pretrained import load_backbone, load_described_backbone

needs_onnx = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None,
    reason="the marginface[onnx] extra is not installed",
)


def _r18() -> IResNet:
    """IResNet-18 at 32 px, D = 16, with activations of order 1 (see test_pretrained)."""
    torch.manual_seed(0)
    model = IResNet(18, 16, image_size=32).eval()
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, nonlinearity="linear")
            module.weight.data.mul_(0.5)
    return model


def _description(**changes) -> ModelDescription:
    values = dict(
        architecture="r18",
        embedding_dim=16,
        image_size=32,
        loss="arcface",
        loss_options={"margin": 0.5, "scale": 64.0},
        verification={"lfw_accuracy": 0.75},
        flip=True,
    )
    values.update(changes)
    return ModelDescription(**values)


# ---------------------------------------------------------------- the description itself
def test_round_trip_through_dict_and_json():
    description = _description(threshold=0.3, threshold_far=1e-3, threshold_set="lfw")
    assert description.image_size == (32, 32)
    assert ModelDescription.from_dict(description.to_dict()) == description
    assert ModelDescription.from_json(description.to_json()) == description
    assert json.loads(description.to_json())["image_size"] == [32, 32]
    assert description.format_version == DESCRIPTION_FORMAT_VERSION


def test_a_description_from_a_newer_format_is_one_line():
    data = _description().to_dict() | {"format_version": DESCRIPTION_FORMAT_VERSION + 1}
    with pytest.raises(
        ValueError,
        match=rf"^model\.json has model description format {DESCRIPTION_FORMAT_VERSION + 1}, newer",
    ) as e:
        ModelDescription.from_dict(data, source="model.json")
    assert "upgrade marginface" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"colour": "cmyk"}, r"colour must be one of rgb, bgr, grey, got 'cmyk'"),
        ({"colour": "grey"}, r"colour 'grey' does not fit in_channels = 3"),
        ({"embedding_dim": 0}, r"embedding_dim must be an int >= 1, got 0"),
        ({"std": 0.0}, r"std must be > 0, got 0\.0"),
        ({"mean": float("nan")}, r"mean must be a finite number, got nan"),
        ({"image_size": [32]}, r"image_size must be an int or \(H, W\)"),
        ({"threshold": 1.5}, r"threshold must be a cosine in \[-1, 1\], got 1\.5"),
        ({"threshold_far": 0.0}, r"threshold_far must be in \(0, 1\], got 0\.0"),
        ({"flip": "yes"}, r"flip must be a bool, got 'yes'"),
        ({"architecture": ""}, r"architecture must be a non-empty str"),
    ],
)
def test_bad_values_name_the_field(changes, match):
    data = _description().to_dict() | changes
    with pytest.raises(ValueError, match=r"^x\.pt: bad model description: " + match):
        ModelDescription.from_dict(data, source="x.pt")


def test_unknown_missing_and_non_object_descriptions_are_named():
    with pytest.raises(ValueError, match=r"unknown model description key\(s\) colour_order"):
        ModelDescription.from_dict(_description().to_dict() | {"colour_order": "rgb"})
    data = _description().to_dict()
    del data["embedding_dim"]
    with pytest.raises(ValueError, match=r"lacks embedding_dim"):
        ModelDescription.from_dict(data)
    with pytest.raises(ValueError, match=r"must be a JSON object, got list"):
        ModelDescription.from_dict([1, 2])
    with pytest.raises(ValueError, match=r"is not JSON"):
        ModelDescription.from_json("{nope")


def test_describe_run_reads_the_pipeline_normalisation_and_the_last_results():
    config = {"model": "r50", "embedding_dim": 512, "loss": "arcface", "flip": True}
    config |= {"loss_options": {"margin": 0.5}, "model_options": {"dropout": 0.1}}
    history = [
        {"epoch": 1, "loss": 9.0, "lfw_accuracy": 0.9, "cfp_fp_tar@far=1e-03": 0.5},
        {"epoch": 2, "loss": 8.0, "lfw_accuracy": 0.95, "test_eer": float("nan")},
    ]
    meta = {"in_channels": 3, "image_size": 112, "dataset": "insightface"}
    faces = describe_run(config, meta, history)
    assert (faces.mean, faces.std, faces.colour, faces.image_size) == (0.5, 0.5, "rgb", (112, 112))
    assert faces.verification == {"lfw_accuracy": 0.95, "test_eer": None}  # last row, no loss
    assert faces.architecture_options == {"dropout": 0.1} and faces.flip is True
    assert faces.loss_options == {"margin": 0.5}
    digits = describe_run({"model": "seed-cnn", "embedding_dim": 3}, {"in_channels": 1,
                          "image_size": [8, 10], "dataset": "digits"})  # fmt: skip
    assert (digits.mean, digits.std, digits.colour, digits.image_size) == (
        0.0,
        1.0,
        "grey",
        (8, 10),
    )
    assert digits.loss is None and digits.verification == {}


# ---------------------------------------------------------------- every format carries it
def _check_loads_alone(path, model, description, atol=0.0):
    assert read_description(path) == description
    loaded, found = load_described_backbone(path)  # no other option
    assert found == description
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=atol)


def test_pt_export_carries_the_description_and_loads_alone(tmp_path):
    model, description = _r18(), _description()
    path = export_state_dict(model, tmp_path / "backbone.pt", description=description)
    _check_loads_alone(path, model, description)
    saved = torch.load(path, weights_only=True)
    assert saved["description"] == description.to_dict()


def test_safetensors_export_carries_the_description_in_its_metadata(tmp_path):
    from safetensors import safe_open

    model, description = _r18(), _description()
    path = export_safetensors(model, tmp_path / "backbone.safetensors", description=description)
    with safe_open(str(path), framework="pt") as handle:
        assert json.loads(handle.metadata()[DESCRIPTION_KEY]) == description.to_dict()
    _check_loads_alone(path, model, description)


def test_torchscript_export_writes_its_description_beside_it(tmp_path):
    model, description = _r18(), _description()
    path = export_torchscript(
        model, torch.randn(2, 3, 32, 32), tmp_path / "model.ts", description=description
    )
    assert sidecar_path(path) == tmp_path / "model.ts.json"
    _check_loads_alone(path, model, description, atol=1e-5)
    sidecar_path(path).unlink()
    with pytest.raises(ValueError, match=r"TorchScript file without its description \(model\.ts"):
        load_backbone(path)


@needs_onnx
def test_onnx_export_carries_the_description_in_metadata_props(tmp_path):
    import onnx

    model, description = _r18(), _description()
    path = export_onnx(
        model, torch.randn(2, 3, 32, 32), tmp_path / "m.onnx", dynamo=False, description=description
    )
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert json.loads(props[DESCRIPTION_KEY]) == description.to_dict()
    _check_loads_alone(path, model, description, atol=1e-4)


def test_bgr_description_reverses_the_channels(tmp_path):
    model, description = _r18(), _description(colour="bgr")
    path = export_state_dict(model, tmp_path / "bgr.pt", description=description)
    loaded = load_backbone(path)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x.flip(1)), rtol=0, atol=0)


def test_a_file_without_description_and_no_options_says_which_are_needed(tmp_path):
    from marginface.models import create_model

    bare = create_model("mbf", embedding_dim=16, in_channels=3, image_size=32)
    torch.save(bare.state_dict(), tmp_path / "mbf.pth")
    with pytest.raises(ValueError) as error:
        load_backbone(tmp_path / "mbf.pth")
    message = str(error.value)
    assert "\n" not in message and "carries no marginface description" in message
    for needed in ("model= (--model", "embedding_dim= (--embedding-dim)", "image_size="):
        assert needed in message
    # the options insightface's files need today still work
    torch.save(_r18().state_dict(), tmp_path / "backbone.pth")
    loaded = load_backbone(tmp_path / "backbone.pth", model="r18", embedding_dim=16, image_size=32)
    assert loaded(torch.randn(1, 3, 32, 32)).shape == (1, 16)


@pytest.mark.parametrize(("depth", "dim", "side"), [(18, 16, 32), (34, 8, 48), (50, 12, 16)])
def test_an_arcface_torch_backbone_is_recognised_from_its_tensors(tmp_path, depth, dim, side):
    """insightface's backbone.pth carries no description: its depth, D and side are read from
    the blocks per stage and fc.weight's shape, so it loads without options."""
    torch.manual_seed(depth)
    model = IResNet(depth, dim, image_size=side).eval()
    torch.save(model.state_dict(), tmp_path / "backbone.pth")
    loaded, description = load_described_backbone(tmp_path / "backbone.pth")
    assert (description.architecture, description.embedding_dim) == (f"r{depth}", dim)
    assert description.image_size == (side, side)
    x = torch.randn(2, 3, side, side)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_a_state_dict_that_is_not_an_iresnet_is_not_recognised():
    from marginface.models.iresnet import infer_iresnet

    state = IResNet(18, 8, image_size=32).state_dict()
    assert infer_iresnet(state) == ("r18", 8, 32)
    state.pop("layer4.1.conv1.weight")  # blocks (2, 2, 2, 1): no depth has them
    assert infer_iresnet(state) is None
    assert infer_iresnet({"fc.weight": torch.zeros(8, 100), "conv1.weight": torch.zeros(1)}) is None
    assert infer_iresnet({"weight": torch.zeros(3)}) is None


def test_a_newer_description_in_a_file_is_one_line(tmp_path):
    path = export_safetensors(_r18(), tmp_path / "b.safetensors", description=_description())
    sidecar_path(path).write_text(json.dumps(_description().to_dict() | {"format_version": 7}))
    with pytest.raises(ValueError, match=r"b\.safetensors\.json has model description format 7"):
        load_backbone(path)


def test_export_refuses_a_description_of_another_type(tmp_path):
    with pytest.raises(
        TypeError, match=r"description must be a ModelDescription or None, got dict"
    ):
        export_safetensors(_r18(), tmp_path / "b.safetensors", description={"architecture": "r18"})
    with pytest.raises(TypeError, match=r"description must be a ModelDescription, got NoneType"):
        export_state_dict(_r18(), tmp_path / "b.pt", description=None)


def test_cli_evaluate_backbone_needs_no_option_for_a_described_file(tmp_path, capsys):
    from tests._tiny_sets import write_tiny_bin

    from marginface.cli import main

    write_tiny_bin(tmp_path, 32)
    path = export_state_dict(_r18(), tmp_path / "backbone.pt", description=_description())
    args = ["evaluate", "--backbone", str(path), "--data-dir", str(tmp_path), "--device", "cpu"]
    assert main(args) == 0
    assert "tiny_accuracy" in capsys.readouterr().out
    from marginface.models import create_model

    bare = create_model("mbf", embedding_dim=16, in_channels=3, image_size=32)
    torch.save(bare.state_dict(), tmp_path / "bare.pth")
    assert main([*args[:2], str(tmp_path / "bare.pth"), *args[3:]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "carries no marginface description" in err


def test_per_channel_mean_and_std_round_trip_and_normalise_each_channel():
    mean = (122.782 / 255, 117.001 / 255, 104.298 / 255)
    description = ModelDescription(
        architecture="r18", embedding_dim=8, mean=list(mean), std=256 / 255, face_crop="dlib-chip"
    )
    assert description.mean == pytest.approx(mean) and isinstance(description.mean, tuple)
    again = ModelDescription.from_json(description.to_json())
    assert again == description and again.face_crop == "dlib-chip"
    pixels = torch.randint(0, 256, (2, 3, 4, 5), dtype=torch.uint8)
    out = description.normalise(pixels)
    for c, avg in enumerate((122.782, 117.001, 104.298)):  # dlib's (x - avg[c]) / 256
        expected = (pixels[:, c].double() - avg) / 256
        assert torch.allclose(out[:, c].double(), expected, atol=1e-6)


def test_one_value_per_channel_that_are_equal_read_as_one_number():
    description = ModelDescription(architecture="r18", embedding_dim=8, mean=[0.5, 0.5, 0.5])
    assert description.mean == 0.5


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("mean", [0.5, 0.5], r"mean must be a finite number or 3 finite numbers"),
        ("mean", [0.5, float("nan"), 0.5], r"mean must be a finite number or 3"),
        ("std", [1.0, 0.0, 1.0], r"std must be > 0"),
        ("std", "wide", r"std must be a finite number, got 'wide'"),
        ("face_crop", "square", r"face_crop must be one of arcface, dlib-chip, mtcnn-box"),
    ],
)
def test_bad_per_channel_values_and_face_crops_are_named(key, value, message):
    with pytest.raises(ValueError, match=message):
        ModelDescription(architecture="r18", embedding_dim=8, **{key: value})


def test_a_format_1_description_still_reads():
    data = _description().to_dict()
    data.pop("face_crop")
    data["format_version"] = 1
    assert ModelDescription.from_dict(data).face_crop is None
