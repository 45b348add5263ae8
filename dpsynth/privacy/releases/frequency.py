"""A DP low-frequency model of the images: per-class means and second moments of a fixed public
transform's low band, released once; a class-conditional Gaussian in that band is its
post-processing. An easier first target than the pixels (FETA-Pro's frequency features).

Features. Every record x ∈ [-1, 1]^{C×H×W} is shifted by the public background value (+1, so a
blank image is 0) and mapped by the orthonormal 2-D DCT-II of each channel, of which the B×B
lowest frequencies are kept: f = P(x + 1) ∈ R^d, d = C·B². f is clipped to L2 norm C_f:
f̄ = f · min(1, C_f/‖f‖). For the K public classes the release is the vector

    v = [ S_1/C_f, …, S_K/C_f,  U(M)/C_f²,  w·n_1, …, w·n_K ],   S_k = Σ_{y_i=k} f̄_i,

where M is the pooled second moment Σ_i f̄_i f̄_iᵀ (`covariance=pooled`) or one per class
M_k = Σ_{y_i=k} f̄_i f̄_iᵀ (`covariance=class`), and U(·) keeps the upper triangle with the
diagonal (the matrix is symmetric), plus N(0, s²) on every coordinate.

Sensitivity (add/remove one record): one S_k/C_f moves by f̄/C_f, of norm ≤ 1; the moments by
U(f̄f̄ᵀ)/C_f², of norm ≤ ‖f̄f̄ᵀ‖_F/C_f² = ‖f̄‖²/C_f² ≤ 1; one count by w. So Δ = √(2 + w²) and
s = σ·Δ makes the release one Gaussian mechanism of noise multiplier σ (a ledger `gaussian`
event, count 1, annotated `mechanism: frequency_model`). Everything after the noise (means
S_k/n_k, covariances M/n − μμᵀ projected onto the PSD cone, samples) is post-processing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.calibration import gaussian_sigma_for_share
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import (
    AnyEvent,
    DpEvent,
    events_from_json,
    gaussian_release,
)
from dpsynth.privacy.accounting.plan import PrivacyPlan, PrivacyTarget
from dpsynth.privacy.accounting.plan_check import FREQUENCY_MODEL_MECHANISM as MECHANISM
from dpsynth.privacy.mechanisms.aggregation import renorm_rows

COVARIANCES = ("pooled", "class")
# The covariance post-processing (`model_from_release`).
DENOISERS = ("clip", "spiked", "spiked-pooled")
# The background value of images in [-1, 1] (public): features are of x + 1.
_SHIFT = 1.0


@dataclass(frozen=True)
class FrequencyPlan:
    """The public parameters of one frequency-model release (σ = 0: exact, not private)."""

    noise_multiplier: float
    band: int
    clip_norm: float
    count_weight: float
    covariance: str

    def __post_init__(self) -> None:
        if self.band < 1:
            raise UsageError(f"--set frequency_band: must be at least 1, got {self.band}")
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise UsageError(f"--set frequency_clip: must be positive, got {self.clip_norm}")
        if not (math.isfinite(self.count_weight) and self.count_weight > 0):
            raise UsageError(f"frequency count weight must be positive, got {self.count_weight}")
        if self.covariance not in COVARIANCES:
            raise UsageError(f"--set frequency_covariance: one of {', '.join(COVARIANCES)}")

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the released vector (sums/C_f, moments/C_f², w · counts)."""
        return math.sqrt(2.0 + self.count_weight**2)

    @property
    def noise_std(self) -> float:
        """The std of the Gaussian noise on each coordinate of the released vector."""
        return self.noise_multiplier * self.sensitivity

    def event(self) -> DpEvent:
        """The event: one Gaussian mechanism, annotated with the release's parameters."""
        return gaussian_release(
            self.noise_multiplier,
            mechanism=MECHANISM,
            band=int(self.band),
            clip_norm=float(self.clip_norm),
            count_weight=float(self.count_weight),
            covariance=self.covariance,
        )

    @classmethod
    def from_event(cls, event: DpEvent) -> FrequencyPlan:
        """Inverse of `event`."""
        stored = event.to_json()
        sigma = float(stored["noise_multiplier"]) if stored["type"] == "gaussian" else 0.0
        return cls(
            sigma,
            int(stored["band"]),
            float(stored["clip_norm"]),
            float(stored["count_weight"]),
            str(stored["covariance"]),
        )


def frequency_plan_in(events: Sequence[DpEvent]) -> FrequencyPlan | None:
    """The frequency-model release among a plan's events (None if it has none)."""
    for event in events:
        if event.annotation("mechanism") == MECHANISM:
            return FrequencyPlan.from_event(event)
    return None


