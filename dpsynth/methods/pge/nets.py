"""Networks for the score-based backends: a small class-conditional U-Net and its helpers.

Everything here is safe under per-record gradients: GroupNorm only (never BatchNorm, which
mixes records), no in-place ops on activations, attention written with plain matmuls so that
forward-mode AD (`torch.func.jvp`) and `vmap` work through it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with min(C/4, 32) groups (at least one), as in DDPM++."""
    groups = max(1, min(channels // 4, 32))
    while channels % groups:
        groups -= 1
    return nn.GroupNorm(groups, channels, eps=1e-6)


def kaiming_init(module: nn.Module) -> None:
    """Kaiming-normal (fan-in) weights and zero biases for every conv and linear layer."""
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(layer.weight, mode="fan_in", nonlinearity="relu")
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


def zero_init(layer: nn.Module) -> nn.Module:
    """Set a layer's weights and bias to zero (so a residual branch starts as a no-op)."""
    for p in layer.parameters():
        nn.init.zeros_(p)
    return layer


def noise_level_embedding(sigma: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of log σ ([B] → [B, dim])."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(10000.0) * torch.arange(half, device=sigma.device, dtype=sigma.dtype) / half
    )
    # log σ spans about [-4, 1]; the factor spreads it over the embedding's frequency range.
    arg = (torch.log(sigma) * 250.0)[:, None] * freqs[None, :]
    return torch.cat([torch.sin(arg), torch.cos(arg)], dim=1)


class ResBlock(nn.Module):
    """BigGAN-style residual block with an additive conditioning embedding, sums scaled by 1/√2."""

    def __init__(self, in_ch: int, out_ch: int, emb_dim: int) -> None:
        super().__init__()
        self.norm1 = group_norm(in_ch)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.emb = nn.Linear(emb_dim, out_ch)
        self.norm2 = group_norm(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.skip = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """x [B, in_ch, H, W], emb [B, emb_dim] → [B, out_ch, H, W]."""
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb(F.silu(emb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.skip(x) + h) / math.sqrt(2.0)


class AttnBlock(nn.Module):
    """Single-head self-attention over spatial positions, written with matmul + softmax."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = group_norm(channels)
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, C, H, W] → same shape."""
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).unbind(1)
        weights = torch.softmax(torch.einsum("bci,bcj->bij", q, k) / math.sqrt(c), dim=-1)
        attended = torch.einsum("bij,bcj->bci", weights, v).reshape(b, c, h, w)
        return (x + self.out(attended)) / math.sqrt(2.0)


class RandomConvEncoder(nn.Module):
    """A frozen, seeded, data-independent strided conv stack (the residual module's encoder).

    It stands in for the paper's pre-trained VQGAN without any download or any training data:
    its weights are drawn from `seed` alone and kept as buffers, so it has no trainable
    parameters and nothing in it is learned from (or normalised on) private data. Its output
    scale is normalised with a constant measured on seeded uniform noise images.
    """

    def __init__(self, in_ch: int, out_ch: int, downsamplings: int, seed: int = 1234) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.downsamplings = downsamplings
        chans = [in_ch] + [out_ch] * max(1, downsamplings)
        for i in range(len(chans) - 1):
            fan_in = chans[i] * 9
            weight = torch.randn(
                chans[i + 1], chans[i], 3, 3, generator=gen, device=gen.device
            ) / math.sqrt(fan_in)
            self.register_buffer(f"weight{i}", weight)
        probe = torch.rand(64, in_ch, 32, 32, generator=gen, device=gen.device) * 2 - 1
        self.register_buffer("scale", torch.ones(()))
        self.scale = self._encode(probe).std().clamp_min(1e-6).reshape(())

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        n_layers = max(1, self.downsamplings)
        for i in range(n_layers):
            stride = 2 if i < self.downsamplings else 1
            h = F.conv2d(h, getattr(self, f"weight{i}"), stride=stride, padding=1)
            if i < n_layers - 1:
                h = torch.tanh(h)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, C, H, W] in [-1, 1] → normalised latent [B, out_ch, H/2^d, W/2^d]."""
        return self._encode(x) / self.scale


class ScoreUNet(nn.Module):
    """Class-conditional, noise-conditional U-Net (a small NCSN++/DDPM++ in the DPDM layout).

    `forward(x, sigma, y, z)` returns the raw network output; the score is `output / sigma`.
    Label `num_classes` is the "no label" token used for label dropout / guidance.
    With `residual_channels > 0`, `z` (latent features at the bottleneck resolution) is added
    to the middle features through a zero-initialised 1x1 projection (the residual module).
    """

    def __init__(
        self,
        channels: int,
        num_classes: int,
        nf: int = 32,
        ch_mult: Sequence[int] = (1, 2, 2),
        num_res_blocks: int = 2,
        attn_levels: Sequence[int] = (),
        mid_attention: bool = True,
        residual_channels: int = 0,
    ) -> None:
        super().__init__()
        self.nf = nf
        self.num_levels = len(ch_mult)
        self.residual_channels = residual_channels
        emb_dim = 4 * nf
        self.emb_net = nn.Sequential(nn.Linear(nf, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.label_emb = nn.Embedding(num_classes + 1, emb_dim)
        self.conv_in = nn.Conv2d(channels, nf, 3, padding=1)

        self.down = nn.ModuleList()
        skip_chs = [nf]
        ch = nf
        for level, mult in enumerate(ch_mult):
            blocks = nn.ModuleList()
            for _ in range(num_res_blocks):
                blocks.append(ResBlock(ch, nf * mult, emb_dim))
                ch = nf * mult
                if level in attn_levels:
                    blocks.append(AttnBlock(ch))
                skip_chs.append(ch)
            if level < len(ch_mult) - 1:
                blocks.append(nn.Conv2d(ch, ch, 3, stride=2, padding=1))
                skip_chs.append(ch)
            self.down.append(blocks)

        self.mid1 = ResBlock(ch, ch, emb_dim)
        self.mid_attn = AttnBlock(ch) if mid_attention else None
        self.mid2 = ResBlock(ch, ch, emb_dim)
        self.residual_proj = (
            zero_init(nn.Conv2d(residual_channels, ch, 1)) if residual_channels > 0 else None
        )

        self.up = nn.ModuleList()
        for level in reversed(range(len(ch_mult))):
            blocks = nn.ModuleList()
            for _ in range(num_res_blocks + 1):
                blocks.append(ResBlock(ch + skip_chs.pop(), nf * ch_mult[level], emb_dim))
                ch = nf * ch_mult[level]
                if level in attn_levels:
                    blocks.append(AttnBlock(ch))
            if level > 0:
                blocks.append(nn.Upsample(scale_factor=2.0, mode="nearest"))
                blocks.append(nn.Conv2d(ch, ch, 3, padding=1))
            self.up.append(blocks)

        self.norm_out = group_norm(ch)
        self.conv_out = nn.Conv2d(ch, channels, 3, padding=1)
        kaiming_init(self)
        # Zero-init the last conv of each residual branch, the attention outputs, the output
        # conv and the residual projection: every branch starts as a no-op (DDPM++ init_scale 0).
        for module in self.modules():
            if isinstance(module, ResBlock):
                zero_init(module.conv2)
            if isinstance(module, AttnBlock):
                zero_init(module.out)
        zero_init(self.conv_out)
        if self.residual_proj is not None:
            zero_init(self.residual_proj)

    @property
    def downsample_factor(self) -> int:
        """How much the bottleneck is smaller than the input (2^(levels−1))."""
        return 2 ** (self.num_levels - 1)

    def forward(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor,
        y: torch.Tensor,
        z: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [B,C,H,W], sigma [B] (>0), y int64 [B], z [B, c_z, H/f, W/f] or None → [B,C,H,W]."""
        emb = self.emb_net(noise_level_embedding(sigma, self.nf)) + self.label_emb(y)
        h = self.conv_in(x)
        skips = [h]
        for blocks in self.down:
            for block in blocks:
                if isinstance(block, AttnBlock):
                    h = block(h)
                    skips[-1] = h  # attention refines the skip its ResBlock just produced
                else:
                    h = block(h, emb) if isinstance(block, ResBlock) else block(h)
                    skips.append(h)
        h = self.mid1(h, emb)
        if self.mid_attn is not None:
            h = self.mid_attn(h)
        h = self.mid2(h, emb)
        if self.residual_proj is not None and z is not None:
            h = h + self.residual_proj(z)
        for blocks in self.up:
            for block in blocks:
                if isinstance(block, ResBlock):
                    h = block(torch.cat([h, skips.pop()], dim=1), emb)
                else:
                    h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))
