"""DP-Kernel: a generator trained on the privatised gradient field of a kernel mean embedding.

Learning idea (Jiang, Sun & Yu, NeurIPS 2023): minimise the MMD² between generated and private
data under a fixed sum of Gaussian kernels (times a one-hot label kernel for class-conditional
generation). The only data-dependent term is the batch's kernel mean embedding f_S.

Mechanism (the sound variant of spec dpkernel §3.6; the paper's public code detaches its noise,
so what it trains has no DP guarantee): every step draws a Poisson batch S (the training loop
does that), computes ∇_w f_S at M generated points with f_S normalised by the public B = qN,
and releases it plus the derivative field of one Gaussian-process path scaled by σΔ
(`dpsynth.privacy.functional`). The generator then takes an optimiser step on the surrogate

    L(θ) = (1/M²) Σ_{j,l} k*(w_j, w_l) − (2/M) Σ_j ⟨ṽ_j, w_j⟩,   ṽ = released gradient (a constant),

whose gradient is that of the noisy MMD² (unsquared, without the x-term, which is constant in
θ). Only `private_embedding_gradient` reads the private batch; everything after it is
post-processing of ṽ. Accounting: one `poisson_gaussian` event (σ, q, T), add/remove adjacency.

Records are vectors: the generator maps (latent, one-hot label) to a vector of dimension d and
only `DPKernelGenerator` reshapes it to the data's image shape, so tabular rows reuse the code.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from dpsynth.data.images import DataInfo, to_uint8
from dpsynth.data.tabular import block_layout
from dpsynth.errors import UsageError
from dpsynth.methods.base import (
    Generator,
    Method,
    PrivacyPlan,
    PrivacyTarget,
    Trainer,
    draw_latent,
    sample_truncation,
)
from dpsynth.methods.blocks import TableHead
from dpsynth.privacy.central import CentralImages
from dpsynth.privacy.distributed import all_reduce_sum, shard
from dpsynth.privacy.functional import (
    SENSITIVITY_CHOICES,
    functional_sensitivity,
    privatize_embedding_gradient,
)
from dpsynth.privacy.randomness import PrivateRandomness

_PAPER_BANDWIDTHS = (1.0, 2.0, 4.0, 8.0, 16.0)
# `recommended_preset`: records with at least this many values get the 28×28 presets, and
# targets at or below this ε the single-kernel `-eps1` ones.
_LARGE_IMAGE_VALUES = 400
_SMALL_EPSILON = 3.0

# The DP warm start (`dpsynth.privacy.central`): `warm_start_share` of ε (0: off) on noised
# per-class means; the generator then takes `warm_start_steps` non-private MMD steps (same
# kernel) towards "records" mean[y] + `warm_start_jitter`·N(0, I) before its DP steps.
WARM_START_DEFAULTS: dict[str, Any] = {
    "warm_start_share": 0.0,
    "warm_start_clip": 0.0,
    "warm_start_count_weight": 0.5,
    "warm_start_jitter": 0.3,
    "warm_start_steps": 300,
}

PRESETS: dict[str, dict[str, Any]] = {
    # Seconds on CPU for digits (tests).
    "tiny": {
        "batch_size": 16,
        "generated_points": 16,
        "steps": 20,
        "bandwidths": (4.0, 8.0, 16.0),
        "sensitivity": "paper",
        "max_grad_norm": functional_sensitivity(3, "paper"),
        "arch": "conv",
        "width": 8,
        "latent_dim": 10,
        "norm": "group",
        "conditional": True,
        "label_input": "embed",
        "optimizer": "adam",
        "lr": 2e-3,
        "jitter": 1e-8,
        "ema": 0.0,
    },
    # digits 8×8 on 2 CPU cores in well under a minute. Bandwidths are fixed a priori for [-1, 1]
    # pixels in 64 dimensions (typical ‖x − w‖² ≈ 10–60), never fitted to the data; two wide
    # ones keep Δ and the derivative noise small (spec §3.6). Tuned on the public digits set
    # (bench/results/tuning-digits.md): a larger q (B = 256), 2,000 steps, width 64 and an EMA
    # of the weights took the CNN accuracy at ε = 10 from about 0.80 to about 0.86, which is
    # what the same settings reach without privacy.
    "small": {
        "batch_size": 256,
        "generated_points": 128,
        "steps": 2000,
        "bandwidths": (8.0, 16.0),
        "sensitivity": "paper",
        "max_grad_norm": functional_sensitivity(2, "paper"),
        "arch": "conv",
        "width": 64,
        "latent_dim": 10,
        "norm": "group",
        "conditional": True,
        "label_input": "embed",
        "optimizer": "adam",
        "lr": 1e-3,
        "jitter": 1e-8,
        "ema": 0.99,
    },
    # `small` for small ε (about 1) on digits: one narrower kernel, ℓ = 6, instead of (8, 16),
    # fixed a priori like the others. One kernel halves Δ² = 2·n_L, and the narrower one keeps
    # class detail the wide kernel blurs once the noise is large. Tuned on the public digits set
    # (bench/results/tuning-digits.md): ε = 1 CNN accuracy about 0.59 against 0.49 for `small`;
    # at ε = 10 the two are level. Samples at latent scale 0.5 (`sample_truncation`): one run
    # each gave 0.868 → 0.880 at ε = 10 and 0.584 → 0.611 at ε = 1 (tuning-mnist5k.md round 5).
    # The exact add/remove sensitivity √n_L (as `mnist`): the same ε at half the noise variance;
    # digits at ε = 1 0.727 and 0.720 against 0.618 (and 0.54–0.65 before) with `paper`'s
    # √(2 n_L), at ε = 10 0.882 against 0.875 (tuning-digits.md).
    "small-eps1": {
        "sample_truncation": 0.5,
        "batch_size": 256,
        "generated_points": 128,
        "steps": 2000,
        "bandwidths": (6.0,),
        "sensitivity": "add_remove",
        "max_grad_norm": functional_sensitivity(1, "add_remove"),
        "arch": "conv",
        "width": 64,
        "latent_dim": 10,
        "norm": "group",
        "conditional": True,
        "label_input": "embed",
        "optimizer": "adam",
        "lr": 1e-3,
        "jitter": 1e-8,
        "ema": 0.99,
    },
    # 28×28 images (mnist-5k: 4,000 records), ε about 10. The bandwidth is fixed a priori for
    # [-1, 1] pixels in 784 dimensions, where typical squared distances are 10–20 times those
    # of 8×8 digits (an image to its class mean about 160, two images of one class about 330,
    # of two classes about 440): wide kernels (ℓ ≥ 24) see every class alike and blur them,
    # so one kernel of width 12 keeps classes apart at half the sensitivity² of two. A larger
    # q for N = 4,000 (B = 512, q = 0.128); the digits generator (width 64, EMA 0.99). Tuned
    # on the public mnist-5k set (bench/results/tuning-mnist5k.md: ε = 10 CNN 0.74 with
    # ℓ = 12, 0.71 with 16, 0.58 with 24, collapse with 8); about 4–7 minutes on one CPU
    # thread, so minutes at most on a GPU. The label enters every decoder layer
    # (`label_input=layers`), not only squeezed with z into 10 values: samples of the wrong
    # class were the main error, and this took the ε = 10 CNN accuracy from 0.72–0.76 to 0.82.
    # The DP warm start (20% of ε on the central images, 1,000 non-private MMD steps towards
    # them with jitter 0.6) before the 2,000 DP steps: two runs 0.844 and 0.834 against
    # 0.806–0.822 without it (share 0.3: 0.820; 2,000 warm steps: 0.830; round 5 of
    # bench/results/tuning-mnist5k.md). Samples at latent scale 0.5 (`sample_truncation`, free
    # post-processing): one ε = 10 run gave 0.798 at 1, 0.816 at 0.7, 0.833 at 0.5, 0.835 at
    # 0.4 and 0.821 at 0.3. With both, the same preset reaches 0.885 without privacy, so the
    # noise counts again: the exact add/remove sensitivity √n_L (the adjacency the accountant
    # uses; the paper's √(2 n_L) is a replace-one bound) halves its variance: 0.856 against
    # 0.828–0.843 with `paper` (round 5).
    "mnist": {
        "warm_start_share": 0.2,
        "warm_start_steps": 1000,
        "warm_start_jitter": 0.6,
        "sample_truncation": 0.5,
        "batch_size": 512,
        "generated_points": 128,
        "steps": 2000,
        "bandwidths": (12.0,),
        "sensitivity": "add_remove",
        "max_grad_norm": functional_sensitivity(1, "add_remove"),
        "arch": "conv",
        "width": 64,
        "latent_dim": 10,
        "norm": "group",
        "conditional": True,
        "label_input": "layers",
        "optimizer": "adam",
        "lr": 1e-3,
        "jitter": 1e-8,
        "ema": 0.99,
    },
    # `mnist` for small ε (about 1): a wider kernel, ℓ = 16. The derivative noise per
    # coordinate falls as 1/ℓ, and at ε = 1 (σ ≈ 22) that outweighs the blur: CNN 0.48 against
    # 0.36 with ℓ = 12 on the public mnist-5k set (bench/results/tuning-mnist5k.md). Half the
    # steps at twice the batch: at fixed ε, σ grows about as q·√T, so the noise of each step
    # (σ/B ≈ √T/N) falls by √2 (0.030 instead of 0.042): CNN 0.54 against 0.48. The label
    # input of `mnist` (every layer) fell to 0.32 here, so this keeps the paper's.
    # At ε ≤ 3 on 28×28 the DP warm start carries it: 90% of ε on the central images (noised
    # class means), 1,000 non-private MMD steps towards them with jitter 0.6, then 10 DP steps
    # (mnist-5k ε = 1, three runs: 0.618, 0.574 and jitter 0.5 0.568, against 0.49–0.54 for the
    # 1,000 DP steps alone; jitter 1.0 gave 0.38; bench/results/tuning-mnist5k.md round 4).
    # Samples at latent scale 0.3: one ε = 1 run gave 0.511 at 1, 0.578 at 0.7, 0.631 at 0.5,
    # 0.646 at 0.4, 0.678 at 0.3, 0.681 at 0.2 and 0.621 at 0.1 (round 5). The exact add/remove
    # sensitivity √n_L (as `mnist`; half the noise variance of the 10 DP steps at the same ε):
    # 0.737 against 0.636 and 0.666 (round 6).
    "mnist-eps1": {
        "warm_start_share": 0.9,
        "warm_start_steps": 1000,
        "warm_start_jitter": 0.6,
        "sample_truncation": 0.3,
        "batch_size": 1024,
        "generated_points": 128,
        "steps": 10,
        "bandwidths": (16.0,),
        "sensitivity": "add_remove",
        "max_grad_norm": functional_sensitivity(1, "add_remove"),
        "arch": "conv",
        "width": 64,
        "latent_dim": 10,
        "norm": "group",
        "conditional": True,
        "label_input": "embed",
        "optimizer": "adam",
        "lr": 1e-3,
        "jitter": 1e-8,
        "ema": 0.99,
    },
    # The paper's conditional MNIST setting (spec §2.4, §5): DCGAN decoder ngf=64, nz=10,
    # BatchNorm on the generated side only, RMSprop lr 5e-5, B = M = 60, bandwidths
    # {1,2,4,8,16}, 200,000 steps. Named for its length (it was `paper`): about 110 ms per
    # step on one CPU thread (6 h), and on a GPU about 3,500 small kernel launches per step,
    # so likely over an hour on an H100 (not measured). On 4,000 records it is weak (H100,
    # ε = 10: CNN 0.135); spec §3.6 expects larger data-independent bandwidths to work better
    # under the sound mechanism. For 28×28 data the `mnist` presets are the tuned choice.
    "paper-200k": {
        "batch_size": 60,
        "generated_points": 60,
        "steps": 200_000,
        "bandwidths": _PAPER_BANDWIDTHS,
        "sensitivity": "paper",
        "max_grad_norm": functional_sensitivity(len(_PAPER_BANDWIDTHS), "paper"),
        "arch": "conv",
        "width": 64,
        "latent_dim": 10,
        "norm": "batch",
        "conditional": True,
        "label_input": "embed",
        "optimizer": "rmsprop",
        "lr": 5e-5,
        "jitter": 1e-8,
        "ema": 0.0,
    },
}
for _preset in PRESETS.values():
    for _key, _value in WARM_START_DEFAULTS.items():
        _preset.setdefault(_key, _value)


# Tables (german-credit and the like): an MLP whose head is a softmax per categorical block and
# a tanh per number (`methods.blocks.TableHead`). Bandwidths are fixed a priori for the
# encoding's scale, never fitted to the data: two rows differing in c categorical columns are
# at squared distance 2c plus up to 4 per numeric column, about 10–40 for tables of 20–40
# columns; ℓ = 2 (below the typical distance, so that rows stay apart) did best of 2, 4, 8
# and (2, 8) on the public german-credit set at ε = 10 (bench/tables.py).
# Few generated points: a table usually has two classes, and the derivative-GP noise of m
# points sharing a label costs one Cholesky of size m·min(d, m − 1) per step (about m²), so
# m = 16 per class keeps a step in milliseconds where the image presets' M = 128 over two
# classes would take seconds.
TABLE_PRESETS: dict[str, dict[str, Any]] = {
    # Seconds on CPU (tests, the demo).
    "tiny": {
        "batch_size": 64,
        "generated_points": 32,
        "steps": 300,
        "bandwidths": (2.0,),
        "sensitivity": "paper",
        "max_grad_norm": functional_sensitivity(1, "paper"),
        "arch": "table",
        "head": "soft",
        "width": 64,
        "latent_dim": 16,
        "norm": "none",
        "conditional": True,
        "optimizer": "adam",
        "lr": 2e-3,
        "jitter": 1e-8,
        "ema": 0.9,
    },
    # A minute or two on CPU for tables of up to a few hundred thousand rows. The exact
    # add/remove sensitivity √n_L: german-credit LR ROC-AUC 0.715 against 0.649 with the
    # replace-one √(2 n_L) at ε = 10, 0.571 against 0.527 at ε = 1 (three runs each,
    # bench/results/tuning-tables.md).
    "small": {
        "batch_size": 256,
        "generated_points": 32,
        "steps": 2000,
        "bandwidths": (2.0,),
        "sensitivity": "add_remove",
        "max_grad_norm": functional_sensitivity(1, "add_remove"),
        "arch": "table",
        "head": "soft",
        "width": 128,
        "latent_dim": 16,
        "norm": "none",
        "conditional": True,
        "optimizer": "adam",
        "lr": 1e-3,
        "jitter": 1e-8,
        "ema": 0.99,
    },
}
# The sampler's latent scale (`DPKernelGenerator`): 1 samples z ~ N(0, I) as trained.
for _preset in (*PRESETS.values(), *TABLE_PRESETS.values()):
    _preset.setdefault("sample_truncation", 1.0)


# --------------------------------------------------------------------------- the private read


def private_embedding_gradient(
    batch_x: torch.Tensor,
    batch_y: torch.Tensor | None,
    gen_points: torch.Tensor,
    gen_labels: torch.Tensor | None,
    bandwidths: Sequence[float],
    normalizer: float,
) -> torch.Tensor:
    """∇_w f_S(w_j) at the generated points: the ONLY code that reads the private batch.

    f_S(w, y) = (1/B) Σ_{i∈S} [y_i = y] Σ_ℓ exp(−‖x_i − w‖²/(2ℓ²)) with B = `normalizer`, the
    public expected batch size (never the realised size). `batch_x` [b, ...] is flattened to
    vectors; `batch_y` [b] and `gen_labels` [M] are None for unconditional use. b may be 0.
    Returns float64 [M, d], not yet private: it must go through
    `dpsynth.privacy.functional.privatize_embedding_gradient` before anything else sees it.
    """
    w = gen_points.detach().to(torch.float64)
    x = batch_x.reshape(batch_x.shape[0], w.shape[1]).to(device=w.device, dtype=torch.float64)
    sq = (x.pow(2).sum(1)[:, None] + w.pow(2).sum(1)[None, :] - 2.0 * x @ w.T).clamp_min(0.0)
    widths = torch.tensor(list(bandwidths), dtype=torch.float64, device=w.device)
    # ∇_w exp(−‖x − w‖²/(2ℓ²)) = exp(·)·(x − w)/ℓ²
    weight = (
        torch.exp(-sq[None] / (2.0 * widths[:, None, None] ** 2))
        .mul(widths[:, None, None] ** -2)
        .sum(0)
    )  # [b, M]
    if batch_y is not None and gen_labels is not None:
        same = batch_y.to(w.device)[:, None] == gen_labels.to(w.device)[None, :]
        weight = weight * same.to(torch.float64)
    return (weight.T @ x - weight.sum(0)[:, None] * w) / float(normalizer)


# --------------------------------------------------------------------------- public pieces


def generated_kernel_mean(
    points: torch.Tensor, labels: torch.Tensor | None, bandwidths: Sequence[float]
) -> torch.Tensor:
    """(1/M²) Σ_{j,l} k*(w_j, w_l): the MMD² term of the generated points alone (public)."""
    sq = (points.pow(2).sum(1)[:, None] + points.pow(2).sum(1)[None, :]) - 2.0 * points @ points.T
    sq = sq.clamp_min(0.0)
    kernel = sum(torch.exp(-sq / (2.0 * float(bw) ** 2)) for bw in bandwidths)
    if labels is not None:
        kernel = kernel * (labels[:, None] == labels[None, :]).to(points.dtype)
    return kernel.mean()


def weighted_labels(count: int, weights: Sequence[float]) -> torch.Tensor:
    """`count` labels in public proportions `weights` (each class at least once), by class.

    Largest-remainder rounding; used for a table whose target declares public `weights`, so
    that the conditional MMD compares generated and data classes of the same mass (balanced
    labels against a 6% class push that class's generated rows apart).
    """
    k = len(weights)
    spare = count - k
    if spare < 0:
        raise UsageError(f"generated_points must be at least the number of classes ({k})")
    exact = [spare * float(w) for w in weights]
    counts = [1 + math.floor(e) for e in exact]
    order = sorted(range(k), key=lambda c: exact[c] - math.floor(exact[c]), reverse=True)
    for c in order[: count - sum(counts)]:
        counts[c] += 1
    return torch.repeat_interleave(torch.arange(k), torch.tensor(counts))


def balanced_labels(count: int, num_classes: int, offset: int) -> torch.Tensor:
    """`count` labels cycling through the classes from `offset` (public, data-independent)."""
    return (torch.arange(count) + offset) % num_classes


def _norm_layer(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(min(8, channels), channels)
    if kind == "none":
        return nn.Identity()
    raise UsageError(f"norm must be batch, group or none, got {kind!r}")


class VectorGenerator(nn.Module):
    """(latent z, one-hot label) → a record vector of dimension d in [-1, 1].

    `arch="conv"`: the paper's DCGAN decoder (MMD-GAN `CondDecoder`: Linear(nz + K → nz), then
    transposed convolutions from 4×4 doubling to the next power of two ≥ the image side),
    center-cropped to the image and flattened. `arch="mlp"`: two hidden layers, for vectors
    without spatial structure (table rows). Labels enter only when `num_classes > 0`.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        num_classes: int,
        latent_dim: int,
        width: int,
        arch: str = "conv",
        norm: str = "batch",
        layout: Sequence[tuple[str, int]] = (),
        hard_head: bool = False,
        label_input: str = "embed",
    ) -> None:
        super().__init__()
        self.shape = tuple(int(s) for s in shape)
        self.num_classes = num_classes
        self.latent_dim = latent_dim
        self.arch = arch
        self.dim = math.prod(self.shape)
        if arch == "conv":
            if len(self.shape) != 3:
                raise UsageError("arch=conv needs image-shaped records (C, H, W); use arch=mlp")
            if label_input == "layers" and num_classes:
                # The label as K extra input channels of every layer (not only squeezed with z
                # through one Linear into nz values), so each layer can draw a class's shape.
                self.embed = None
                self.body = LabelledConvDecoder(self.shape, latent_dim, num_classes, width, norm)
            elif label_input in ("embed", "layers"):
                self.embed = (
                    nn.Linear(latent_dim + num_classes, latent_dim) if num_classes else None
                )
                self.body = _conv_decoder(self.shape, latent_dim, width, norm)
            else:
                raise UsageError(f"label_input must be embed or layers, got {label_input!r}")
        elif arch == "table":
            if not layout:
                raise UsageError("arch=table needs a table (its schema's column blocks)")
            self.embed = None
            self.body = nn.Sequential(
                nn.Linear(latent_dim + num_classes, width),
                nn.ReLU(),
                nn.Linear(width, width),
                nn.ReLU(),
                nn.Linear(width, self.dim),
                TableHead(layout, hard=hard_head),
            )
        elif arch == "mlp":
            self.embed = None
            self.body = nn.Sequential(
                nn.Linear(latent_dim + num_classes, width),
                nn.ReLU(),
                nn.Linear(width, width),
                nn.ReLU(),
                nn.Linear(width, self.dim),
            )
        else:
            raise UsageError(f"arch must be conv, mlp or table, got {arch!r}")
        self.apply(_init_weights)

    def forward(self, z: torch.Tensor, onehot: torch.Tensor | None) -> torch.Tensor:
        """Vectors [b, d] in [-1, 1]."""
        code = z if onehot is None or not self.num_classes else torch.cat([z, onehot], 1)
        if self.arch == "table":
            return self.body(code)
        if self.arch == "mlp":
            return torch.tanh(self.body(code))
        if isinstance(self.body, LabelledConvDecoder):
            image = self.body(z, onehot)
        else:
            if self.embed is not None:
                code = self.embed(code)
            image = self.body(code[:, :, None, None])
        _, height, width = self.shape
        top = (image.shape[2] - height) // 2
        left = (image.shape[3] - width) // 2
        image = image[:, :, top : top + height, left : left + width]
        return torch.tanh(image).flatten(1)


