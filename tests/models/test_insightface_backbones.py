"""insightface's backbones under their own names: state_dict keys and shapes against the table
restated in tests/models/_insightface_names.py, float64 embeddings against forwards written
over those keys, hand-computed layers, the legacy key map, masking and checkpointing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.models._insightface_names import (
    iresnet_forward,
    iresnet_keys,
    mobilefacenet_forward,
    mobilefacenet_keys,
    vit_forward,
    vit_keys,
)

from marginface.models import IResNet, create_model, list_models
from marginface.models.iresnet import rename_legacy_keys
from marginface.models.mobilefacenet import DepthWise, MobileFaceNet, mbf
from marginface.models.vit import random_masking, vit_t

EXPECTED_KEYS = {
    "r18": lambda: iresnet_keys(18),
    "r34": lambda: iresnet_keys(34),
    "r50": lambda: iresnet_keys(50),
    "r100": lambda: iresnet_keys(100),
    "r200": lambda: iresnet_keys(200),
    "iresnet18": lambda: iresnet_keys(18),
    "iresnet50": lambda: iresnet_keys(50),
    "mbf": lambda: mobilefacenet_keys((1, 4, 6, 2), 2),
    "mbf_large": lambda: mobilefacenet_keys((2, 8, 12, 4), 4),
    "vit_t": lambda: vit_keys(256, 12),
    "vit_s": lambda: vit_keys(512, 12),
    "vit_b": lambda: vit_keys(512, 24),
}


def _build(name: str, **options):
    return create_model(name, embedding_dim=512, in_channels=3, image_size=112, **options)


def _randomize_batch_norm(model: torch.nn.Module, seed: int = 0) -> None:
    """Running statistics and affine parameters away from 0/1, so a BN read under the wrong
    name or in the wrong place changes the output."""
    g = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            c = module.num_features
            module.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
            module.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            if module.affine:
                module.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
                module.bias.data.copy_(torch.randn(c, generator=g) * 0.1)


@pytest.mark.parametrize("name", sorted(EXPECTED_KEYS))
def test_state_dict_keys_and_shapes_are_insightfaces(name):
    model = _build(name)
    got = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    expected = EXPECTED_KEYS[name]()
    assert sorted(set(got) - set(expected)) == []  # unexpected keys
    assert sorted(set(expected) - set(got)) == []  # missing keys
    assert got == expected


def test_every_insightface_name_is_registered_with_the_old_aliases():
    from marginface._registry import canonical_name
    from marginface.models.registry import MODELS

    names = set(list_models())
    assert {canonical_name(n) for n in EXPECTED_KEYS} <= names
    assert {"seed-cnn", "seed-cnn-bn"} <= names
    assert MODELS.get("mbf_large") is MODELS.get("mbf-large")  # insightface's spelling works


def test_a_file_saved_with_insightfaces_names_loads_strictly(tmp_path):
    """An insightface ``backbone.pth`` is a bare state_dict of these keys: build one from the
    restated table (random values), save it, load it with ``strict=True``."""
    g = torch.Generator().manual_seed(1)
    state = {
        key: (torch.tensor(3) if shape == () else torch.randn(shape, generator=g))
        for key, shape in iresnet_keys(18).items()
    }
    torch.save(state, tmp_path / "backbone.pth")
    model = _build("r18")
    model.load_state_dict(torch.load(tmp_path / "backbone.pth", weights_only=True), strict=True)
    torch.testing.assert_close(model.layer3[0].conv2.weight, state["layer3.0.conv2.weight"])


@pytest.mark.parametrize("depth", [18, 34])
def test_iresnet_embedding_equals_insightfaces_forward_in_float64(depth):
    torch.manual_seed(depth)
    model = IResNet(depth).double().eval()
    _randomize_batch_norm(model)
    x = torch.randn(2, 3, 112, 112, dtype=torch.float64)
    with torch.no_grad():
        expected = iresnet_forward(model.state_dict(), x, depth)
        torch.testing.assert_close(model(x), expected, rtol=1e-10, atol=1e-10)


def test_iresnet_first_block_by_hand():
    """layer1.0 at one output position, computed with explicit sums (3×3 windows)."""
    torch.manual_seed(0)
    model = IResNet(18, image_size=16).double().eval()
    _randomize_batch_norm(model)
    block = model.layer1[0]
    x = torch.randn(1, 64, 8, 8, dtype=torch.float64)

    def bn(t, m):  # per channel, over (C, H, W)
        scale = m.weight / torch.sqrt(m.running_var + m.eps)
        return (t - m.running_mean[:, None, None]) * scale[:, None, None] + m.bias[:, None, None]

    def conv3x3(t, w, stride):  # t (C, H, W), w (O, C, 3, 3), padding 1
        padded = F.pad(t, (1, 1, 1, 1))
        size = (t.shape[1] - 1) // stride + 1
        out = torch.zeros(w.shape[0], size, size, dtype=t.dtype)
        for i in range(size):
            for j in range(size):
                window = padded[:, i * stride : i * stride + 3, j * stride : j * stride + 3]
                out[:, i, j] = (w * window).sum(dim=(1, 2, 3))
        return out

    with torch.no_grad():
        t = bn(x[0], block.bn1)
        t = bn(conv3x3(t, block.conv1.weight, 1), block.bn2)
        t = torch.where(t > 0, t, block.prelu.weight[:, None, None] * t)
        t = bn(conv3x3(t, block.conv2.weight, 2), block.bn3)
        shortcut = torch.einsum("oc,chw->ohw", block.downsample[0].weight[:, :, 0, 0],
                                x[0, :, ::2, ::2])  # fmt: skip
        expected = t + bn(shortcut, block.downsample[1])
        torch.testing.assert_close(block(x)[0], expected)


def test_vit_embedding_equals_insightfaces_forward_in_float64():
    torch.manual_seed(0)
    model = vit_t().double().eval()
    _randomize_batch_norm(model)
    x = torch.randn(2, 3, 112, 112, dtype=torch.float64)
    with torch.no_grad():
        expected = vit_forward(model.state_dict(), x, depth=12)
        torch.testing.assert_close(model(x), expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("name", "blocks"), [("mbf", (1, 4, 6, 2)), ("mbf_large", (2, 8, 12, 4))])
def test_mobilefacenet_embedding_equals_insightfaces_forward_in_float64(name, blocks):
    torch.manual_seed(0)
    model = _build(name).double().eval()
    _randomize_batch_norm(model)
    x = torch.randn(2, 3, 112, 112, dtype=torch.float64)
    with torch.no_grad():
        expected = mobilefacenet_forward(model.state_dict(), x, blocks)
        torch.testing.assert_close(model(x), expected, rtol=1e-9, atol=1e-9)


def test_mobilefacenet_depthwise_block_by_hand():
    torch.manual_seed(0)
    block = DepthWise(8, 8, 16, stride=1, residual=True).double().eval()
    _randomize_batch_norm(block)
    x = torch.randn(2, 8, 7, 7, dtype=torch.float64)
    (expand, depthwise, project) = block.layers

    def bn(t, m):
        return F.batch_norm(t, m.running_mean, m.running_var, m.weight, m.bias, eps=1e-5)

    with torch.no_grad():
        h = torch.einsum("oc,nchw->nohw", expand.layers[0].weight[:, :, 0, 0], x)
        h = F.prelu(bn(h, expand.layers[1]), expand.layers[2].weight)
        kernels = depthwise.layers[0].weight[:, 0]  # (16, 3, 3): one kernel per channel
        padded = F.pad(h, (1, 1, 1, 1))
        h = sum(
            kernels[None, :, i, j, None, None] * padded[:, :, i : i + 7, j : j + 7]
            for i in range(3)
            for j in range(3)
        )
        h = F.prelu(bn(h, depthwise.layers[1]), depthwise.layers[2].weight)
        h = bn(torch.einsum("oc,nchw->nohw", project.layers[0].weight[:, :, 0, 0], h),
               project.layers[1])  # fmt: skip
        torch.testing.assert_close(block(x), x + h)


@pytest.mark.parametrize("name", ["mbf", "mbf_large", "r50", "vit_s"])
def test_embedding_shape_eval_and_train(name):
    model = _build(name)
    model.train()
    out = model(torch.randn(2, 3, 112, 112))
    out.sum().backward()
    assert out.shape == (2, 512)
    assert model.eval()(torch.randn(1, 3, 112, 112)).shape == (1, 512)


def test_mbf_variant_widths():
    small, large = mbf(128), _build("mbf_large")
    assert small.layers[0].layers[0].out_channels == 128
    assert large.layers[0].layers[0].out_channels == 256
    assert small.features.layers[2].out_features == 128


# ---------------------------------------------------------------- old marginface checkpoints
def _legacy_state_dict(model: IResNet) -> dict:
    """The state_dict of ``model`` under the names marginface used before insightface's:
    ``stem.{0,1,2}`` = conv1, bn1, prelu; ``stages.{s}.{b}.body.{0..5}`` = bn1, conv1, bn2,
    prelu, conv2, bn3; ``stages.{s}.{b}.downsample.{0,1}``; bn2, fc, features unchanged."""
    body = {"bn1": 0, "conv1": 1, "bn2": 2, "prelu": 3, "conv2": 4, "bn3": 5}
    stem = {"conv1": 0, "bn1": 1, "prelu": 2}
    old = {}
    for key, value in model.state_dict().items():
        first, _, rest = key.partition(".")
        if first in stem:
            old[f"stem.{stem[first]}.{rest}"] = value.clone()
        elif first.startswith("layer"):
            block, module, tail = rest.split(".", 2)
            stage = int(first[len("layer") :]) - 1
            if module == "downsample":
                old[f"stages.{stage}.{block}.downsample.{tail}"] = value.clone()
            else:
                old[f"stages.{stage}.{block}.body.{body[module]}.{tail}"] = value.clone()
        else:
            old[key] = value.clone()
    return old


@pytest.mark.parametrize("depth", [18, 50])
def test_checkpoints_with_the_old_names_still_load(tmp_path, depth):
    torch.manual_seed(0)
    source = IResNet(depth, 32, image_size=32).eval()
    _randomize_batch_norm(source)
    old = _legacy_state_dict(source)
    assert "stem.0.weight" in old and "stages.0.0.body.0.running_mean" in old
    torch.save({"model": old}, tmp_path / "checkpoint.pt")
    loaded = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["model"]
    target = IResNet(depth, 32, image_size=32).eval()
    target.load_state_dict(loaded, strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(target(x), source(x), rtol=0, atol=0)


def test_rename_legacy_keys_only_under_the_prefix():
    state = {"backbone.stem.0.weight": 1, "stem.0.weight": 2, "backbone.fc.bias": 3}
    assert rename_legacy_keys(state, "backbone.")
    assert state == {"backbone.conv1.weight": 1, "stem.0.weight": 2, "backbone.fc.bias": 3}
    assert not rename_legacy_keys({"conv1.weight": 0})


def test_parameter_order_is_unchanged_so_optimizer_states_resume():
    """An optimizer's state is saved by parameter position: the new names keep the order."""
    model = IResNet(18, 8, image_size=16)
    renamed = []
    for key in _legacy_state_dict(model):  # in the old module order
        single = {key: None}
        rename_legacy_keys(single)
        renamed.extend(single)
    assert renamed == list(model.state_dict())


