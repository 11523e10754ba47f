"""Foreign weights: safe reading (.pth, checkpoints, .safetensors), one-line errors for files
that do not fit, BGR models, ONNX graphs, AdaFace's IR checkpoints, and the CLI's
``evaluate --backbone/--onnx`` and ``train --init-from``."""

from __future__ import annotations

import importlib.util
import io
import os
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from marginface.cli import main
from marginface.models import IResNet, create_model
from marginface.models.adaface import adaface_to_iresnet
from marginface.models.pretrained import (
    OnnxBackbone,
    ReversedChannels,
    load_backbone,
    read_state_dict,
)


def _r18(size: int = 32, dim: int = 16, channels: int = 3) -> IResNet:
    """A small IResNet-18 whose activations stay of order 1 (insightface's N(0, 0.1) init
    grows them ~2.4× per convolution: float32 exports would then differ by whole units)."""
    torch.manual_seed(0)
    model = IResNet(18, dim, image_size=size, in_channels=channels).eval()
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, nonlinearity="linear")
            module.weight.data.mul_(0.5)
    return model


def _load(path, **options):
    return load_backbone(path, model="r18", embedding_dim=16, image_size=32, **options)


# ---------------------------------------------------------------- reading files
def test_bare_checkpoint_lightning_and_ddp_files_are_read(tmp_path):
    state = _r18().state_dict()
    layouts = {
        "bare.pth": state,
        "checkpoint.pt": {"model": state, "epoch": 3},
        "lightning.ckpt": {"state_dict": state, "epoch": 3},
        "ddp.pth": {f"module.{k}": v for k, v in state.items()},
    }
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = _r18()(x)
        for name, content in layouts.items():
            torch.save(content, tmp_path / name)
            assert set(read_state_dict(tmp_path / name)) == set(state)
            torch.testing.assert_close(_load(tmp_path / name)(x), expected)


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "backbone.pth"
    torch.save({"conv1.weight": torch.zeros(1), "evil": Payload()}, path)
    with pytest.raises(ValueError, match=r"refused to load .*backbone\.pth.*nothing from it"):
        read_state_dict(path)


def test_unreadable_and_empty_files_are_named(tmp_path):
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=r"junk\.pth is not a readable PyTorch file"):
        read_state_dict(tmp_path / "junk.pth")
    torch.save({"epoch": 3}, tmp_path / "empty.pth")
    with pytest.raises(ValueError, match=r"empty\.pth holds no state_dict"):
        read_state_dict(tmp_path / "empty.pth")
    with pytest.raises(ValueError, match=r"no backbone file at .*missing\.pth"):
        read_state_dict(tmp_path / "missing.pth")


def test_safetensors_written_by_export_is_read_back(tmp_path):
    from marginface.export import export_safetensors

    model = _r18()
    path = export_safetensors(model, tmp_path / "backbone.safetensors")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(_load(path)(x), model(x), rtol=0, atol=0)
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match=r"bad\.safetensors is not a readable safetensors"):
        read_state_dict(tmp_path / "bad.safetensors")


# ---------------------------------------------------------------- files that do not fit
def test_wrong_architecture_is_one_line_naming_the_file_and_keys(tmp_path):
    torch.save(_r18().state_dict(), tmp_path / "r18.pth")
    with pytest.raises(ValueError) as caught:
        load_backbone(tmp_path / "r18.pth", model="mbf", embedding_dim=16, image_size=32)
    message = str(caught.value)
    assert "\n" not in message
    assert "r18.pth does not fit mbf" in message
    assert "missing from the file (layers.0.layers.0.weight" in message
    assert "unexpected (conv1.weight" in message
    with pytest.raises(ValueError, match=r"r18\.pth does not fit r18: .*fc\.weight.*--image-size"):
        load_backbone(tmp_path / "r18.pth", model="r18", embedding_dim=16, image_size=48)
    assert load_backbone(tmp_path / "r18.pth")(torch.zeros(1, 3, 32, 32)).shape == (1, 16)
    with pytest.raises(ValueError, match="unknown model 'r19'"):
        load_backbone(tmp_path / "r18.pth", model="r19")