def _conv_decoder(shape: tuple[int, ...], latent_dim: int, width: int, norm: str) -> nn.Sequential:
    """DCGAN decoder: latent (nz, 1, 1) → 4×4 → … → side (power of two ≥ max(H, W), ≥ 8)."""
    channels_out, height, width_px = shape
    side, upsamples = 8, 1
    while side < max(height, width_px):
        side, upsamples = side * 2, upsamples + 1
    channels = width * 2 ** (upsamples - 1)
    layers: list[nn.Module] = [
        nn.ConvTranspose2d(latent_dim, channels, 4, 1, 0, bias=False),
        _norm_layer(norm, channels),
        nn.ReLU(True),
    ]
    for _ in range(upsamples - 1):
        layers += [
            nn.ConvTranspose2d(channels, channels // 2, 4, 2, 1, bias=False),
            _norm_layer(norm, channels // 2),
            nn.ReLU(True),
        ]
        channels //= 2
    layers.append(nn.ConvTranspose2d(channels, channels_out, 4, 2, 1, bias=False))
    return nn.Sequential(*layers)


class LabelledConvDecoder(nn.Module):
    """The DCGAN decoder of `_conv_decoder` with the one-hot label concatenated, as K constant
    channels, to the input of every transposed convolution (the first takes z ++ label)."""

    def __init__(
        self, shape: tuple[int, ...], latent_dim: int, num_classes: int, width: int, norm: str
    ) -> None:
        super().__init__()
        plain = _conv_decoder(shape, latent_dim, width, norm)
        convs = [m for m in plain if isinstance(m, nn.ConvTranspose2d)]
        self.convs = nn.ModuleList(
            nn.ConvTranspose2d(
                c.in_channels + num_classes, c.out_channels, 4, c.stride, c.padding, bias=False
            )
            for c in convs
        )
        # The norm + ReLU after each convolution but the last.
        self.acts = nn.ModuleList(
            nn.Sequential(_norm_layer(norm, c.out_channels), nn.ReLU(True)) for c in convs[:-1]
        )

    def forward(self, z: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """Images [b, C, side, side] before the crop and tanh."""
        h = z[:, :, None, None]
        label = onehot[:, :, None, None]
        for index, conv in enumerate(self.convs):
            h = conv(torch.cat([h, label.expand(-1, -1, h.shape[2], h.shape[3])], 1))
            if index < len(self.acts):
                h = self.acts[index](h)
        return h


def _init_weights(module: nn.Module) -> None:
    """The paper's init: conv N(0, 0.02); norm γ N(1, 0.02), β 0; linear N(0, 0.1), b 0."""
    if isinstance(module, (nn.ConvTranspose2d, nn.Conv2d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, 0.0, 0.1)
        nn.init.zeros_(module.bias)


def _build_network(info: DataInfo, config: Mapping[str, Any]) -> VectorGenerator:
    num_classes = len(info.classes) if config["conditional"] else 0
    layout = block_layout(info) if info.modality == "table" else ()
    return VectorGenerator(
        shape=tuple(info.shape),
        num_classes=num_classes,
        latent_dim=int(config["latent_dim"]),
        width=int(config["width"]),
        arch=str(config["arch"]),
        norm=str(config["norm"]),
        layout=layout,
        hard_head=config.get("head", "soft") == "hard",
        label_input=str(config.get("label_input", "embed")),
    )


def _target_weights(info: DataInfo) -> tuple[float, ...] | None:
    if info.modality != "table" or not info.schema:
        return None
    target = next(c for c in info.schema["columns"] if c["name"] == info.schema["target"])
    weights = target.get("weights")
    return tuple(float(w) for w in weights) if weights else None


def _onehot(labels: torch.Tensor, num_classes: int) -> torch.Tensor | None:
    return F.one_hot(labels, num_classes).float() if num_classes else None


# --------------------------------------------------------------------------- generator


class DPKernelGenerator(Generator):
    """Samples uint8 images [b, C, H, W] from a trained vector generator (no private data).

    `truncation` scales the latent z ~ N(0, I) before the network (the "truncation trick" of
    GAN sampling): below 1 it trades diversity for samples nearer the generator's typical
    output. It is post-processing of the released generator, so it costs no privacy.
    """

    def __init__(
        self,
        net: VectorGenerator,
        classes: tuple[str, ...],
        device: torch.device,
        modality: str = "image",
        truncation: float = 1.0,
    ):
        self.net = net.to(device).eval()
        self.truncation = float(truncation)
        self.modality = modality
        self.classes = tuple(classes)
        self.shape = tuple(net.shape)  # type: ignore[assignment]
        self.device = device

    @torch.no_grad()
    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """Yield uint8 batches for `labels` in order; latents come from `generator`."""
        for start in range(0, int(labels.numel()), batch_size):
            chunk = labels[start : start + batch_size].to(torch.int64)
            z = draw_latent(chunk.numel(), self.net.latent_dim, generator, self.truncation)
            vectors = self.net(
                z.to(self.device),
                _onehot(chunk.to(self.device), self.net.num_classes),
            )
            if self.modality == "table":
                yield vectors.float().cpu()  # encoded rows; the codec decodes them
            else:
                yield to_uint8(vectors.reshape(-1, *self.shape)).cpu()


# --------------------------------------------------------------------------- trainer


class DPKernelTrainer(Trainer):
    """One run's state: generator, optimiser, step count and the secret RNG for all draws."""

    # Functions of the released gradient and of generated points only (see `step`).
    released_stats = ("yy_term", "released_grad_norm")

    def __init__(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> None:
        self.info = info
        self.config = dict(config)
        self.plan = plan
        self.device = torch.device(device)
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
            torch.manual_seed(seed)
            self.net = _build_network(info, config).to(self.device)
        # Latents and the derivative-GP noise: the run's secret stream, never the public seed.
        randomness = randomness if randomness is not None else PrivateRandomness.fresh()
        self.rng = randomness.generator("dpkernel/training")
        self.bandwidths = tuple(float(b) for b in config["bandwidths"])
        self.num_generated = int(config["generated_points"])
        self.num_classes = self.net.num_classes
        # A table's target may declare public class proportions (schema `weights`).
        self.label_weights = _target_weights(info)
        # The public normaliser B = qN; the realised batch size is never used.
        self.normalizer = float(plan.expected_batch_size)
        self.steps_done = 0
        self.optimizer = _make_optimizer(self.net, config)
        # An exponential moving average of the weights (post-processing of the released
        # gradients) averages the functional noise over steps; the sampler uses it.
        self.ema_decay = float(config.get("ema", 0.0))
        self.ema = copy.deepcopy(self.net).requires_grad_(False) if self.ema_decay else None

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One update from a Poisson batch; the batch is only forwarded to the private read."""
        self.net.train()
        if not self.num_classes:
            labels = None
        elif self.label_weights is not None:
            labels = weighted_labels(self.num_generated, self.label_weights)
        else:
            labels = balanced_labels(self.num_generated, self.num_classes, self.steps_done)
        z = torch.randn(
            self.num_generated, self.net.latent_dim, generator=self.rng, device=self.rng.device
        )
        dev_labels = labels.to(self.device) if labels is not None else None
        points = self.net(
            z.to(self.device), _onehot(dev_labels, self.num_classes) if labels is not None else None
        )
        # Data-parallel: this rank's share of the batch (all of it in one process); the
        # embedding gradient is a sum over records, so the shares add up across ranks.
        x, y = shard(x, y)
        batch_labels = y if labels is not None else None
        gradient = private_embedding_gradient(
            x, batch_labels, points, dev_labels, self.bandwidths, self.normalizer
        )
        if self.plan.private:
            released = privatize_embedding_gradient(
                gradient,
                points,
                dev_labels,
                self.bandwidths,
                noise_multiplier=self.plan.noise_multiplier,
                sum_sensitivity=self.plan.max_grad_norm,
                normalizer=self.normalizer,
                generator=self.rng,
                jitter=float(self.config["jitter"]),
                across_ranks=True,
            )
        else:
            released = all_reduce_sum({"gradient": gradient})["gradient"]
        surrogate, yy_term = self._descend(points, dev_labels, released)
        self.steps_done += 1
        self._update_ema()
        # Only public quantities: functions of the released gradient and of generated points.
        return {
            "loss": float(surrogate.detach()),
            "yy_term": float(yy_term.detach()),
            "released_grad_norm": float(released.norm()),
        }

    def warm_start(self, release: CentralImages) -> None:
        """Pretrain the generator on the DP central images before the first DP step.

        `warm_start_steps` MMD steps (the run's kernel, `generated_points` per step, the same
        surrogate as `step`) towards "records" released_mean[y] + `warm_start_jitter`·N(0, I)
        with balanced y: post-processing of the release, no data read. The EMA (if any) is
        reset to the pretrained weights; the DP steps then refine them.
        """
        means = release.means.to(self.device, torch.float32).flatten(1)
        jitter = float(self.config["warm_start_jitter"])
        count = self.num_generated
        for step in range(int(self.config["warm_start_steps"])):
            labels = balanced_labels(count, self.num_classes, step).to(self.device)
            onehot = _onehot(labels, self.num_classes)
            noise = torch.randn(count, means.shape[1], generator=self.rng, device=self.rng.device)
            records = means[labels] + jitter * noise.to(self.device)
            z = torch.randn(count, self.net.latent_dim, generator=self.rng, device=self.rng.device)
            points = self.net(z.to(self.device), onehot)
            target = private_embedding_gradient(
                records, labels, points, labels, self.bandwidths, float(count)
            )
            self._descend(points, labels, target)
        if self.ema is not None:
            self.ema.load_state_dict(self.net.state_dict())

    def _descend(
        self, points: torch.Tensor, labels: torch.Tensor | None, gradient: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimiser step on the MMD surrogate E k(y, y') − (2/M) Σ_j ⟨gradient_j, y_j⟩,
        whose gradient w.r.t. the generated points is the MMD's with the data's mean embedding
        gradient replaced by `gradient` (the released one, or the warm start's target).
        Returns the surrogate and its E k(y, y') term, detached."""
        gradient = gradient.to(points.dtype).detach()
        yy_term = generated_kernel_mean(points, labels, self.bandwidths)
        surrogate = yy_term - (2.0 / self.num_generated) * (gradient * points).sum()
        self.optimizer.zero_grad(set_to_none=True)
        surrogate.backward()
        self.optimizer.step()
        return surrogate.detach(), yy_term.detach()

    @torch.no_grad()
    def _update_ema(self) -> None:
        """EMA of the parameters, warm-up decay ≤ (1 + t)/(10 + t); buffers are copied."""
        if self.ema is None:
            return
        decay = min(self.ema_decay, (1.0 + self.steps_done) / (10.0 + self.steps_done))
        for average, current in zip(self.ema.parameters(), self.net.parameters(), strict=True):
            average.mul_(decay).add_(current.detach(), alpha=1.0 - decay)
        for average, current in zip(self.ema.buffers(), self.net.buffers(), strict=True):
            average.copy_(current)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Generator weights and buffers (and their EMA), optimiser state, step count (no
        secret RNG state)."""
        out = {f"generator.{k}": v.detach().cpu().clone() for k, v in self.net.state_dict().items()}
        if self.ema is not None:
            for key, value in self.ema.state_dict().items():
                out[f"ema.{key}"] = value.detach().cpu().clone()
        for index, state in self.optimizer.state_dict()["state"].items():
            for key, value in state.items():
                tensor = value if torch.is_tensor(value) else torch.tensor(value)
                out[f"optimizer.{index}.{key}"] = tensor.detach().cpu().clone()
        out["trainer.steps_done"] = torch.tensor(self.steps_done, dtype=torch.int64)
        return out

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` returned, so a resumed run continues exactly."""
        self.net.load_state_dict(_generator_weights(tensors))
        if self.ema is not None:
            self.ema.load_state_dict(_generator_weights(tensors, "ema."))
        state: dict[int, dict[str, torch.Tensor]] = {}
        for name, value in tensors.items():
            if name.startswith("optimizer."):
                _, index, key = name.split(".", 2)
                state.setdefault(int(index), {})[key] = value.to(
                    self.device if key != "step" else "cpu"
                )
        groups = self.optimizer.state_dict()["param_groups"]
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        self.steps_done = int(tensors["trainer.steps_done"])

    def generator(self) -> Generator:
        """A sampler over a copy of the current weights (their EMA when the config has one)."""
        net = _build_network(self.info, self.config)
        net.load_state_dict((self.ema if self.ema is not None else self.net).state_dict())
        return DPKernelGenerator(
            net, self.info.classes, self.device, self.info.modality, sample_truncation(self.config)
        )


def _make_optimizer(net: nn.Module, config: Mapping[str, Any]) -> torch.optim.Optimizer:
    name, lr = str(config["optimizer"]), float(config["lr"])
    if name == "rmsprop":
        return torch.optim.RMSprop(net.parameters(), lr=lr)
    if name == "adam":
        return torch.optim.Adam(net.parameters(), lr=lr, betas=(0.5, 0.999))
    raise UsageError(f"optimizer must be rmsprop or adam, got {name!r}")


def _generator_weights(
    tensors: Mapping[str, torch.Tensor], prefix: str = "generator."
) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


# --------------------------------------------------------------------------- method


class DPKernelMethod(Method):
    """`--method dpkernel`: DP-MMD generator on derivative-GP-privatised embedding gradients."""

    name = "dpkernel"
    presets = PRESETS
    table_presets = TABLE_PRESETS
    modalities = ("image", "table")
    # `dpsynth audit` runs the functional mechanism (privacy/functional.py), not DP-SGD.
    audit_mechanism = "functional"
    description = (
        "DP-Kernel (functional Gaussian mechanism on the kernel mean embedding), sound variant: "
        "releases the derivative-GP-noised gradient field at generated points"
    )

    def recommended_preset(self, info: DataInfo, epsilon: float) -> str:
        """`small` for tables; `small-eps1` for small images (8×8 digits) at every ε; for
        28×28-sized ones (≥ 400 values a record) `mnist`, or `mnist-eps1` at ε ≤ 3.

        The bandwidths of each were fixed for its pixel count, so the shape picks the preset.
        On 28×28 the split at ε = 3 is where the tuning logs saw the wider kernel pull ahead;
        on digits the single kernel (ℓ = 6) of `small-eps1` was ahead at ε = 10 too, in every
        run measured (0.870–0.873 against 0.839–0.855 for `small`, README Leaderboard).
        """
        if info.modality == "table":
            return "small"
        if math.prod(info.shape) < _LARGE_IMAGE_VALUES:
            return "small-eps1"
        return "mnist-eps1" if epsilon <= _SMALL_EPSILON else "mnist"

    def config(self, preset: str, overrides: Mapping[str, Any], info: DataInfo) -> dict[str, Any]:
        """Preset plus overrides, validated; `max_grad_norm` is derived from the kernel.

        `max_grad_norm` is the RKHS sensitivity of the unnormalised embedding sum (√(2 n_L) or
        √n_L), so it cannot be overridden: a smaller value would under-noise.
        """
        if "max_grad_norm" in overrides:
            raise UsageError(
                "max_grad_norm is derived from the kernel for --method dpkernel; "
                "set bandwidths or sensitivity instead"
            )
        merged = super().config(preset, overrides, info)
        # image presets only (tables have no central images)
        warm_keys = ("warm_start_steps", "warm_start_jitter")
        if "warm_start_share" in merged and min(float(merged[k]) for k in warm_keys) < 0:
            raise UsageError("warm_start_steps and warm_start_jitter must be at least 0")
        merged["bandwidths"] = [float(b) for b in merged["bandwidths"]]
        if not merged["bandwidths"] or min(merged["bandwidths"]) <= 0:
            raise UsageError("bandwidths must be positive numbers")
        if merged["sensitivity"] not in SENSITIVITY_CHOICES:
            raise UsageError(f"sensitivity must be one of {', '.join(SENSITIVITY_CHOICES)}")
        for key in ("batch_size", "generated_points", "steps", "latent_dim", "width"):
            if int(merged[key]) < 1:
                raise UsageError(f"{key} must be at least 1")
        if merged["jitter"] <= 0:
            raise UsageError("jitter must be positive")
        if not 0.0 <= float(merged["ema"]) < 1.0:
            raise UsageError("ema must be in [0, 1) (0: no weight averaging)")
        merged["max_grad_norm"] = functional_sensitivity(
            len(merged["bandwidths"]), merged["sensitivity"]
        )
        return merged

    def validate_config(self, config: Mapping[str, Any], info: DataInfo) -> None:
        """The shared checks plus DP-Kernel's choices (before any budget is reserved)."""
        super().validate_config(config, info)
        weights = _target_weights(info)
        if weights is not None and int(config["generated_points"]) < len(weights):
            raise UsageError(
                f"--set generated_points: at least one per class ({len(weights)}) with the "
                "target's weights"
            )
        if (info.modality == "table") != (config["arch"] == "table"):
            raise UsageError(
                "--set arch: tables need arch=table, images conv or mlp "
                f"(got {config['arch']!r} for {info.modality} data)"
            )
        choices = {
            "arch": ("conv", "mlp", "table"),
            "norm": ("batch", "group", "none"),
            "head": ("soft", "hard"),
            "optimizer": ("rmsprop", "adam"),
            "label_input": ("embed", "layers"),
        }
        for key, allowed in choices.items():
            if key in config and config[key] not in allowed:
                raise UsageError(f"--set {key}={config[key]!r}: choose from {', '.join(allowed)}")

    def plan(
        self,
        info: DataInfo,
        target: PrivacyTarget,
        config: Mapping[str, Any],
        prior_events: tuple[dict[str, Any], ...] = (),
    ) -> PrivacyPlan:
        """One `poisson_gaussian` event (σ, q = B/N, T): the σ the trainer's GP noise uses."""
        expected = functional_sensitivity(len(config["bandwidths"]), config["sensitivity"])
        if not math.isclose(float(config["max_grad_norm"]), expected):
            raise UsageError("max_grad_norm does not match the kernel's sensitivity")
        return super().plan(info, target, config, prior_events)

    def trainer(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> DPKernelTrainer:
        """A fresh trainer; weights from `seed`, never from the data; draws from `randomness`."""
        return DPKernelTrainer(info, config, plan, device, seed, randomness)

    def generator_from_state(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        device: torch.device,
    ) -> DPKernelGenerator:
        """The sampler from saved `ema.*` tensors (if the run kept an EMA), else `generator.*`."""
        net = _build_network(info, config)
        prefix = "ema." if any(k.startswith("ema.") for k in tensors) else "generator."
        net.load_state_dict(_generator_weights(tensors, prefix))
        return DPKernelGenerator(
            net, info.classes, torch.device(device), info.modality, sample_truncation(config)
        )
