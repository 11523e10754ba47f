"""Inception-ResNet-v1 against facenet-pytorch's own module: the same state_dict keys and shapes,
the same embeddings from the same (random) weights, its published files' layout loading, and the
loader's one-line errors."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from marginface.models import create_model
from marginface.models.facenet import (
    PUBLISHED_WEIGHTS,
    load_inception_resnet_v1,
    pretrained_inception_resnet_v1,
)
from marginface.models.inception_resnet_v1 import (
    MIN_IMAGE_SIZE,
    PIXEL_MEAN,
    PIXEL_STD,
    InceptionResnetV1,
    fixed_image_standardization,
)
from marginface.models.pretrained import load_backbone


def _reference_module() -> types.ModuleType:
    """facenet-pytorch's ``models/inception_resnet_v1.py``, imported without the package's
    ``__init__`` (which needs torchvision for MTCNN) under a private package name."""
    spec = importlib.util.find_spec("facenet_pytorch")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("facenet_pytorch is not installed")
    root = Path(spec.submodule_search_locations[0])
    for name, folder in (
        ("_facenet_reference", root),
        ("_facenet_reference.models", root / "models"),
    ):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(folder)]
            sys.modules[name] = package
    try:
        return importlib.import_module("_facenet_reference.models.inception_resnet_v1")
    except ImportError as error:  # its own imports (requests, tqdm) missing
        pytest.skip(f"facenet_pytorch's inception_resnet_v1 cannot be imported: {error}")


@pytest.fixture(scope="module")
def reference() -> nn.Module:
    """facenet-pytorch's InceptionResnetV1 (classify=False) with seeded random weights and
    batch-norm statistics, in eval mode.

    The statistics are first measured on random images (train-mode forward, cumulative
    average), then perturbed, and the affine parameters drawn: with the default statistics
    (mean 0, variance 1) a random net maps every image to about the same embedding, which
    would make the comparison weak."""
    module = _reference_module()
    torch.manual_seed(3)
    model = module.InceptionResnetV1(pretrained=None, classify=False)
    g = torch.Generator().manual_seed(4)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d)]
    for norm in norms:
        norm.momentum = None  # cumulative average over the calibration forward
        norm.reset_running_stats()
    with torch.no_grad():
        model.train()(
            fixed_image_standardization(torch.randint(0, 256, (2, 3, 160, 160), generator=g))
        )
        for norm in norms:
            size = norm.num_features
            norm.momentum = 0.1
            norm.running_mean.add_(torch.randn(size, generator=g) * 0.05)
            norm.running_var.mul_(torch.rand(size, generator=g) * 0.4 + 0.8)
            norm.weight.copy_(torch.rand(size, generator=g) + 0.5)
            norm.bias.copy_(torch.randn(size, generator=g) * 0.1)
        for conv in model.modules():
            if isinstance(conv, nn.Conv2d) and conv.bias is not None:
                conv.bias.copy_(torch.randn(conv.out_channels, generator=g) * 0.05)
    return model.eval()


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    """Two standardised 160×160 images (the published weights' side)."""
    g = torch.Generator().manual_seed(5)
    return fixed_image_standardization(torch.randint(0, 256, (2, 3, 160, 160), generator=g))


@pytest.fixture(scope="module")
def reference_outputs(reference, images) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's output (L2-normalised) and its ``last_bn`` output (a forward hook),
    from one forward."""
    seen: list[torch.Tensor] = []
    hook = reference.last_bn.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        with torch.no_grad():
            normalised = reference(images)
    finally:
        hook.remove()
    return normalised, seen[0]


def test_keys_and_shapes_equal_facenet_pytorchs(reference):
    ours = {k: tuple(v.shape) for k, v in InceptionResnetV1().state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert sorted(set(ours) - set(theirs)) == []
    assert sorted(set(theirs) - set(ours)) == []
    assert ours == theirs
    assert len(ours) == 714


def test_embeddings_equal_facenet_pytorchs(reference, reference_outputs, images, tmp_path):
    normalised, raw = reference_outputs
    path = tmp_path / "random.pt"
    torch.save(reference.state_dict(), path)
    ours = load_inception_resnet_v1(path)
    assert not ours.training
    with torch.no_grad():
        got = ours(images)
    assert got.shape == (2, 512)
    # not degenerate: the two images' embeddings differ far beyond the tolerance
    assert (normalised[0] - normalised[1]).norm() > 0.1 and (raw[0] - raw[1]).abs().max() > 1
    torch.testing.assert_close(got, raw, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(F.normalize(got), normalised, atol=1e-5, rtol=1e-5)
    assert torch.allclose(normalised.norm(dim=1), torch.ones(2))  # theirs is normalised
    assert not torch.allclose(got.norm(dim=1), torch.ones(2))  # ours is not


def test_a_file_with_the_published_logits_loads_every_way(reference, tmp_path):
    """The published files hold the classifier ``logits`` (8631 VGGFace2 identities): the
    loader, ``load_backbone`` and a plain strict ``load_state_dict`` take them and drop it."""
    state = dict(reference.state_dict())
    state["logits.weight"] = torch.randn(PUBLISHED_WEIGHTS["vggface2"].classes, 512)
    state["logits.bias"] = torch.randn(PUBLISHED_WEIGHTS["vggface2"].classes)
    path = tmp_path / "20180402-114759-vggface2.pt"
    torch.save(state, path)
    plain = InceptionResnetV1()
    plain.load_state_dict(torch.load(path, weights_only=True), strict=True)
    loaded = {
        "loader": load_inception_resnet_v1(path),
        "load_backbone": load_backbone(path, model="inception-resnet-v1", image_size=160),
        "load_state_dict": plain,
    }
    expected = reference.state_dict()
    for how, model in loaded.items():
        got = model.state_dict()
        assert got.keys() == expected.keys(), how
        assert all(torch.equal(got[k], expected[k]) for k in expected), how
    assert not loaded["loader"].training and not loaded["load_backbone"].training


def test_other_sides_run_and_the_smallest_is_75():
    model = InceptionResnetV1(image_size=MIN_IMAGE_SIZE).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 75, 75)).shape == (1, 512)
        assert model(torch.randn(1, 3, 112, 112)).shape == (1, 512)
        with pytest.raises(RuntimeError):  # one pixel less: a map shrinks below a 3×3 kernel
            model(torch.randn(1, 3, 74, 74))


def test_registered_factory_and_its_refusals():
    model = create_model("inception-resnet-v1", embedding_dim=512, in_channels=3, image_size=160)
    assert isinstance(model, InceptionResnetV1) and model.dropout.p == 0.6
    model.train()
    out = model(torch.randn(2, 3, 80, 80))
    out.sum().backward()
    assert out.shape == (2, 512) and model.conv2d_1a.conv.weight.grad is not None
    assert (
        create_model(
            "inception_resnet_v1", embedding_dim=512, in_channels=3, image_size=160, dropout=0.0
        ).dropout.p
        == 0.0
    )
    with pytest.raises(ValueError, match=r"embedding_dim must be 512 .*got 128"):
        InceptionResnetV1(128)
    with pytest.raises(ValueError, match=r"in_channels must be 3 .*got 1"):
        InceptionResnetV1(in_channels=1)
    with pytest.raises(ValueError, match=r"image_size must be >= 75 .*got 74"):
        InceptionResnetV1(image_size=74)
    with pytest.raises(ValueError, match=r"dropout must be < 1, got 1.0"):
        InceptionResnetV1(dropout=1.0)
    with pytest.raises(TypeError, match=r"image_size must be an integer, got 160.0"):
        InceptionResnetV1(image_size=160.0)


def test_fixed_image_standardization_is_marginfaces_mean_and_std():
    pixels = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16)
    standard = fixed_image_standardization(pixels)
    assert standard.dtype == torch.float32
    assert standard[0, 0, 0, 0] == -127.5 / 128 and standard[0, 0, -1, -1] == 127.5 / 128
    torch.testing.assert_close((pixels / 255 - PIXEL_MEAN) / PIXEL_STD, standard)


def test_loader_errors_are_one_line(tmp_path):
    missing = tmp_path / "absent.pt"
    with pytest.raises(ValueError, match=r"no backbone file at .*absent\.pt") as info:
        load_inception_resnet_v1(missing)
    assert "\n" not in str(info.value)

    whole = tmp_path / "whole.pt"
    torch.save(InceptionResnetV1().state_dict(), whole)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"truncated\.pt is not a readable PyTorch file") as info:
        load_inception_resnet_v1(truncated)
    assert "\n" not in str(info.value)

    other = tmp_path / "r18.pt"
    torch.save(
        create_model("r18", embedding_dim=512, in_channels=3, image_size=112).state_dict(), other
    )
    with pytest.raises(
        ValueError,
        match=r"r18\.pt does not hold facenet-pytorch's InceptionResnetV1 weights: 714 of its "
        r"714 keys are missing \(conv2d_1a\.conv\.weight, .*unexpected \(conv1\.weight",
    ) as info:
        load_inception_resnet_v1(other)
    assert "\n" not in str(info.value)

    state = InceptionResnetV1().state_dict()
    state["last_linear.weight"] = torch.zeros(128, 1792)  # a 128-D FaceNet
    reshaped = tmp_path / "facenet128.pt"
    torch.save(state, reshaped)
    with pytest.raises(ValueError, match=r"facenet128\.pt does not fit .*last_linear\.weight"):
        load_inception_resnet_v1(reshaped)

    not_a_state = tmp_path / "list.pt"
    torch.save([1, 2, 3], not_a_state)
    with pytest.raises(ValueError, match=r"list\.pt holds no state_dict"):
        load_inception_resnet_v1(not_a_state)


def test_pretrained_names_are_checked(tmp_path):
    with pytest.raises(ValueError, match=r"name must be one of 'vggface2', 'casia-webface'"):
        pretrained_inception_resnet_v1("vggface", cache_dir=tmp_path)
    assert PUBLISHED_WEIGHTS["casia-webface"].url == (
        "https://github.com/timesler/facenet-pytorch/releases/download/v2.2.9/"
        "20180408-102900-casia-webface.pt"
    )
    assert all(weights.sha256 is None for weights in PUBLISHED_WEIGHTS.values())  # none invented