def test_wrong_channel_count_is_named(tmp_path):
    torch.save(_r18(channels=1).state_dict(), tmp_path / "grey.pth")
    with pytest.raises(ValueError, match=r"grey\.pth takes 1-channel images.*channel order"):
        _load(tmp_path / "grey.pth")


def test_old_marginface_names_load_through_load_backbone(tmp_path):
    from tests.models.test_insightface_backbones import _legacy_state_dict

    model = _r18()
    torch.save(_legacy_state_dict(model), tmp_path / "old.pt")
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(_load(tmp_path / "old.pt")(x), model(x))


def test_bgr_reverses_the_channels_before_the_model(tmp_path):
    model = _r18()
    torch.save(model.state_dict(), tmp_path / "m.pth")
    loaded = _load(tmp_path / "m.pth", bgr=True)
    assert isinstance(loaded, ReversedChannels)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x[:, [2, 1, 0]]))


# ---------------------------------------------------------------- ONNX
needs_onnx = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None,
    reason="the marginface[onnx] extra is not installed",
)


@needs_onnx
def test_onnx_backbone_matches_the_pytorch_model(tmp_path):
    from marginface.export import export_onnx

    model = _r18()
    path = export_onnx(model, torch.randn(2, 3, 32, 32), tmp_path / "model.onnx", dynamo=False)
    loaded = load_backbone(onnx=path, image_size=32)
    assert isinstance(loaded, OnnxBackbone)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"model\.onnx takes 32x32 images.*--image-size 32"):
        load_backbone(onnx=path, image_size=112)
    with pytest.raises(ValueError, match="brings its own architecture"):
        load_backbone(onnx=path, model="r50", image_size=32)


class _ChannelsLast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _r18()

    def forward(self, x):
        return self.inner(x.permute(0, 3, 1, 2))


@needs_onnx
def test_channels_last_onnx_graph_is_refused_in_one_line(tmp_path):
    from marginface.export import export_onnx

    path = export_onnx(
        _ChannelsLast().eval(), torch.randn(2, 32, 32, 3), tmp_path / "nhwc.onnx", dynamo=False
    )
    with pytest.raises(ValueError, match=r"nhwc\.onnx takes channels-last images"):
        load_backbone(onnx=path, image_size=32)


# ---------------------------------------------------------------- AdaFace
ADAFACE_STAGES = {18: (2, 2, 2, 2), 50: (3, 4, 14, 3), 100: (3, 13, 30, 3)}


def _bn(prefix: str, c: int, g: torch.Generator, affine: bool = True) -> dict:
    out = {
        f"{prefix}.running_mean": torch.randn(c, generator=g) * 0.1,
        f"{prefix}.running_var": torch.rand(c, generator=g) + 0.5,
        f"{prefix}.num_batches_tracked": torch.tensor(7),
    }
    if affine:
        out[f"{prefix}.weight"] = torch.rand(c, generator=g) + 0.5
        out[f"{prefix}.bias"] = torch.randn(c, generator=g) * 0.1
    return out


def adaface_state(depth: int, seed: int = 0) -> dict:
    """A random state_dict under AdaFace's ``net.py`` names, restated from its description:
    ``input_layer`` (Conv 3×3 3→64, BN, PReLU); ``body.i`` = BasicBlockIR(in, out, stride):
    ``res_layer`` (BN, Conv3×3, BN, PReLU, Conv3×3 stride, BN), ``shortcut_layer`` =
    ``MaxPool2d(1, stride)`` (no parameters) when in == out, else (Conv 1×1 stride, BN);
    ``output_layer`` (BN2d 512, Dropout, Flatten, Linear 512·49 → 512, BatchNorm1d(affine=False));
    a Lightning checkpoint prefixes ``model.`` and adds ``head.kernel``."""
    g = torch.Generator().manual_seed(seed)
    sd = {"input_layer.0.weight": torch.randn(64, 3, 3, 3, generator=g) * 0.2}
    sd |= _bn("input_layer.1", 64, g) | {"input_layer.2.weight": torch.rand(64, generator=g)}
    i, cin = 0, 64
    for out, count in zip((64, 128, 256, 512), ADAFACE_STAGES[depth], strict=True):
        for b in range(count):
            c = cin if b == 0 else out
            p = f"body.{i}"
            if c != out:
                sd[f"{p}.shortcut_layer.0.weight"] = torch.randn(out, c, 1, 1, generator=g) * 0.2
                sd |= _bn(f"{p}.shortcut_layer.1", out, g)
            sd |= _bn(f"{p}.res_layer.0", c, g)
            sd[f"{p}.res_layer.1.weight"] = torch.randn(out, c, 3, 3, generator=g) * 0.05
            sd |= _bn(f"{p}.res_layer.2", out, g)
            sd[f"{p}.res_layer.3.weight"] = torch.rand(out, generator=g)
            sd[f"{p}.res_layer.4.weight"] = torch.randn(out, out, 3, 3, generator=g) * 0.05
            sd |= _bn(f"{p}.res_layer.5", out, g)
            i += 1
        cin = out
    sd |= _bn("output_layer.0", 512, g)
    sd["output_layer.3.weight"] = torch.randn(512, 512 * 49, generator=g) * 0.01
    sd["output_layer.3.bias"] = torch.randn(512, generator=g) * 0.01
    return sd | _bn("output_layer.4", 512, g, affine=False)


