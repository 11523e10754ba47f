"""Random training-time augmentation of image batches: affine jitter and horizontal flips.

One :class:`BatchAugmentation` transforms a whole batch ``(B, C, H, W)`` on its own device with a
single ``grid_sample``: per image a random rotation, isotropic scale, translation and (optional)
mirror, resampled bilinearly with the border pixels repeated outside the image (the background
of digits and characters; the edge of a face crop). Parameters are drawn from a caller-supplied
``torch.Generator`` so that a training run stays reproducible and resumable bit for bit.

Typical settings: MNIST ``translate=2, rotate=10, scale=0.1``; faces ``hflip=0.5`` (and
optionally ``translate`` a few pixels).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["AUGMENT_OPTIONS", "BatchAugmentation", "build_augmentation", "check_augment_options"]

AUGMENT_OPTIONS: dict[str, str] = {
    "translate": "largest shift in pixels along each axis, uniform in [-t, t]",
    "rotate": "largest rotation in degrees, uniform in [-r, r]",
    "scale": "largest relative zoom, factor uniform in [1 - s, 1 + s] (s < 1)",
    "hflip": "probability of a horizontal mirror, in [0, 1]",
}
"""The keys of ``TrainConfig.augment`` and what they mean."""


def check_augment_options(options: Mapping[str, Any]) -> dict[str, float]:
    """Validate augmentation options and return them as floats.

    Raises:
        ValueError: an unknown key (the message lists the valid ones) or a value out of range.
        TypeError: a value that is not a real number.
    """
    if not isinstance(options, Mapping):
        raise TypeError(f"augment must be a table of options, got {options!r}")
    unknown = sorted(set(options) - set(AUGMENT_OPTIONS))
    if unknown:
        raise ValueError(
            f"unknown augment option(s) {', '.join(map(repr, unknown))}; valid: "
            f"{', '.join(AUGMENT_OPTIONS)}"
        )
    checked: dict[str, float] = {}
    for key, value in options.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"augment option {key!r} must be a real number, got {value!r}")
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"augment option {key!r} must be finite and >= 0, got {value!r}")
        if key == "hflip" and value > 1:
            raise ValueError(f"augment option 'hflip' is a probability in [0, 1], got {value!r}")
        if key == "scale" and value >= 1:
            raise ValueError(f"augment option 'scale' must be < 1, got {value!r}")
        if key == "rotate" and value > 180:
            raise ValueError(f"augment option 'rotate' must be <= 180 degrees, got {value!r}")
        checked[key] = value
    return checked


class BatchAugmentation:
    """Random affine jitter and horizontal mirroring of a batch of images.

    For each image ``i`` draw ``α ~ U(-rotate, rotate)`` (degrees), ``z ~ U(1-scale, 1+scale)``,
    ``(tx, ty) ~ U(-translate, translate)²`` (pixels) and ``f = -1`` with probability ``hflip``
    (else 1). The output pixel at position ``p`` (pixel units, origin at the image centre) is the
    input sampled at ``R(-α) · diag(f, 1) · (p - t) / z``: the content is mirrored, zoomed by
    ``z``, rotated by ``α`` and shifted by ``t``. Bilinear, border pixels repeated outside.

    Args:
        translate: largest shift in pixels. Default 0.
        rotate: largest rotation in degrees. Default 0.
        scale: largest relative zoom (``< 1``). Default 0.
        hflip: probability of a mirror image. Default 0.

    Call with ``images`` ``(B, C, H, W)`` floating point and a CPU ``torch.Generator``; returns a
    new tensor of the same shape, dtype and device (the input is not modified). With every option
    0 it returns the input unchanged.
    """

    def __init__(
        self,
        *,
        translate: float = 0.0,
        rotate: float = 0.0,
        scale: float = 0.0,
        hflip: float = 0.0,
    ) -> None:
        options = check_augment_options(
            {"translate": translate, "rotate": rotate, "scale": scale, "hflip": hflip}
        )
        self.translate = options["translate"]
        self.rotate = options["rotate"]
        self.scale = options["scale"]
        self.hflip = options["hflip"]

    @property
    def active(self) -> bool:
        """Whether any option is non-zero."""
        return any((self.translate, self.rotate, self.scale, self.hflip))

    def __repr__(self) -> str:
        return (
            f"BatchAugmentation(translate={self.translate}, rotate={self.rotate}, "
            f"scale={self.scale}, hflip={self.hflip})"
        )

    def sample_matrices(self, batch: int, generator: torch.Generator) -> Tensor:
        """The per-image maps from output to input pixel coordinates, ``(B, 2, 3)`` float64.

        Pixel units, origin at the image centre: ``input = M[:, :, :2] @ output + M[:, :, 2]``.
        """

        def uniform(bound: float) -> Tensor:
            return (torch.rand(batch, generator=generator, dtype=torch.float64) * 2 - 1) * bound

        angle = torch.deg2rad(uniform(self.rotate))
        zoom = 1 + uniform(self.scale)
        shift = torch.stack([uniform(self.translate), uniform(self.translate)], dim=1)  # (B, 2)
        mirror = torch.where(
            torch.rand(batch, generator=generator, dtype=torch.float64) < self.hflip, -1.0, 1.0
        )
        cos, sin = torch.cos(angle), torch.sin(angle)
        # R(-α) diag(f, 1) / z
        linear = (
            torch.stack(
                [torch.stack([cos * mirror, sin], 1), torch.stack([-sin * mirror, cos], 1)], 1
            )
            / zoom[:, None, None]
        )
        offset = -(linear @ shift[:, :, None])[:, :, 0]
        return torch.cat([linear, offset[:, :, None]], dim=2)

    def __call__(self, images: Tensor, generator: torch.Generator) -> Tensor:
        if images.dim() != 4 or not images.is_floating_point():
            raise ValueError(
                "images must be a floating-point (B, C, H, W) tensor, got "
                f"{images.dtype} of shape {tuple(images.shape)}"
            )
        if not self.active:
            return images
        batch, _, height, width = images.shape
        matrices = self.sample_matrices(batch, generator)
        # Pixel coordinates -> grid_sample's normalized ones (align_corners=False):
        # x_norm = x_pix / (W / 2), so theta = S⁻¹ M S with S = diag(W/2, H/2).
        half = torch.tensor([width / 2, height / 2], dtype=torch.float64)
        theta = matrices.clone()
        theta[:, :, :2] = matrices[:, :, :2] * half[None, None, :] / half[None, :, None]
        theta[:, :, 2] = matrices[:, :, 2] / half[None, :]
        theta = theta.to(device=images.device, dtype=images.dtype)
        grid = F.affine_grid(theta, list(images.shape), align_corners=False)
        return F.grid_sample(
            images, grid, mode="bilinear", padding_mode="border", align_corners=False
        )


def build_augmentation(options: Mapping[str, Any]) -> BatchAugmentation | None:
    """A :class:`BatchAugmentation` from ``TrainConfig.augment``, or None when it does nothing."""
    augmentation = BatchAugmentation(**check_augment_options(options))
    return augmentation if augmentation.active else None