# ---------------------------------------------------------------- ViT masking and checkpointing
def test_random_masking_keeps_and_restores_tokens():
    torch.manual_seed(0)
    tokens = torch.arange(2 * 10 * 3, dtype=torch.float32).reshape(2, 10, 3)
    kept, restore = random_masking(tokens, 0.3)
    assert kept.shape == (2, 7, 3)
    filled = torch.cat([kept, torch.full((2, 3, 3), -1.0)], dim=1)
    back = torch.gather(filled, 1, restore[:, :, None].expand(2, 10, 3))
    kept_rows = back[:, :, 0] >= 0
    assert kept_rows.sum(dim=1).tolist() == [7, 7]
    torch.testing.assert_close(back[kept_rows], tokens[kept_rows])


def test_vit_masking_changes_the_training_output_only():
    torch.manual_seed(0)
    plain = vit_t(64, drop_path_rate=0.0, mask_ratio=0.0, width=32, depth=2)
    masked = vit_t(64, drop_path_rate=0.0, mask_ratio=0.5, width=32, depth=2)
    masked.load_state_dict(plain.state_dict())
    x = torch.randn(4, 3, 112, 112)
    with torch.no_grad():
        torch.testing.assert_close(masked.eval()(x), plain.eval()(x))
        masked.train(), plain.train()
        assert not torch.allclose(masked(x), plain(x))