def adaface_forward(sd: dict, bgr: torch.Tensor, depth: int) -> torch.Tensor:
    """AdaFace's ``Backbone.forward`` in eval mode over its keys: ``(x / ‖x‖, ‖x‖)``."""

    def bn(x, p):
        return F.batch_norm(x, sd[f"{p}.running_mean"], sd[f"{p}.running_var"],
                            sd.get(f"{p}.weight"), sd.get(f"{p}.bias"), eps=1e-5)  # fmt: skip

    x = F.conv2d(bgr, sd["input_layer.0.weight"], padding=1)
    x = F.prelu(bn(x, "input_layer.1"), sd["input_layer.2.weight"])
    i = 0
    for count in ADAFACE_STAGES[depth]:
        for b in range(count):
            p, stride = f"body.{i}", 2 if b == 0 else 1
            if f"{p}.shortcut_layer.0.weight" in sd:
                short = F.conv2d(x, sd[f"{p}.shortcut_layer.0.weight"], stride=stride)
                short = bn(short, f"{p}.shortcut_layer.1")
            else:
                short = F.max_pool2d(x, 1, stride)
            r = F.conv2d(bn(x, f"{p}.res_layer.0"), sd[f"{p}.res_layer.1.weight"], padding=1)
            r = F.prelu(bn(r, f"{p}.res_layer.2"), sd[f"{p}.res_layer.3.weight"])
            r = F.conv2d(r, sd[f"{p}.res_layer.4.weight"], stride=stride, padding=1)
            x = bn(r, f"{p}.res_layer.5") + short
            i += 1
    x = torch.flatten(bn(x, "output_layer.0"), 1)
    x = bn(F.linear(x, sd["output_layer.3.weight"], sd["output_layer.3.bias"]), "output_layer.4")
    norm = x.norm(dim=1, keepdim=True)
    return x / norm, norm


def test_adaface_ir18_maps_onto_iresnet_with_rgb_input(tmp_path):
    sd = {k: v.double() if v.is_floating_point() else v for k, v in adaface_state(18).items()}
    rgb = torch.randn(2, 3, 112, 112, dtype=torch.float64)
    with torch.no_grad():
        expected, _ = adaface_forward(sd, rgb.flip(1), 18)  # AdaFace is fed BGR
        mapped, depth = adaface_to_iresnet(sd)
        assert depth == 18
        model = IResNet(18).double().eval()
        model.load_state_dict(mapped, strict=True)
        got = model(rgb)
        torch.testing.assert_close(F.normalize(got, dim=1), expected, rtol=1e-9, atol=1e-9)
    # a Lightning checkpoint file (model.*, head.kernel), found by its names
    lightning = {f"model.{k}": v.float() for k, v in sd.items()} | {
        "head.kernel": torch.randn(512, 10)
    }
    torch.save({"state_dict": lightning}, tmp_path / "adaface_ir18.ckpt")
    loaded = load_backbone(tmp_path / "adaface_ir18.ckpt")  # model inferred: r18
    with torch.no_grad():
        cos = F.cosine_similarity(loaded(rgb.float()), expected.float()).min()
    assert cos > 0.9999


