"""Downstream accuracy: classifiers trained on one set, tested once on the real test split."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsynth.data.sources import load_data
from dpsynth.errors import DataError, UsageError
from dpsynth.evaluation import downstream, folders

CLASSES = tuple(str(d) for d in range(10))


def _split(spec: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = load_data(spec)
    return data.x, data.y


@pytest.mark.slow
def test_real_train_images_give_high_accuracy_on_mnist5k_test() -> None:
    train, test = _split("mnist-5k"), _split("mnist-5k:test")
    logreg = downstream.accuracy_over_seeds(train, test, CLASSES, classifier="logreg")
    assert logreg["mean"] >= 0.85
    assert logreg["seeds"] == 1 and logreg["std"] == 0.0  # lbfgs is deterministic: fitted once
    cnn = downstream.accuracy_over_seeds(
        train, test, CLASSES, classifier="cnn", seeds=1, schedule=downstream.CnnSchedule(epochs=2)
    )
    assert cnn["mean"] >= 0.9
    assert cnn["n_train"] == 4000 and cnn["n_test"] == 1000


def test_mean_std_over_seeds_and_per_class_consistency() -> None:
    train, test = _split("digits"), _split("digits:test")
    result = downstream.accuracy_over_seeds(
        train, test, CLASSES, classifier="cnn", seeds=2, schedule=downstream.CnnSchedule(epochs=2)
    )
    assert len(result["per_seed"]) == 2
    assert result["mean"] == pytest.approx(np.mean(result["per_seed"]))
    assert result["std"] == pytest.approx(np.std(result["per_seed"], ddof=1))
    # overall accuracy = per-class accuracies weighted by the test class counts
    counts = torch.bincount(test[1], minlength=10).numpy()
    weighted = sum(result["per_class"][c] * counts[i] for i, c in enumerate(CLASSES))
    assert weighted / counts.sum() == pytest.approx(result["mean"], abs=1e-9)


def test_a_class_absent_from_training_scores_zero_on_that_class() -> None:
    x, y = _split("digits")
    keep = y != 3
    result = downstream.accuracy_over_seeds(
        (x[keep], y[keep]), _split("digits:test"), CLASSES, classifier="logreg"
    )
    assert result["per_class"]["3"] == 0.0
    assert result["per_class"]["0"] > 0.8


def test_classifier_and_seed_validation() -> None:
    data = _split("digits")
    with pytest.raises(UsageError):
        downstream.accuracy_over_seeds(data, data, CLASSES, classifier="svm")
    with pytest.raises(UsageError):
        downstream.accuracy_over_seeds(data, data, CLASSES, seeds=0)


def test_synthetic_labels_are_mapped_to_real_classes_by_name() -> None:
    y = torch.tensor([0, 1, 1, 0])
    mapped = folders.map_labels_by_name(y, ("3", "7"), CLASSES)
    assert mapped.tolist() == [3, 7, 7, 3]
    with pytest.raises(DataError, match="cat"):
        folders.map_labels_by_name(y, ("3", "cat"), CLASSES)


def test_match_shape_converts_channels_and_size() -> None:
    rgb = torch.full((2, 3, 16, 16), 200, dtype=torch.uint8)
    gray = folders.match_shape(rgb, (1, 8, 8))
    assert gray.shape == (2, 1, 8, 8) and torch.all(gray == 200)
    back = folders.match_shape(gray, (3, 8, 8))
    assert back.shape == (2, 3, 8, 8) and torch.all(back == 200)
