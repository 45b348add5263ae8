"""Downstream classifiers for tables: logistic regression and gradient boosting trained on
one table's rows and scored (accuracy, ROC-AUC) on another's, over seeds; the frames they read
are the schema's encoding of the rows (categories one-hot, numbers as numbers)."""

from __future__ import annotations

import math
import warnings as python_warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from dpsynth.data.column_values import column_numbers, level_codes
from dpsynth.data.schema import Schema
from dpsynth.data.table_codec import RawTable

CLASSIFIERS = ("logreg", "gbm")


def table_frame(raw: RawTable, schema: Schema) -> tuple[pd.DataFrame, np.ndarray]:
    """Feature frame (strings for categories, floats for numbers) and label indices (−1 when
    the target is not one of the classes)."""
    data = {}
    for column in schema.features:
        if column.is_numeric:
            # NaN for missing cells (imputed by the models); a cell that is not a number or a
            # time of the column's format is a DataError naming it
            data[column.name] = column_numbers(raw, column, lenient=True)
        else:
            # the schema's categories: an unlisted value is its `other` category, as in
            # training, or "?" (unknown) without one; never a raw value the schema hides
            # (a real table scored against a released schema has thousands of those)
            codes = level_codes(raw, column, strict=False)
            data[column.name] = np.asarray((*column.levels, "?"), dtype=object)[codes]
    lookup = {c: i for i, c in enumerate(schema.classes)}
    labels = np.array([lookup.get(v, -1) for v in raw.column(schema.target).tolist()])
    return pd.DataFrame(data), labels


def _model(kind: str, schema: Schema, seed: int) -> Any:
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

    categorical = [c.name for c in schema.features if not c.is_numeric]
    numeric = [c.name for c in schema.features if c.is_numeric]
    if kind == "logreg":
        encode = ColumnTransformer(
            [
                ("cat", OneHotEncoder(handle_unknown="ignore"), categorical),
                (
                    "num",
                    make_pipeline(
                        SimpleImputer(strategy="median", add_indicator=True), StandardScaler()
                    ),
                    numeric,
                ),
            ]
        )
        return make_pipeline(encode, LogisticRegression(max_iter=2000, random_state=seed))
    encode = ColumnTransformer(
        [
            (
                "cat",
                OrdinalEncoder(
                    handle_unknown="use_encoded_value",
                    unknown_value=np.nan,
                    encoded_missing_value=np.nan,
                ),
                categorical,
            ),
            ("num", "passthrough", numeric),
        ]
    )
    wide = [len(c.levels) >= 250 for c in schema.features if not c.is_numeric]
    mask = [not w for w in wide] + [False] * len(numeric)
    return make_pipeline(
        encode,
        HistGradientBoostingClassifier(random_state=seed, categorical_features=mask),
    )


def _scores(model: Any, x: pd.DataFrame, y: np.ndarray, classes: int, metrics: list[str]) -> dict:
    from sklearn.metrics import accuracy_score, roc_auc_score

    out: dict[str, float] = {}
    fitted = list(model.classes_)
    proba = np.zeros((len(x), classes))
    proba[:, fitted] = model.predict_proba(x)
    if "accuracy" in metrics:
        out["accuracy"] = float(accuracy_score(y, proba.argmax(1)))
    if "roc_auc" in metrics:
        if len(np.unique(y)) < 2:
            out["roc_auc"] = math.nan
        elif classes == 2:
            out["roc_auc"] = float(roc_auc_score(y, proba[:, 1]))
        else:
            present = np.unique(y)
            sub = proba[:, present]
            sub = sub / np.clip(sub.sum(1, keepdims=True), 1e-12, None)
            out["roc_auc"] = float(
                roc_auc_score(y, sub, multi_class="ovr", average="macro", labels=present)
            )
    return out


def classifier_scores(
    train: tuple[pd.DataFrame, np.ndarray],
    test: tuple[pd.DataFrame, np.ndarray],
    schema: Schema,
    metrics: list[str],
    seeds: int,
    classifiers: Sequence[str] = CLASSIFIERS,
) -> dict[str, Any]:
    """Per classifier and metric: mean, std and per-seed values (NaN when undefined, e.g. a
    training set with one class only)."""
    x_train, y_train = train
    x_test, y_test = test
    x_train, x_test = _without_empty_columns(x_train, x_test)
    out: dict[str, Any] = {}
    for kind in classifiers:
        per_seed: dict[str, list[float]] = {m: [] for m in metrics}
        for seed in range(seeds):
            if len(np.unique(y_train)) < 2:
                values = {m: math.nan for m in metrics}
            else:
                model = _model(kind, schema, seed)
                with python_warnings.catch_warnings():
                    python_warnings.simplefilter("ignore")
                    model.fit(x_train, y_train)
                values = _scores(model, x_test, y_test, len(schema.classes), metrics)
            for metric in metrics:
                per_seed[metric].append(values[metric])
        out[kind] = {
            metric: {
                "mean": _json_float(float(np.mean(v))),
                "std": _json_float(float(np.std(v))),
                "per_seed": [_json_float(x) for x in v],
            }
            for metric, v in per_seed.items()
        }
    return out


def _without_empty_columns(
    train: pd.DataFrame, test: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A column the training rows never fill (a synthetic column the release dropped: written
    empty) becomes the constant 0 in both frames: it tells the classifier nothing, as before,
    but gradient boosting's binning refuses a column with no value at all."""
    empty = [c for c in train.columns if train[c].isna().all() and train[c].dtype.kind in "fc"]
    if not empty:
        return train, test
    train, test = train.copy(), test.copy()
    train[empty] = 0.0
    test[empty] = 0.0
    return train, test


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None