@pytest.mark.parametrize(("depth", "name"), [(50, "r50"), (100, "r100")])
def test_adaface_ir50_ir101_names_and_shapes_fit_iresnet(depth, name):
    mapped, found = adaface_to_iresnet(adaface_state(depth))
    assert found == depth
    expected = create_model(name, embedding_dim=512, in_channels=3, image_size=112).state_dict()
    assert {k: tuple(v.shape) for k, v in mapped.items()} == {
        k: tuple(v.shape) for k, v in expected.items()
    }


def test_adaface_se_models_are_refused():
    sd = adaface_state(18) | {"body.0.res_layer.6.fc1.weight": torch.zeros(4, 64, 1, 1)}
    sd = {k.replace("res_layer.6.", "res_layer.6.se_block."): v for k, v in sd.items()}
    with pytest.raises(ValueError, match="IR-SE model"):
        adaface_to_iresnet(sd, source="ir_se50.ckpt")


# ---------------------------------------------------------------- the command line
def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def _write_bin(folder, name: str = "tiny", pairs: int = 20, size: int = 32) -> None:
    rng = np.random.default_rng(0)
    people = rng.integers(0, 256, (4, size, size, 3), dtype=np.uint8)
    images, same = [], []
    for p in range(pairs):
        a, b = p % 4, (p % 4 if p % 2 == 0 else (p + 1) % 4)
        for who in (a, b):
            noise = rng.integers(-10, 10, (size, size, 3))
            images.append(_png(np.clip(people[who] + noise, 0, 255).astype(np.uint8)))
        same.append(a == b)
    with open(folder / f"{name}.bin", "wb") as stream:
        pickle.dump((images, same), stream, protocol=2)


@needs_onnx
def test_cli_evaluates_a_backbone_file_and_an_onnx_file(tmp_path, capsys):
    from marginface.export import export_onnx

    _write_bin(tmp_path)
    model = _r18()
    torch.save(model.state_dict(), tmp_path / "backbone.pth")
    common = ["--data-dir", str(tmp_path), "--image-size", "32", "--device", "cpu"]
    args = ["evaluate", "--backbone", str(tmp_path / "backbone.pth"), "--model", "r18"]
    args += ["--embedding-dim", "16", "--out", str(tmp_path / "m.json"), *common]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "tiny_accuracy" in table and "tiny_auc" in table
    import json

    from_file = json.loads((tmp_path / "m.json").read_text())
    assert 0.0 <= from_file["tiny_accuracy"] <= 1.0
    # a .bin set's report is insightface's (threshold, XNorm, VAL@FAR) beside the midpoint search
    insightface_keys = {"tiny_threshold", "tiny_xnorm", "tiny_val@far=1e-03"}
    assert insightface_keys | {"tiny_accuracy_midpoint"} <= set(from_file)
    path = export_onnx(model, torch.randn(2, 3, 32, 32), tmp_path / "m.onnx", dynamo=False)
    onnx_args = ["evaluate", "--onnx", str(path), "--out", str(tmp_path / "o.json"), *common]
    assert main(onnx_args) == 0
    from_onnx = json.loads((tmp_path / "o.json").read_text())
    assert from_onnx["tiny_accuracy"] == pytest.approx(from_file["tiny_accuracy"], abs=0.051)
    assert from_onnx["tiny_auc"] == pytest.approx(from_file["tiny_auc"], abs=0.02)


