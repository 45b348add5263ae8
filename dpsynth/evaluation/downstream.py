"""Downstream accuracy: train a classifier on synthetic images only, test it on real held-out data.

The reported accuracy is the FINAL model's, after a fixed schedule: no epoch or
hyper-parameter is ever picked on the test split. `cnn` is a small 2-conv network trained
with Adam; `logreg` is scikit-learn's logistic regression on pixels scaled to [0, 1].
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dpsynth.errors import UsageError

CLASSIFIERS = ("cnn", "logreg")
LOGREG_MAX_ITER = 300

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class CnnSchedule:
    """The fixed training schedule of the `cnn` classifier."""

    epochs: int = 5
    batch_size: int = 128
    learning_rate: float = 1e-3


class SmallCNN(nn.Module):
    """Two 3x3 conv blocks (GroupNorm, ReLU, 2x2 max-pool), then a 128-unit hidden layer."""

    def __init__(self, in_channels: int, n_classes: int, height: int, width: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1),
            nn.GroupNorm(4, 16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.GroupNorm(8, 32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = 32 * (height // 4) * (width // 4)
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(flat, 128), nn.ReLU(), nn.Linear(128, n_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [N, n_classes] of images scaled to [-1, 1]."""
        return self.head(self.features(x))


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x.float().div(127.5).sub(1.0)


def train_cnn(
    x: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    *,
    seed: int,
    schedule: CnnSchedule = CnnSchedule(),
    device: torch.device | str = "cpu",
) -> SmallCNN:
    """Train SmallCNN on uint8 images [N, C, H, W] for the fixed schedule; the final model."""
    generator = torch.Generator().manual_seed(seed)
    _, channels, height, width = x.shape
    with torch.random.fork_rng(devices=[]):  # seeded initialisation without touching global RNG
        torch.manual_seed(seed)
        model = SmallCNN(channels, n_classes, height, width).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=schedule.learning_rate)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(schedule.epochs):
        order = torch.randperm(len(y), generator=generator, device=generator.device)
        for start in range(0, len(y), schedule.batch_size):
            idx = order[start : start + schedule.batch_size]
            xb, yb = _scaled(x[idx]).to(device), y[idx].to(device)
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(xb), yb).backward()
            optimizer.step()
    return model.eval()


def predict_cnn(
    model: nn.Module, x: torch.Tensor, device: torch.device | str = "cpu", batch_size: int = 1024
) -> np.ndarray:
    """Predicted labels of uint8 images, batched under inference mode."""
    out = []
    with torch.inference_mode():
        for start in range(0, len(x), batch_size):
            logits = model(_scaled(x[start : start + batch_size]).to(device))
            out.append(logits.argmax(dim=1).cpu())
    return torch.cat(out).numpy()


def fit_predict_logreg(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor,
    *,
    max_iter: int = LOGREG_MAX_ITER,
) -> np.ndarray:
    """Logistic regression on flattened pixels in [0, 1]; predicted labels of x_test."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    flat_train = x_train.reshape(len(x_train), -1).float().div(255.0).numpy()
    flat_test = x_test.reshape(len(x_test), -1).float().div(255.0).numpy()
    model = LogisticRegression(max_iter=max_iter)
    with warnings.catch_warnings():
        # A fixed iteration budget is the schedule; not converging fully is expected.
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(flat_train, y_train.numpy())
    return model.predict(flat_test)


def per_class_accuracy(
    predicted: np.ndarray, truth: np.ndarray, n_classes: int
) -> list[float | None]:
    """Accuracy on the test records of each class (None for a class with no test records)."""
    out: list[float | None] = []
    for c in range(n_classes):
        mask = truth == c
        out.append(float((predicted[mask] == c).mean()) if mask.any() else None)
    return out


def accuracy_over_seeds(
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    classes: tuple[str, ...],
    *,
    classifier: str = "cnn",
    seeds: int = 3,
    schedule: CnnSchedule = CnnSchedule(),
    device: torch.device | str = "cpu",
    progress: Progress | None = None,
    stage: str = "accuracy",
) -> dict:
    """Train on `train` with each seed, test the final model on `test`; mean, std, per class.

    `std` is the sample standard deviation over seeds (0 for one seed). Logistic regression
    (lbfgs) is deterministic, so it is fitted once whatever `seeds` says.
    Returns a JSON-ready dict.
    """
    if classifier not in CLASSIFIERS:
        raise UsageError(f"--classifier must be one of {', '.join(CLASSIFIERS)}, not {classifier}")
    if seeds < 1:
        raise UsageError("--seeds must be at least 1")
    x_train, y_train = train
    x_test, y_test = test
    if len(torch.unique(y_train)) < 2:
        raise UsageError("the synthetic data hold fewer than 2 classes; cannot train a classifier")
    n_classes = len(classes)
    runs = 1 if classifier == "logreg" else seeds
    truth = y_test.numpy()
    per_seed: list[float] = []
    per_class_runs: list[list[float | None]] = []
    for seed in range(runs):
        if classifier == "cnn":
            model = train_cnn(
                x_train, y_train, n_classes, seed=seed, schedule=schedule, device=device
            )
            predicted = predict_cnn(model, x_test, device)
        else:
            predicted = fit_predict_logreg(x_train, y_train, x_test)
        per_seed.append(float((predicted == truth).mean()))
        per_class_runs.append(per_class_accuracy(predicted, truth, n_classes))
        if progress is not None:
            progress(stage, seed + 1, runs)
    mean = float(np.mean(per_seed))
    std = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0
    per_class = {}
    for c, name in enumerate(classes):
        values = [run[c] for run in per_class_runs if run[c] is not None]
        per_class[name] = float(np.mean(values)) if values else None
    result = {
        "classifier": classifier,
        "seeds": runs,
        "mean": mean,
        "std": std,
        "per_seed": per_seed,
        "per_class": per_class,
        "n_train": len(y_train),
        "n_test": len(y_test),
    }
    if classifier == "cnn":
        result["schedule"] = {
            "epochs": schedule.epochs,
            "batch_size": schedule.batch_size,
            "learning_rate": schedule.learning_rate,
            "optimizer": "adam",
        }
    else:
        result["schedule"] = {"max_iter": LOGREG_MAX_ITER, "solver": "lbfgs", "deterministic": True}
    return result