@pytest.mark.parametrize("name", ["vit_t", "r18"])
def test_activation_checkpointing_gives_the_same_gradients(name):
    options = {"width": 32, "depth": 2} if name == "vit_t" else {}
    torch.manual_seed(0)
    plain = _build(name, activation_checkpointing=False, **options).train()
    checkpointed = _build(name, activation_checkpointing=True, **options).train()
    checkpointed.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 112, 112)
    grads = []
    for model in (plain, checkpointed):
        torch.manual_seed(1)  # the same masks and drop-path draws
        model(x).square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_vit_b_checkpoints_by_default_and_options_are_checked():
    assert _build("vit_b").activation_checkpointing is True
    assert _build("vit_s").activation_checkpointing is False
    with pytest.raises(ValueError, match="mask_ratio must be < 1"):
        vit_t(mask_ratio=1.0)
    with pytest.raises(TypeError, match="activation_checkpointing must be a bool"):
        IResNet(18, activation_checkpointing="yes")
    with pytest.raises(ValueError, match="norm_layer must be one of"):
        vit_t(norm_layer="gn")
    with pytest.raises(ValueError, match="images must be 112x112"):
        vit_t().eval()(torch.randn(1, 3, 96, 96))
    with pytest.raises(ValueError, match="blocks must be four ints"):
        MobileFaceNet(blocks=(1, 2, 3))