def dct_matrix(n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The orthonormal DCT-II matrix D [n, n] (rows are frequencies; D Dᵀ = I)."""
    k = torch.arange(n, dtype=dtype)[:, None]
    i = torch.arange(n, dtype=dtype)[None, :]
    matrix = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    matrix[0] /= math.sqrt(2.0)
    return matrix


def band_features(x: torch.Tensor, band: int) -> torch.Tensor:
    """f = P(x + 1): the B×B lowest 2-D DCT frequencies of each channel of x [N, C, H, W]
    in [-1, 1], flattened to [N, C·B'²] (B' = min(B, H, W)), float64."""
    _, _, height, width = x.shape
    rows, cols = min(band, height), min(band, width)
    dh, dw = dct_matrix(height)[:rows], dct_matrix(width)[:cols]
    shifted = x.to(torch.float64) + _SHIFT
    coefficients = dh.to(x.device) @ shifted @ dw.to(x.device).T  # [N, C, rows, cols]
    return coefficients.flatten(1)


def band_images(features: torch.Tensor, shape: Sequence[int], band: int) -> torch.Tensor:
    """Inverse of `band_features` with the other frequencies at 0: images [N, C, H, W] in
    [-1, 1] (clamped)."""
    channels, height, width = (int(s) for s in shape)
    rows, cols = min(band, height), min(band, width)
    dh, dw = dct_matrix(height)[:rows], dct_matrix(width)[:cols]
    coefficients = features.to(torch.float64).reshape(-1, channels, rows, cols)
    images = dh.T.to(features.device) @ coefficients @ dw.to(features.device)
    return (images - _SHIFT).clamp(-1.0, 1.0)


def _upper(d: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.triu_indices(d, d, device=device).unbind(0)


def frequency_statistics(
    x: torch.Tensor, y: torch.Tensor, num_classes: int, plan: FrequencyPlan
) -> torch.Tensor:
    """The exact vector the mechanism noises (float64): class sums of the clipped features over
    C_f, the upper triangle(s) of their second moment(s) over C_f², then w · the class counts.

    Records with a label outside 0..K−1 count nowhere.
    """
    features = renorm_rows(band_features(x, plan.band), plan.clip_norm) / plan.clip_norm
    y = y.to(torch.int64)
    inside = (y >= 0) & (y < num_classes)
    features, y = features[inside], y[inside]
    d = features.shape[1]
    sums = torch.zeros(num_classes, d, dtype=torch.float64, device=features.device)
    sums.index_add_(0, y, features)
    rows, cols = _upper(d, features.device)
    if plan.covariance == "pooled":
        moments = (features.T @ features)[rows, cols]
    else:
        moments = torch.stack(
            [(features[y == k].T @ features[y == k])[rows, cols] for k in range(num_classes)]
        ).flatten()
    counts = torch.bincount(y, minlength=num_classes).to(torch.float64)
    return torch.cat([sums.flatten(), moments, plan.count_weight * counts])


@dataclass(frozen=True)
class FrequencyModel:
    """The released model: class means [K, d] and covariances [K, d, d] (PSD) of the band
    features, the noisy class counts [K], and the image shape and band (all public)."""

    means: torch.Tensor
    covariances: torch.Tensor
    counts: torch.Tensor
    shape: tuple[int, int, int]
    band: int

    def mean_images(self) -> torch.Tensor:
        """The class means as images [K, C, H, W] in [-1, 1]."""
        return band_images(self.means, self.shape, self.band).to(torch.float32)

    @property
    def dim(self) -> int:
        """d: the number of band features (the dimension of the Gaussians)."""
        return int(self.means.shape[1])

    def sample(
        self, labels: torch.Tensor, generator: torch.Generator, scale: float = 1.0
    ) -> torch.Tensor:
        """Images [n, C, H, W] in [-1, 1] (float32, on the generator's device) drawn from
        the class-conditional Gaussians, the deviations scaled by `scale`."""
        device = generator.device
        z = torch.randn(len(labels), self.dim, generator=generator, device=device)
        return self.images_at(labels.to(device), scale * z)

    def images_at(self, labels: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The images of standard-normal coordinates z [n, d] (the map a sample applies):
        band_images(μ_y + Σ_y^{1/2} z), float32 on z's device."""
        device = z.device
        roots = _psd_roots(self.covariances).to(device)
        deviations = torch.einsum("nij,nj->ni", roots[labels.to(device)], z.to(torch.float64))
        features = self.means.to(device)[labels.to(device)] + deviations
        return band_images(features, self.shape, self.band).to(torch.float32)

    def tensors(self, prefix: str = "frequency.") -> dict[str, torch.Tensor]:
        """The model as named tensors (public: a DP release), for a checkpoint."""
        return {
            f"{prefix}means": self.means,
            f"{prefix}covariances": self.covariances,
            f"{prefix}counts": self.counts,
            f"{prefix}shape": torch.tensor(self.shape, dtype=torch.int64),
            f"{prefix}band": torch.tensor(self.band, dtype=torch.int64),
        }

    @classmethod
    def from_tensors(
        cls, tensors: Mapping[str, torch.Tensor], prefix: str = "frequency."
    ) -> FrequencyModel | None:
        """Inverse of `tensors` (None when they hold no model)."""
        if f"{prefix}means" not in tensors:
            return None
        return cls(
            tensors[f"{prefix}means"].to(torch.float64),
            tensors[f"{prefix}covariances"].to(torch.float64),
            tensors[f"{prefix}counts"],
            tuple(int(v) for v in tensors[f"{prefix}shape"].tolist()),  # type: ignore[arg-type]
            int(tensors[f"{prefix}band"]),
        )


def _psd_roots(covariances: torch.Tensor) -> torch.Tensor:
    """Symmetric square roots of PSD matrices [K, d, d]."""
    values, vectors = torch.linalg.eigh(covariances)
    return vectors @ torch.diag_embed(values.clamp_min(0).sqrt()) @ vectors.transpose(1, 2)


def check_denoise(denoise: str) -> None:
    """UsageError unless `denoise` names a covariance post-processing (`DENOISERS`)."""
    if denoise not in DENOISERS:
        raise UsageError(f"--set frequency_denoise: one of {', '.join(DENOISERS)}, got {denoise!r}")


def spiked_eigenvalues(values: torch.Tensor, entry_std: torch.Tensor, d: int) -> torch.Tensor:
    """The covariance eigenvalues under symmetric noise of std `entry_std` a entry (one per
    matrix, [K]): those inside the noise's spectrum (below its edge 2s√d) are set to 0, and
    each one above is replaced by the θ of a spike that noise would push to it, the root
    θ ≥ s√d of λ = θ + s²d/θ (the spiked Wigner model's eigenvalue shift). Post-processing:
    s comes from the plan's public noise and the released counts."""
    s = entry_std.to(values.dtype)[:, None]
    edge = 2.0 * s * math.sqrt(d)
    root = (values.pow(2) - edge.pow(2)).clamp_min(0.0).sqrt()
    return torch.where(values > edge, 0.5 * (values + root), torch.zeros_like(values))


def model_from_release(
    released: torch.Tensor,
    num_classes: int,
    shape: Sequence[int],
    plan: FrequencyPlan,
    denoise: str = "clip",
) -> FrequencyModel:
    """Post-processing of the noisy vector: means, PSD covariances, counts (floored at 1).

    `denoise`: `clip` sets the noisy estimate's negative eigenvalues to 0; `spiked` also drops
    the eigenvalues the release's noise alone would produce and debiases those above them
    (`spiked_eigenvalues`), so that samples vary along the data's directions, not the
    noise's. `spiked-pooled` (per-class covariances) keeps each class's own spikes and fills
    the rest of the space from the pooled within-class covariance, derived from the same
    class moments (K times less noise a entry) and denoised the same way
    (`_with_pooled_bulk`): a small class keeps the variation all classes share (slant,
    thickness) instead of collapsing onto its mean."""
    check_denoise(denoise)
    channels, height, width = (int(s) for s in shape)
    d = channels * min(plan.band, height) * min(plan.band, width)
    k = num_classes
    sums = released[: k * d].reshape(k, d) * plan.clip_norm
    pairs = d * (d + 1) // 2
    blocks = 1 if plan.covariance == "pooled" else k
    moment_part = released[k * d : k * d + blocks * pairs].reshape(blocks, pairs)
    counts = released[k * d + blocks * pairs :] / plan.count_weight
    safe = counts.clamp_min(1.0)
    means = sums / safe[:, None]
    rows, cols = _upper(d, released.device)
    moments = torch.zeros(blocks, d, d, dtype=torch.float64, device=released.device)
    moments[:, rows, cols] = moment_part * plan.clip_norm**2
    moments = moments + moments.transpose(1, 2) - torch.diag_embed(moments.diagonal(0, 1, 2))
    if plan.covariance == "pooled":
        total = safe.sum()
        weights = safe / total
        between = torch.einsum("k,ki,kj->ij", weights, means, means)
        covariances = (moments[0] / total - between).expand(k, d, d).clone()
    else:
        covariances = moments / safe[:, None, None] - torch.einsum("ki,kj->kij", means, means)
    # The noise std of a second moment is the vector's, times C²; the moments are divided by
    # the class count (the total for the pooled one).
    moment_std = plan.noise_std * plan.clip_norm**2
    if denoise == "spiked-pooled" and plan.covariance == "class":
        covariances = _with_pooled_bulk(covariances, safe, moment_std, d)
    else:
        values, vectors = torch.linalg.eigh(covariances)
        if denoise != "clip":
            divisor = safe.sum().expand(k) if plan.covariance == "pooled" else safe
            values = spiked_eigenvalues(values, moment_std / divisor, d)
        covariances = vectors @ torch.diag_embed(values.clamp_min(0)) @ vectors.transpose(1, 2)
    return FrequencyModel(means, covariances, counts, (channels, height, width), plan.band)


def _with_pooled_bulk(
    covariances: torch.Tensor, counts: torch.Tensor, moment_std: float, d: int
) -> torch.Tensor:
    """Per-class noisy covariances [K, d, d] → each class's spikes V_k Θ_k V_kᵀ plus the
    denoised pooled covariance P restricted to the rest: (I − V_k V_kᵀ) P (I − V_k V_kᵀ).

    P = Σ_k n_k C_k / N is a post-processing of the same release; its noise a entry is
    √(Σ_k (n_k/N)² (s/n_k)²) = s√K / N, K times below a class's s/n_k at equal counts."""
    k = covariances.shape[0]
    total = counts.sum()
    pooled = torch.einsum("k,kij->ij", counts / total, covariances)
    pooled_values, pooled_vectors = torch.linalg.eigh(pooled)
    pooled_std = (moment_std * math.sqrt(k) / total).reshape(1)
    pooled_values = spiked_eigenvalues(pooled_values[None], pooled_std, d)[0]
    pooled = pooled_vectors @ torch.diag(pooled_values) @ pooled_vectors.T
    values, vectors = torch.linalg.eigh(covariances)
    values = spiked_eigenvalues(values, moment_std / counts, d)
    kept = (values > 0).to(values.dtype)  # the class's own spikes
    own = vectors @ torch.diag_embed(values) @ vectors.transpose(1, 2)
    span = vectors @ torch.diag_embed(kept) @ vectors.transpose(1, 2)
    rest = torch.eye(d, dtype=covariances.dtype, device=covariances.device) - span
    return own + rest @ pooled @ rest


def release_frequency_model(
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    plan: FrequencyPlan,
    generator: torch.Generator,
    denoise: str = "clip",
) -> FrequencyModel:
    """The DP release of the frequency model of x [N, C, H, W] (in [-1, 1]) by labels y [N].

    The ONLY code that reads the records for this release; the noise comes from the run's
    secret `generator` (σ = 0: exact, for non-private runs). The rest is post-processing
    (`denoise`: see `model_from_release`).
    """
    stats = frequency_statistics(x, y, num_classes, plan)
    noise = torch.randn(
        stats.shape, generator=generator, dtype=torch.float64, device=generator.device
    )
    released = stats + plan.noise_std * noise.to(stats.device)
    return model_from_release(released.cpu(), num_classes, x.shape[1:], plan, denoise)


def plan_with_frequency(
    target: PrivacyTarget,
    release: FrequencyPlan,
    share: float,
    plan_rest: Callable[[tuple[DpEvent, ...]], PrivacyPlan],
    prior_events: Sequence[AnyEvent] = (),
) -> PrivacyPlan:
    """A run's plan with the frequency-model release in front of the rest.

    The release's σ is the Gaussian's at `share` of the ε left after `prior_events` (the
    `noise_multiplier` of `release` is replaced); `plan_rest(prior)` is calibrated with its
    event among the prior events, so prior + release + the rest compose (PRV) to at most
    `target.epsilon`. ε = inf: the exact release (σ = 0) in front of a non-private plan.
    """
    if not 0.0 < share < 1.0:
        raise UsageError(f"--set frequency_share: must be in (0, 1), got {share}")
    prior = events_from_json(prior_events)
    if not target.private:
        exact = replace(release, noise_multiplier=0.0)
        rest = plan_rest(prior)
        return replace(rest, events=(exact.event(), *rest.events))
    sigma = gaussian_sigma_for_share(target.epsilon, target.delta, share, prior)
    planned = replace(release, noise_multiplier=sigma)
    rest = plan_rest((*prior, planned.event()))
    events = (planned.event(), *rest.events)
    alone = compose_epsilon(list(events), target.delta)
    note = (
        f"frequency model: class means and {planned.covariance} second moments of the "
        f"{planned.band}×{planned.band} lowest DCT frequencies (clip {planned.clip_norm:g}), one "
        f"Gaussian release at σ = {sigma:.4g} (noise std {planned.noise_std:.4g}), composed "
        "with the rest of the run"
    )
    return replace(rest, events=events, epsilon_bound=alone.epsilon, notes=(note, *rest.notes))
