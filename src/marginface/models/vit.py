"""Vision Transformer for faces as insightface's ``vit_t``, ``vit_s``, ``vit_b``
(``arcface_torch/backbones/vit.py``; Dosovitskiy et al., "An Image is Worth 16x16 Words",
ICLR 2021, with a flattened-token feature head instead of a class token).

``Tensor[N, 3, 112, 112]`` → 9×9 patches of stride 9 (``patch_embed.proj``, a convolution with
bias: 12×12 = 144 tokens of width ``W``, the last 4 pixel rows and columns unused) → ``+
pos_embed`` ``(1, 144, W)`` → (training with ``mask_ratio > 0``: a random ``1 - mask_ratio`` of
the tokens per sample is kept) → ``depth`` pre-norm blocks ``x + attn(norm1(x))``, ``x +
mlp(norm2(x))`` (multi-head self-attention without qkv bias, scale ``(W / heads)^-½``; MLP
``W → 4W → W`` with ReLU6; stochastic depth rising linearly from 0 to ``drop_path_rate``) →
``norm`` → (masked positions filled with ``mask_token`` and the tokens put back in order) →
flatten ``(N, 144·W)`` → ``feature``: ``Linear(144·W → W, bias=False)``, ``BatchNorm1d(W,
eps=2e-5)``, ``Linear(W → D, bias=False)``, ``BatchNorm1d(D, eps=2e-5)``.

======  =====  =====  =====  ==========  ==============================
name    W      depth  heads  mask_ratio  activation checkpointing
======  =====  =====  =====  ==========  ==============================
vit_t   256    12     8      0.1         off
vit_s   512    12     8      0.1         off
vit_b   512    24     8      0.1         on
======  =====  =====  =====  ==========  ==============================

All three: ``drop_path_rate = 0.1``, LayerNorm (eps 1e-5). Names and shapes are insightface's
(``patch_embed.proj``, ``pos_embed``, ``blocks.i.norm1``, ``blocks.i.attn.qkv``,
``blocks.i.attn.proj``, ``blocks.i.mlp.fc1/fc2``, ``norm``, ``feature.0..3``, ``mask_token``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .._validation import check_choice, check_int, check_real

__all__ = [
    "VIT_CONFIGS",
    "VisionTransformer",
    "drop_path",
    "random_masking",
    "vit_b",
    "vit_s",
    "vit_t",
]

VIT_CONFIGS: dict[str, dict[str, Any]] = {
    "vit_t": {"width": 256, "depth": 12, "heads": 8, "activation_checkpointing": False},
    "vit_s": {"width": 512, "depth": 12, "heads": 8, "activation_checkpointing": False},
    "vit_b": {"width": 512, "depth": 24, "heads": 8, "activation_checkpointing": True},
}


def drop_path(x: Tensor, p: float, training: bool) -> Tensor:
    """Stochastic depth (Huang et al., 2016): each sample's residual branch ``x[n]`` is zeroed
    with probability ``p`` and the survivors scaled by ``1 / (1 - p)``; identity when not
    training or ``p == 0``. ``x``: ``Tensor[N, ...]``."""
    if not training or p == 0.0:
        return x
    keep = 1.0 - p
    shape = (x.shape[0],) + (1,) * (x.dim() - 1)
    mask = torch.empty(shape, dtype=x.dtype, device=x.device).bernoulli_(keep)
    return x * mask / keep


def random_masking(tokens: Tensor, mask_ratio: float) -> tuple[Tensor, Tensor]:
    """Keep ``int(L · (1 - mask_ratio))`` tokens of each sample, chosen at random (MAE's
    per-sample shuffle by the argsort of uniform noise).

    Args:
        tokens: ``Tensor[N, L, W]``.
        mask_ratio: share of tokens dropped, ``0 <= mask_ratio < 1``.

    Returns:
        ``(kept, restore)``: ``kept`` ``Tensor[N, K, W]`` (the first ``K`` of the shuffled
        order), ``restore`` ``int64[N, L]``: gathering ``cat(kept, fill)`` along dim 1 with it
        puts every token back at its position.
    """
    n, length, width = tokens.shape
    keep = int(length * (1 - mask_ratio))
    noise = torch.rand(n, length, device=tokens.device)  # (N, L)
    shuffle = torch.argsort(noise, dim=1)  # small noise is kept
    restore = torch.argsort(shuffle, dim=1)  # (N, L)
    kept = torch.gather(tokens, 1, shuffle[:, :keep, None].expand(n, keep, width))  # (N, K, W)
    return kept, restore


class PatchEmbed(nn.Module):
    """``Tensor[N, C, s, s] -> Tensor[N, (s // p)², W]``: a ``p×p`` convolution of stride ``p``
    (``proj``, with bias), flattened row-major."""

    def __init__(self, image_size: int, patch_size: int, in_channels: int, width: int) -> None:
        super().__init__()
        self.image_size = image_size
        self.num_patches = (image_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_channels, width, patch_size, stride=patch_size)

    def forward(self, images: Tensor) -> Tensor:
        if images.shape[-2:] != (self.image_size, self.image_size):
            raise ValueError(
                f"images must be {self.image_size}x{self.image_size}, "
                f"got {tuple(images.shape[-2:])}"
            )
        return self.proj(images).flatten(2).transpose(1, 2)  # (N, L, W)


class Mlp(nn.Module):
    """``fc2(dropout(relu6(fc1(x))))``, ``W → hidden → W``."""

    def __init__(self, width: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.ReLU6()
        self.fc2 = nn.Linear(hidden, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Attention(nn.Module):
    """Multi-head self-attention ``Tensor[N, L, W] -> Tensor[N, L, W]``:
    ``proj(softmax(q kᵀ / √(W / heads)) v)`` per head, ``q, k, v`` from ``qkv`` (no bias)."""

    def __init__(self, width: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} must be a multiple of heads, got heads={heads}")
        self.num_heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width)
        self.proj_drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        n, length, width = x.shape
        qkv = self.qkv(x).reshape(n, length, 3, self.num_heads, width // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (N, heads, L, W / heads)
        out = F.scaled_dot_product_attention(q, k, v)  # (N, heads, L, W / heads)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(n, length, width)))


class VITBatchNorm(nn.Module):
    """BatchNorm over the token axis of ``Tensor[N, L, W]`` (``norm_layer="bn"``): ``L``
    channels, statistics over samples and width."""

    def __init__(self, num_patches: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(num_patches)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(x)


def _norm(kind: str, width: int, num_patches: int) -> nn.Module:
    return nn.LayerNorm(width) if kind == "ln" else VITBatchNorm(num_patches)


class Block(nn.Module):
    """Pre-norm transformer block: ``x + dp(attn(norm1(x)))``, then ``x + dp(mlp(norm2(x)))``,
    ``dp`` being stochastic depth of rate ``drop_path``."""

    def __init__(
        self,
        width: int,
        heads: int,
        num_patches: int,
        *,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        drop_path: float = 0.0,
        norm_layer: str = "ln",
    ) -> None:
        super().__init__()
        self.norm1 = _norm(norm_layer, width, num_patches)
        self.attn = Attention(width, heads, dropout)
        self.drop_path = drop_path
        self.norm2 = _norm(norm_layer, width, num_patches)
        self.mlp = Mlp(width, int(width * mlp_ratio), dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + drop_path(self.attn(self.norm1(x)), self.drop_path, self.training)
        return x + drop_path(self.mlp(self.norm2(x)), self.drop_path, self.training)


class VisionTransformer(nn.Module):
    """insightface's face ViT ``Tensor[N, C, s, s] -> Tensor[N, embedding_dim]``.

    Args:
        embedding_dim: ``D``. Default: 512 (insightface's ``num_features``).
        width: token width ``W``. Default: 512.
        depth: blocks. Default: 12.
        heads: attention heads. Default: 8.
        patch_size: Default: 9.
        in_channels: Default: 3.
        image_size: Default: 112.
        mlp_ratio: MLP hidden width / ``W``. Default: 4.
        dropout: dropout after the position embedding, in the MLP and after the attention
            projection. Default: 0.
        drop_path_rate: stochastic depth of the last block (linear from 0). Default: 0.1.
        mask_ratio: share of tokens dropped at random in training (replaced by ``mask_token``
            after the blocks). Default: 0.1.
        activation_checkpointing: recompute each block in the backward pass instead of
            keeping its activations (insightface's ``using_checkpoint``). Default: False.
        norm_layer: ``"ln"`` (LayerNorm, default) or ``"bn"`` (BatchNorm over the tokens).
    """

    def __init__(
        self,
        embedding_dim: int = 512,
        *,
        width: int = 512,
        depth: int = 12,
        heads: int = 8,
        patch_size: int = 9,
        in_channels: int = 3,
        image_size: int = 112,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        drop_path_rate: float = 0.1,
        mask_ratio: float = 0.1,
        activation_checkpointing: bool = False,
        norm_layer: str = "ln",
    ) -> None:
        super().__init__()
        self.embedding_dim = check_int("embedding_dim", embedding_dim, minimum=1)
        check_int("width", width, minimum=1)
        check_int("depth", depth, minimum=1)
        check_int("heads", heads, minimum=1)
        check_int("patch_size", patch_size, minimum=1)
        check_int("in_channels", in_channels, minimum=1)
        check_int("image_size", image_size, minimum=patch_size)
        check_real("dropout", dropout, nonnegative=True, below=1.0)
        check_real("drop_path_rate", drop_path_rate, nonnegative=True, below=1.0)
        self.mask_ratio = check_real("mask_ratio", mask_ratio, nonnegative=True, below=1.0)
        norm_layer = check_choice("norm_layer", norm_layer, ("ln", "bn"))
        if not isinstance(activation_checkpointing, bool):
            raise TypeError(
                f"activation_checkpointing must be a bool, got {activation_checkpointing!r}"
            )
        self.activation_checkpointing = activation_checkpointing
        self.patch_embed = PatchEmbed(image_size, patch_size, in_channels, width)
        self.num_patches = self.patch_embed.num_patches
        self.width = width
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_patches, width))
        self.pos_drop = nn.Dropout(dropout)
        rates = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.ModuleList(
            Block(
                width,
                heads,
                self.num_patches,
                mlp_ratio=mlp_ratio,
                dropout=dropout,
                drop_path=rate,
                norm_layer=norm_layer,
            )
            for rate in rates
        )
        self.norm = _norm(norm_layer, width, self.num_patches)
        self.feature = nn.Sequential(
            nn.Linear(width * self.num_patches, width, bias=False),
            nn.BatchNorm1d(width, eps=2e-5),
            nn.Linear(width, embedding_dim, bias=False),
            nn.BatchNorm1d(embedding_dim, eps=2e-5),
        )
        self.mask_token = nn.Parameter(torch.zeros(1, 1, width))
        nn.init.normal_(self.mask_token, std=0.02)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward_features(self, images: Tensor) -> Tensor:
        """The normalized tokens, flattened: ``Tensor[N, L·W]``."""
        x = self.pos_drop(self.patch_embed(images) + self.pos_embed)  # (N, L, W)
        n, length, width = x.shape
        masked = self.training and self.mask_ratio > 0
        if masked:
            x, restore = random_masking(x, self.mask_ratio)  # (N, K, W)
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        x = self.norm(x)
        if masked:
            fill = self.mask_token.to(x.dtype).expand(n, length - x.shape[1], width)
            x = torch.cat([x, fill], dim=1)  # (N, L, W), shuffled order
            x = torch.gather(x, 1, restore[:, :, None].expand(n, length, width))
        return x.reshape(n, length * width)

    def forward(self, images: Tensor) -> Tensor:
        """Embeddings ``Tensor[N, D]`` of ``Tensor[N, C, s, s]``."""
        return self.feature(self.forward_features(images))


def _vit(name: str, embedding_dim: int, options: dict[str, Any]) -> VisionTransformer:
    return VisionTransformer(embedding_dim, **{**VIT_CONFIGS[name], **options})


def vit_t(embedding_dim: int = 512, **options: Any) -> VisionTransformer:
    """insightface's ``vit_t``: width 256, 12 blocks, 8 heads."""
    return _vit("vit_t", embedding_dim, options)


def vit_s(embedding_dim: int = 512, **options: Any) -> VisionTransformer:
    """insightface's ``vit_s``: width 512, 12 blocks, 8 heads."""
    return _vit("vit_s", embedding_dim, options)


def vit_b(embedding_dim: int = 512, **options: Any) -> VisionTransformer:
    """insightface's ``vit_b``: width 512, 24 blocks, 8 heads, activation checkpointing."""
    return _vit("vit_b", embedding_dim, options)
