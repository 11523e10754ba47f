"""A backbone's refused input side names the backbone and says which --image-size to pass."""

from __future__ import annotations

import pytest

from marginface.models import IResNet, create_model
from marginface.models._sides import check_image_side
from marginface.models.mobilefacenet import MobileFaceNet


def test_iresnet_names_itself_and_the_nearest_sides():
    with pytest.raises(ValueError) as caught:
        IResNet(50, image_size=40)
    message = str(caught.value)
    assert message.startswith("IResNet-50 (r50): image_size must be a multiple of 16")
    assert "got 40: pass --image-size 32 or 48 (the nearest)" in message


def test_a_side_below_the_multiple_says_to_pass_image_size():
    with pytest.raises(ValueError) as caught:
        IResNet(18, image_size=8)
    message = str(caught.value)
    assert message.startswith("IResNet-18 (r18): image_size must be >= 16")
    assert "got 8: pass --image-size 16 or a larger multiple of 16 (112 for faces)" in message


def test_mobilefacenet_names_itself():
    with pytest.raises(
        ValueError, match=r"^MobileFaceNet \(mbf\): .*got 100: pass --image-size 96 or 112"
    ):
        MobileFaceNet(8, image_size=100)
    with pytest.raises(ValueError, match=r"^MobileFaceNet \(mbf\): image_size must be >= 16"):
        create_model("mbf", embedding_dim=8, in_channels=3, image_size=8)


def test_the_check_accepts_multiples_and_refuses_non_integers():
    assert check_image_side("m", 112, multiple=16, why="w") == 112
    assert check_image_side("m", 16, multiple=16, why="w") == 16
    with pytest.raises(TypeError, match=r"image_size must be an integer, got 112\.0"):
        check_image_side("m", 112.0, multiple=16, why="w")
    assert IResNet(18, 8, image_size=32).embedding_dim == 8


def test_mbf_large_names_itself_in_its_side_message():
    """The side message names the registered model (it said 'mbf' for mbf_large too)."""
    with pytest.raises(ValueError, match=r"MobileFaceNet \(mbf_large\)") as caught:
        create_model("mbf_large", embedding_dim=8, in_channels=3, image_size=100)
    assert "(mbf)" not in str(caught.value)
    with pytest.raises(ValueError, match=r"MobileFaceNet \(mbf\)"):
        create_model("mbf", embedding_dim=8, in_channels=3, image_size=100)
