"""The MNIST recipe's small CNN (``seed-cnn``, docs/training.md): three 3×3 conv blocks,
dropout and a dense layer to the embedding.

The architecture (a Keras model in the original recipe): ``ZeroPadding2D(2) → [Conv2D(c, 3,
same) → ReLU → MaxPool(2)] × 3 with c = 32, 64, 128 → Flatten → Dropout(0.5) →
Dense(embedding_dim)``, with an L2 penalty of 1e-5
on the conv kernels (here: the optimizer's weight decay instead). ``batch_norm=True`` inserts a
BatchNorm after each convolution (and after the dense layer), the variant our best recipe uses.

Speed (``fused=True``, the default, without BatchNorm): the first block runs as one fused
conv + max-pool + ReLU (:func:`~marginface.models.conv_pool.conv3x3_maxpool2_relu`, no
full-resolution map) and dropout at p = 0.5 draws its mask from random bits
(:func:`~marginface.models.dropout.fast_dropout`). Same parameters, same state_dict keys, same
outputs and gradients up to float rounding (dropout: same distribution, another random stream).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._validation import check_int, check_real
from .conv_pool import conv3x3_maxpool2_relu
from .dropout import fast_dropout

__all__ = ["SeedCNN"]


def _exporting() -> bool:
    """Tracing, scripting or compiling: the plain layers (the fused path is Python code)."""
    if torch.jit.is_scripting():
        return True
    return torch.jit.is_tracing() or torch.compiler.is_compiling()


class SeedCNN(nn.Module):
    """The MNIST recipe's three-block CNN: ``Tensor[N, C, H, W] -> Tensor[N, embedding_dim]``.

    Args:
        embedding_dim: ``D >= 1``, 2 or 3 to plot the embeddings. Default: 3.
        in_channels: image channels. Default: 1.
        image_size: input side in pixels (28 for MNIST, 8 for digits), or ``(H, W)``.
            Default: 28.
        widths: the three conv widths. Default: (32, 64, 128) (the recipe's).
        padding: zero padding added around the input first. Default: 2 (the recipe's: 28 → 32).
        dropout: dropout probability before the dense layer. Default: 0.5 (the recipe's).
        batch_norm: BatchNorm after each conv and on the embedding. Default: False (the recipe's).
        hidden: width of an extra dense layer (+ BatchNorm when ``batch_norm``, + ReLU) between
            the flattened features and the embedding layer, or None (seed: one dense layer).
        fused: fast path without BatchNorm: fused first block and bit-mask dropout (see the
            module docstring); used for CPU images that do not require grad, when the model is
            not being traced, scripted or compiled (export). Default: True.
        device, dtype: where the parameters are created.

    The flattened size is ``widths[-1] · ⌊(H + 2·padding)/8⌋ · ⌊(W + 2·padding)/8⌋``.
    """

    def __init__(
        self,
        embedding_dim: int = 3,
        *,
        in_channels: int = 1,
        image_size: int | tuple[int, int] = 28,
        widths: tuple[int, int, int] = (32, 64, 128),
        padding: int = 2,
        dropout: float = 0.5,
        batch_norm: bool = False,
        hidden: int | None = None,
        fused: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.embedding_dim = check_int("embedding_dim", embedding_dim, minimum=1)
        check_int("in_channels", in_channels, minimum=1)
        sides = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if len(sides) != 2:
            raise ValueError(f"image_size must be an int or (H, W), got {image_size!r}")
        for side in sides:
            check_int("image_size", side, minimum=1)
        check_int("padding", padding, minimum=0)
        check_real("dropout", dropout, nonnegative=True, below=1.0)
        if len(widths) != 3:
            raise ValueError(f"widths must hold three conv widths, got {widths!r}")
        out_h, out_w = (side + 2 * padding for side in sides)
        for _ in range(3):
            out_h, out_w = out_h // 2, out_w // 2
        if min(out_h, out_w) < 1:
            raise ValueError(
                f"image_size={image_size} with padding={padding} is too small for three 2×2 "
                "poolings (need image_size + 2·padding >= 8)"
            )
        dd = {"device": device, "dtype": dtype}
        layers: list[nn.Module] = []
        previous = in_channels
        for i, width in enumerate(widths):
            check_int("widths[i]", width, minimum=1)
            # Keras' ZeroPadding2D(p) followed by a "same" 3×3 conv is one conv padded 1 + p.
            pad = 1 + padding if i == 0 else 1
            layers.append(nn.Conv2d(previous, width, 3, padding=pad, bias=not batch_norm, **dd))
            if batch_norm:
                layers.append(nn.BatchNorm2d(width, **dd))
            # max-pool then ReLU: equal to ReLU then max-pool (both monotone), 4× less ReLU work.
            layers += [nn.MaxPool2d(2), nn.ReLU(inplace=True)]
            previous = width
        self.features = nn.Sequential(*layers)
        self.dropout = nn.Dropout(dropout)
        flat = previous * out_h * out_w
        if hidden is None:
            self.hidden: nn.Module = nn.Identity()
        else:
            check_int("hidden", hidden, minimum=1)
            self.hidden = nn.Sequential(
                nn.Linear(flat, hidden, bias=not batch_norm, **dd),
                nn.BatchNorm1d(hidden, **dd) if batch_norm else nn.Identity(),
                nn.ReLU(inplace=True),
            )
            flat = hidden
        self.fc = nn.Linear(flat, embedding_dim, **dd)
        self.bn = nn.BatchNorm1d(embedding_dim, **dd) if batch_norm else nn.Identity()
        self.in_channels = in_channels
        self.image_size = image_size
        self.padding = padding
        self.fused = bool(fused) and not batch_norm

    @torch.jit.unused
    def _forward_fused(self, images):  # unannotated: TorchScript skips it (jit.unused)
        conv1 = self.features[0]
        x = conv3x3_maxpool2_relu(images, conv1.weight, conv1.bias, 1 + self.padding)
        x = self.features[3:](x)  # (N, 128, s, s)
        x = fast_dropout(torch.flatten(x, 1), self.dropout.p, self.training)  # (N, 128·s²)
        return self.fc(self.hidden(x))  # (N, D)

    def forward(self, images: Tensor) -> Tensor:
        """Embeddings ``Tensor[N, D]`` (not normalized) of images ``Tensor[N, C, H, W]``."""
        if (
            self.fused
            and images.device.type == "cpu"
            and not images.requires_grad
            and not _exporting()
        ):
            return self._forward_fused(images)
        x = self.features(images)  # (N, 128, s, s)
        x = self.dropout(torch.flatten(x, 1))  # (N, 128·s²)
        return self.bn(self.fc(self.hidden(x)))  # (N, D)