def test_cli_errors_are_one_line(tmp_path, capsys):
    _write_bin(tmp_path)
    torch.save(_r18().state_dict(), tmp_path / "backbone.pth")
    args = ["evaluate", "--backbone", str(tmp_path / "backbone.pth"), "--model", "r50"]
    assert main([*args, "--data-dir", str(tmp_path), "--image-size", "32"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "backbone.pth does not fit r50" in err
    assert main(["evaluate", "--backbone", str(tmp_path / "backbone.pth"), "--model", "r18"]) == 2
    assert "--data-dir" in capsys.readouterr().err
    assert main(["evaluate"]) == 2
    assert "RUN_DIR" in capsys.readouterr().err


def test_train_init_from_starts_the_backbone_from_the_file(tmp_path, monkeypatch):
    """``train --init-from`` hands the file's weights to the trainer as its initial state."""
    import marginface.cli.training as cli

    source = IResNet(18, 8, image_size=16).eval()
    torch.save(source.state_dict(), tmp_path / "init.pth")
    seen = {}

    def fake_fit(args, config, out, *, resume=False, initial_state=None):
        seen["state"], seen["config"] = initial_state, config
        return 0

    monkeypatch.setattr(cli, "_fit", fake_fit)
    args = ["train", "--init-from", str(tmp_path / "init.pth"), "--model", "r18"]
    args += ["--embedding-dim", "8", "--image-size", "16", "--out", str(tmp_path / "run")]
    assert main(args) == 0
    assert set(seen["state"]) == {"model", "source"}
    assert seen["state"]["source"] == str(tmp_path / "init.pth")
    for key, value in source.state_dict().items():
        torch.testing.assert_close(seen["state"]["model"][key], value)
    assert main([*args, "--resume"]) == 2


def test_export_safetensors_of_a_run_loads_as_a_backbone(tmp_path):
    """``marginface export RUN --format safetensors`` writes the run's backbone weights, which
    ``load_backbone`` (``evaluate --backbone``, ``train --init-from``) reads back."""
    from marginface.train import load_run, train
    from marginface.train.config import TrainConfig

    config = TrainConfig(limit=64, epochs=1, batch_size=32, threads=1, device="cpu")
    train(config, tmp_path / "run")
    assert main(["--quiet", "export", str(tmp_path / "run"), "--format", "safetensors"]) == 0
    run = load_run(tmp_path / "run")
    path = tmp_path / "run" / "backbone.safetensors"
    size = run.meta["image_size"]
    loaded = load_backbone(
        path, model="seed-cnn", embedding_dim=3, in_channels=run.meta["in_channels"],
        image_size=size,
    )  # fmt: skip
    x = torch.randn(4, run.meta["in_channels"], size, size)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), run.model(x), rtol=0, atol=0)


def test_cli_evaluates_an_image_folder_with_a_pairs_file(tmp_path, capsys):
    from PIL import Image

    rng = np.random.default_rng(0)
    names = ["Ann_A", "Bob_B", "Cid_C", "Dee_D"]
    for name in names:
        (tmp_path / "faces" / name).mkdir(parents=True)
        face = rng.integers(0, 256, (40, 40, 3))
        for number in (1, 2, 3):
            noisy = np.clip(face + rng.integers(-8, 8, face.shape), 0, 255).astype(np.uint8)
            Image.fromarray(noisy).save(tmp_path / "faces" / name / f"{name}_{number:04d}.jpg")
    lines = ["2 3"]
    for fold in range(2):
        lines += [f"{names[(fold + k) % 4]} 1 {2 + k % 2}" for k in range(3)]
        lines += [f"{names[k]} 1 {names[(k + 1 + fold) % 4]} 2" for k in range(3)]
    (tmp_path / "pairs.txt").write_text("\n".join(lines) + "\n")
    torch.save(_r18().state_dict(), tmp_path / "backbone.pth")
    args = ["evaluate", "--backbone", str(tmp_path / "backbone.pth"), "--model", "r18"]
    args += ["--embedding-dim", "16", "--image-size", "32", "--device", "cpu"]
    args += ["--data-dir", str(tmp_path / "faces"), "--pairs", str(tmp_path / "pairs.txt")]
    assert main(args) == 0
    assert "pairs_accuracy" in capsys.readouterr().out
    (tmp_path / "faces" / "Ann_A" / "Ann_A_0001.jpg").unlink()
    assert main(args) == 2
    assert "Ann_A_0001.jpg is not in" in capsys.readouterr().err


def test_a_model_that_owns_stem_and_stages_names_loads_them_as_they_are():
    """IResNet's names before insightface's (``stem.``, ``stages.``) are renamed for IResNet
    only: dlib's ResNet owns such names and loads its own state_dict unchanged."""
    from marginface.models.dlib_resnet import DlibResNet
    from marginface.models.pretrained import load_backbone_weights

    torch.manual_seed(0)
    source, target = DlibResNet(), DlibResNet()
    load_backbone_weights(target, source.state_dict(), source="dlib.pt")
    for name, tensor in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name
