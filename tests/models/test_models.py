"""Backbones: shapes, the seed's layout, IResNet, registry errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from marginface.models import IResNet, SeedCNN, create_model, list_models


def test_seed_cnn_matches_the_seeds_layout_at_mnist_size():
    model = SeedCNN(3, image_size=28)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [32, 64, 128]
    assert model.fc.in_features == 128 * 4 * 4  # 28 + 2·2 = 32 → 16 → 8 → 4
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 3)


def test_merged_padding_and_pool_before_relu_equal_the_seeds_order():
    torch.manual_seed(0)
    model = SeedCNN(3, image_size=28).eval()
    conv1, conv2, conv3 = (m for m in model.modules() if isinstance(m, nn.Conv2d))
    x = torch.randn(2, 1, 28, 28)
    h = nn.functional.pad(x, (2, 2, 2, 2))  # ZeroPadding2D(2)
    for conv in (conv1, conv2, conv3):  # Conv(same) → ReLU → MaxPool, the seed's order
        h = nn.functional.max_pool2d(
            torch.relu(nn.functional.conv2d(h, conv.weight, conv.bias, padding=1)), 2
        )
    expected = model.fc(torch.flatten(h, 1))
    torch.testing.assert_close(model(x), expected)


def test_batch_norm_variant_and_non_square_input():
    model = create_model("seed-cnn-bn", embedding_dim=2, in_channels=3, image_size=(20, 12))
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert model(torch.randn(4, 3, 20, 12)).shape == (4, 2)


def test_seed_cnn_hidden_layer():
    model = create_model("seed-cnn-bn", embedding_dim=3, in_channels=1, image_size=28, hidden=64)
    assert model.hidden[0].in_features == 128 * 4 * 4 and model.fc.in_features == 64
    assert isinstance(model.hidden[1], nn.BatchNorm1d)
    assert model(torch.randn(4, 1, 28, 28)).shape == (4, 3)
    plain = SeedCNN(3, hidden=8)
    assert isinstance(plain.hidden[1], nn.Identity) and plain.hidden[0].bias is not None


@pytest.mark.parametrize("depth", [18, 50])
def test_iresnet_at_112(depth):
    model = IResNet(depth, 32, image_size=112).eval()
    blocks = sum(1 for m in model.modules() if type(m).__name__ == "IBasicBlock")
    assert blocks == {18: 8, 50: 24}[depth]
    with torch.no_grad():
        assert model(torch.randn(1, 3, 112, 112)).shape == (1, 32)


def test_iresnet_small_input_trains():
    model = create_model("iresnet18", embedding_dim=8, in_channels=1, image_size=32)
    out = model(torch.randn(2, 1, 32, 32))
    out.sum().backward()
    assert out.shape == (2, 8)


def test_errors_name_the_bad_value():
    with pytest.raises(ValueError, match=r"unknown model 'resnet'.*iresnet18.*seed-cnn"):
        create_model("resnet", embedding_dim=3, in_channels=1, image_size=28)
    with pytest.raises(ValueError, match="too small"):
        SeedCNN(3, image_size=2, padding=0)
    with pytest.raises(ValueError, match="multiple of 16"):
        IResNet(18, image_size=100)
    with pytest.raises(ValueError, match="depth must be one of"):
        IResNet(19)
    with pytest.raises(ValueError, match="dropout"):
        SeedCNN(3, dropout=1.0)
    with pytest.raises(ValueError, match="hidden.*0"):
        SeedCNN(3, hidden=0)
    assert "seed-cnn" in list_models()