def test_a_run_saved_with_the_old_names_loads_evaluates_and_resumes(tmp_path):
    """A whole iresnet18 run whose checkpoint holds the previous version's names (rewritten
    here from a fresh run's, then re-sealed): load_run, evaluate and --resume work."""
    from marginface.train import evaluate_run, load_checkpoint, load_run, save_checkpoint, train
    from marginface.train.config import TrainConfig

    values = {"model": "iresnet18", "image_size": 16, "embedding_dim": 8, "limit": 64}
    values |= {"batch_size": 32, "epochs": 1, "threads": 1, "device": "cpu"}
    trained = train(TrainConfig(**values), tmp_path / "run")
    path = tmp_path / "run" / "checkpoint.pt"
    state = load_checkpoint(path)
    state["model"] = _legacy_state_dict(trained.model)
    assert "stages.0.0.body.1.weight" in state["model"]
    save_checkpoint(state, path)
    run = load_run(tmp_path / "run")
    for key, value in trained.model.state_dict().items():
        torch.testing.assert_close(run.model.state_dict()[key], value, rtol=0, atol=0)
    assert evaluate_run(tmp_path / "run", device="cpu").metrics["pairs"] > 0
    resumed = train(TrainConfig(**{**values, "epochs": 2}), tmp_path / "run", resume=True)
    assert [row["epoch"] for row in resumed.history] == [1, 2]
