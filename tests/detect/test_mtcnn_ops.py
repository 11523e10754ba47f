"""marginface.detect.mtcnn_ops against the PyTorch calls it replaces, bit for bit: area
resampling (F.interpolate(mode="area") on channels-last batches and on facenet-pytorch's
contiguous crops) and ceil-mode max pooling (values and memory layout)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from marginface.detect.mtcnn_ops import area_crops, area_resize, ceil_max_pool, integral_images


def _photos(seed, count, height, width):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, height, width, 3), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize(("height", "width"), [(250, 250), (97, 131), (13, 40)])
def test_area_resize_equals_interpolate_on_a_channels_last_batch(height, width):
    pixels = _photos(height, 3, height, width)
    batch = pixels.permute(0, 3, 1, 2).float()  # channels-last, as MTCNN's pyramid
    integral = integral_images(pixels)
    for size in [(151, 151), (int(height * 0.3 + 1), int(width * 0.7 + 1)), (12, 12)]:
        expected = F.interpolate(batch, size=size, mode="area")
        got = area_resize(integral, size)
        assert torch.equal(got, expected), size
        assert got.stride() == expected.stride()


def test_area_crops_equal_interpolate_on_each_crop():
    pixels = _photos(1, 2, 120, 90)
    batch = pixels.permute(0, 3, 1, 2).float()
    rng = np.random.default_rng(0)
    x1, y1 = rng.integers(1, 60, 40), rng.integers(1, 80, 40)
    x2 = np.minimum(x1 + rng.integers(0, 60, 40), 90)
    y2 = np.minimum(y1 + rng.integers(0, 70, 40), 120)
    corners = np.stack([x1, y1, x2, y2], axis=1)  # 1-based inclusive, as facenet's pad()
    image = torch.from_numpy(rng.integers(0, 2, 40))
    for side in (24, 48):
        crops, exact = area_crops(integral_images(pixels), image, corners, side)
        assert exact.all() and crops.is_contiguous()
        for k, (a, b, c, d) in enumerate(corners):
            # facenet-pytorch's crop: an integer image index, a view with odd strides
            crop = batch[int(image[k]), :, b - 1 : d, a - 1 : c].unsqueeze(0)
            assert torch.equal(crops[k], F.interpolate(crop, (side, side), mode="area")[0])


def test_area_windows_too_large_are_refused():
    integral = integral_images(torch.zeros(1, 300, 300, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="too large"):
        area_resize(integral, (1, 1))
    _, exact = area_crops(
        integral, torch.zeros(1, dtype=torch.int64), np.array([[1, 1, 300, 300]]), 1
    )
    assert not exact.any()


@pytest.mark.parametrize(
    ("shape", "kernel", "channels_last"),
    [
        ((1, 10, 149, 149), 2, True),  # P-Net's first level
        ((1, 10, 24, 37), 2, True),
        ((60, 28, 22, 22), 3, False),  # R-Net
        ((10, 32, 46, 46), 3, False),  # O-Net
        ((10, 64, 8, 8), 2, False),
        ((4, 8, 41, 30), 3, True),  # ragged last windows, channels-last
        ((3, 5, 9, 10), 3, False),  # small: PyTorch's own kernel
    ],
)
def test_ceil_max_pool_equals_max_pool2d(shape, kernel, channels_last):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g)
    x[0, 0, 0, 0] = float("nan")
    x[-1, -1, -1, -1] = float("inf")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    expected = F.max_pool2d(x, kernel, 2, ceil_mode=True)
    got = ceil_max_pool(x, kernel, 2)
    assert torch.equal(got.nan_to_num(7.0), expected.nan_to_num(7.0))
    assert torch.equal(got.isnan(), expected.isnan())
    assert got.shape == expected.shape and got.stride() == expected.stride()
