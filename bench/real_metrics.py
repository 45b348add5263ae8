"""The metrics of bench/tables_real.py, computed here with pandas, numpy and scikit-learn alone
(independent of `dpsynth evaluate`, so a check on it), as issue 44 defines them.

Column kinds come from the real held-out rows and the table's marks (bench/real_tables.py):
`date` (marked; parsed to seconds since 1970, UTC), `number` (≥ 98 % of the non-empty cells
parse as numbers), `id` (marked identifiers, and text columns with ≥ 90 % distinct non-empty
strings) and `text` (marked free text): both left out of TVD and classifiers, checked for
copied values,
`exclude` (marked) and `categorical` (the rest). A number or date cell is missing when empty or
one of MISSING; a categorical one when empty.

- missing rate per column: the share of missing cells, real train rows vs synthetic rows;
- TVD: each column cut into bins: numbers and dates in 10 quantile bins (edges from the
  held-out rows) plus a missing bin, categoricals in their 20 most common held-out values plus
  an "other" bin plus a missing bin. 1-way: mean over the columns of ½ Σ|p − q|; 2-way: mean
  over all pairs of columns; always against the held-out rows. The floor: the real training
  rows' own TVD against them;
- ROC-AUC of logistic regression and gradient boosting trained on the given rows (synthetic or
  real train) and tested on the held-out rows: categoricals one-hot (at most 50 levels, the
  rest pooled), numbers and dates median-imputed with a missing indicator; binary AUC on the
  second class, macro one-vs-rest AUC for more classes;
- identifier check: per id column, the synthetic non-empty values equal to some real training
  value (must be 0); the same count per free-text column (a repeated real remark may recur);
- "(other)": the categorical column whose synthetic rows hold the largest share of the schema's
  `other` category, beside the real column's most common value share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

MISSING = frozenset(
    ("", "NA", "N/A", "n/a", "NaN", "nan", "NULL", "null", "None", "none", "?", "-", "NaT")
)
QUANTILE_BINS = 10
TOP_VALUES = 20
DISTINCT_ID_SHARE = 0.9
NUMBER_SHARE = 0.98
ONE_HOT_LEVELS = 50
OTHER = "(other)"


@dataclass(frozen=True)
class Kinds:
    """Per column its kind (see the module docstring), and the date formats."""

    kind: dict[str, str]
    dates: dict[str, str | None]

    def of(self, *kinds: str) -> list[str]:
        """The columns of these kinds, in the table's order."""
        return [c for c, k in self.kind.items() if k in kinds]


def _is_missing(column: pd.Series) -> np.ndarray:
    return column.isin(MISSING).to_numpy()


def to_numbers(column: pd.Series) -> tuple[np.ndarray, int]:
    """Floats (NaN for missing cells) and the count of non-missing cells that did not parse."""
    missing = _is_missing(column)
    values = pd.to_numeric(column.where(~missing), errors="coerce").to_numpy(dtype=np.float64)
    return values, int((np.isnan(values) & ~missing).sum())


def to_seconds(column: pd.Series, fmt: str | None) -> tuple[np.ndarray, int]:
    """Seconds since 1970-01-01 UTC (NaN for missing cells; naive times read as UTC), and the
    count of non-missing cells that parsed neither in `fmt` (ISO 8601 when None) nor mixed."""
    missing = _is_missing(column)
    kept = column.where(~missing)
    parsed = pd.to_datetime(kept, format=fmt or "ISO8601", errors="coerce", utc=True)
    retry = parsed.isna().to_numpy() & ~missing
    if retry.any():
        parsed = parsed.copy()
        parsed[retry] = pd.to_datetime(kept[retry], format="mixed", errors="coerce", utc=True)
    epoch = pd.Timestamp("1970-01-01", tz="UTC")
    seconds = ((parsed - epoch) / pd.Timedelta(seconds=1)).to_numpy(dtype=np.float64)
    return seconds, int((np.isnan(seconds) & ~missing).sum())


def column_kinds(
    holdout: pd.DataFrame,
    dates: dict[str, str | None],
    ids: tuple[str, ...],
    text: tuple[str, ...],
    exclude: tuple[str, ...],
    target: str,
) -> Kinds:
    """Each column's kind from the held-out rows and the marks (the target: categorical)."""
    kind: dict[str, str] = {}
    for name in holdout.columns:
        column = holdout[name]
        present = column[~_is_missing(column)]
        if name == target:
            kind[name] = "categorical"
        elif name in exclude:
            kind[name] = "exclude"
        elif name in dates:
            kind[name] = "date"
        elif name in ids:
            kind[name] = "id"
        elif name in text:
            kind[name] = "text"
        elif len(present) and to_numbers(present)[1] <= (1 - NUMBER_SHARE) * len(present):
            kind[name] = "number"
        elif len(present) and present.nunique() >= DISTINCT_ID_SHARE * len(present):
            kind[name] = "id"
        else:
            kind[name] = "categorical"
    return Kinds(kind, {c: dates[c] for c in dates if c in kind})


def values(frame: pd.DataFrame, name: str, kinds: Kinds) -> tuple[np.ndarray, int]:
    """A number or date column as floats (NaN: missing or unparsed) and its unparsed count."""
    column = frame[name] if name in frame else pd.Series([""] * len(frame), dtype=str)
    if kinds.kind[name] == "date":
        return to_seconds(column, kinds.dates[name])
    return to_numbers(column)


class Binner:
    """The bins of every TVD column, fitted on the held-out rows."""

    def __init__(self, holdout: pd.DataFrame, kinds: Kinds) -> None:
        self.kinds = kinds
        self.columns = kinds.of("number", "date", "categorical")
        self.edges: dict[str, np.ndarray] = {}
        self.top: dict[str, list[str]] = {}
        for name in self.columns:
            if kinds.kind[name] == "categorical":
                counts = holdout[name][holdout[name] != ""].value_counts()
                self.top[name] = list(counts.index[:TOP_VALUES])
            else:
                numbers = values(holdout, name, kinds)[0]
                numbers = numbers[~np.isnan(numbers)]
                inner = np.arange(1, QUANTILE_BINS) / QUANTILE_BINS
                edges = np.quantile(numbers, inner) if len(numbers) else np.array([])
                self.edges[name] = np.unique(edges)

    def size(self, name: str) -> int:
        """Bins of a column (the missing bin and, for a categorical, the other bin included)."""
        if name in self.top:
            return len(self.top[name]) + 2
        return len(self.edges[name]) + 2

    def codes(self, frame: pd.DataFrame) -> dict[str, np.ndarray]:
        """Each TVD column's bin per row."""
        out: dict[str, np.ndarray] = {}
        for name in self.columns:
            if name in self.top:
                top = self.top[name]
                column = frame[name] if name in frame else pd.Series([""] * len(frame))
                index = {v: i for i, v in enumerate(top)}
                code = column.map(index).fillna(len(top)).to_numpy(dtype=np.int64, copy=True)
                code[(column == "").to_numpy()] = len(top) + 1
            else:
                numbers = values(frame, name, self.kinds)[0]
                edges = self.edges[name]
                code = np.searchsorted(edges, numbers, side="left").astype(np.int64)
                code[np.isnan(numbers)] = len(edges) + 1
            out[name] = code
        return out


def _tvd(a: np.ndarray, b: np.ndarray, size: int) -> float:
    p = np.bincount(a, minlength=size) / max(len(a), 1)
    q = np.bincount(b, minlength=size) / max(len(b), 1)
    return float(0.5 * np.abs(p - q).sum())


def tvd(binner: Binner, rows: pd.DataFrame, holdout_codes: dict[str, np.ndarray]) -> dict:
    """Mean 1-way and 2-way TVD of `rows` against the held-out rows, and the 1-way per column."""
    codes = binner.codes(rows)
    names = binner.columns
    one = {n: _tvd(codes[n], holdout_codes[n], binner.size(n)) for n in names}
    two = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            width = binner.size(b)
            two.append(
                _tvd(
                    codes[a] * width + codes[b],
                    holdout_codes[a] * width + holdout_codes[b],
                    binner.size(a) * width,
                )
            )
    return {
        "tvd_one_way": float(np.mean(list(one.values()))) if one else None,
        "tvd_two_way": float(np.mean(two)) if two else None,
        "tvd_one_way_per_column": {n: round(v, 4) for n, v in one.items()},
        "tvd_columns": len(names),
    }


def missing_rates(frame: pd.DataFrame, kinds: Kinds) -> dict[str, float]:
    """Per column the share of missing cells (see the module docstring)."""
    rates = {}
    for name, kind in kinds.kind.items():
        if name not in frame:
            rates[name] = 1.0
            continue
        column = frame[name]
        empty = _is_missing(column) if kind in ("number", "date") else (column == "").to_numpy()
        rates[name] = float(empty.mean()) if len(column) else math.nan
    return rates


def unparsed(frame: pd.DataFrame, kinds: Kinds) -> dict[str, int]:
    """Per number or date column the non-missing cells that are no number or date."""
    out = {}
    for name in kinds.of("number", "date"):
        count = values(frame, name, kinds)[1]
        if count:
            out[name] = count
    return out


def id_matches(
    synthetic: pd.DataFrame, train: pd.DataFrame, kinds: Kinds, kind: str = "id"
) -> dict[str, int]:
    """Per id (or text) column, the synthetic non-empty values equal to a real training value."""
    out = {}
    for name in kinds.of(kind):
        if name not in synthetic:
            out[name] = 0
            continue
        real = set(train[name][train[name] != ""])
        column = synthetic[name]
        out[name] = int(column[column != ""].isin(real).sum())
    return out


def other_share(
    synthetic: pd.DataFrame, train: pd.DataFrame, kinds: Kinds, schema: dict[str, Any] | None
) -> dict[str, Any]:
    """The categorical column whose synthetic rows hold the largest share of its `other`
    category (the schema's, else "(other)"), with the real column's most common value share."""
    others = {}
    for column in (schema or {}).get("columns", []):
        if column.get("other"):
            others[column["name"]] = column["other"]
    worst: dict[str, Any] = {"column": None, "synthetic_other_share": 0.0}
    for name in kinds.of("categorical"):
        if name not in synthetic or not len(synthetic):
            continue
        share = float((synthetic[name] == others.get(name, OTHER)).mean())
        if share > worst["synthetic_other_share"]:
            top = train[name].value_counts(normalize=True)
            worst = {
                "column": name,
                "synthetic_other_share": round(share, 4),
                "real_top_value": str(top.index[0]),
                "real_top_share": round(float(top.iloc[0]), 4),
            }
    return worst


def outside_range(synthetic: pd.DataFrame, train: pd.DataFrame, kinds: Kinds) -> dict[str, Any]:
    """Per number and date, the share of the synthetic present values outside the real
    training rows' [min, max], their mean, and the worst column. The held-out quantile bins
    of the TVD are open at both ends, so they do not see a value drawn far outside the real
    range (nhefs' ages of 8 among real 25-74)."""
    shares: dict[str, float] = {}
    for name in kinds.of("number", "date"):
        real = values(train, name, kinds)[0]
        real = real[~np.isnan(real)]
        drawn = values(synthetic, name, kinds)[0]
        drawn = drawn[~np.isnan(drawn)]
        if len(real) and len(drawn):
            outside = (drawn < real.min()) | (drawn > real.max())
            shares[name] = round(float(outside.mean()), 4)
    worst = max(shares, key=shares.get) if shares else None
    return {
        "mean": round(float(np.mean(list(shares.values()))), 4) if shares else None,
        "worst": {"column": worst, "share": shares[worst]} if worst else None,
        "per_column": shares,
    }


def _features(frame: pd.DataFrame, kinds: Kinds, target: str) -> pd.DataFrame:
    """The classifier inputs: numbers and dates as floats (NaN missing), categoricals as text."""
    out = {}
    for name in kinds.of("number", "date"):
        if name != target:
            out[name] = values(frame, name, kinds)[0]
    for name in kinds.of("categorical"):
        if name != target:
            column = frame[name] if name in frame else pd.Series([""] * len(frame))
            out[name] = column.replace("", "(missing)").to_numpy(dtype=object)
    return pd.DataFrame(out)


def classifiers(
    rows: pd.DataFrame,
    holdout: pd.DataFrame,
    kinds: Kinds,
    target: str,
    max_rows: int,
    seed: int = 0,
) -> dict[str, Any]:
    """ROC-AUC (and accuracy) of logistic regression and gradient boosting trained on `rows`
    (at most `max_rows`, a fixed-seed subsample) and tested on the held-out rows, on one
    thread (on a shared 2-core machine, BLAS and OpenMP threads that wait on each other are
    many times slower than one)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return _classifiers(rows, holdout, kinds, target, max_rows, seed)


def _classifiers(
    rows: pd.DataFrame,
    holdout: pd.DataFrame,
    kinds: Kinds,
    target: str,
    max_rows: int,
    seed: int,
) -> dict[str, Any]:
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    rows = rows[rows[target] != ""] if target in rows else rows.iloc[:0]
    test = holdout[holdout[target] != ""]
    if len(rows) > max_rows:
        rows = rows.sample(n=max_rows, random_state=seed)
    classes = sorted(test[target].unique())
    seen = sorted(rows[target].unique()) if len(rows) else []
    if len(set(seen) & set(classes)) < 2:
        return {"error": f"the training rows hold {len(seen)} of the held-out classes"}
    numbers = [n for n in kinds.of("number", "date") if n != target]
    categoricals = [n for n in kinds.of("categorical") if n != target]
    transform = ColumnTransformer(
        [
            (
                "num",
                make_pipeline(
                    SimpleImputer(strategy="median", add_indicator=True, keep_empty_features=True),
                    StandardScaler(),
                ),
                numbers,
            ),
            (
                "cat",
                OneHotEncoder(
                    handle_unknown="infrequent_if_exist",
                    max_categories=ONE_HOT_LEVELS,
                    sparse_output=False,
                    dtype=np.float32,
                ),
                categoricals,
            ),
        ],
        sparse_threshold=0.0,
    )
    x_train = transform.fit_transform(_features(rows, kinds, target)).astype(np.float32)
    x_test = transform.transform(_features(test, kinds, target)).astype(np.float32)
    y_train, y_test = rows[target].to_numpy(), test[target].to_numpy()
    models = {
        "logreg": LogisticRegression(max_iter=2000),
        "gbm": HistGradientBoostingClassifier(random_state=seed),
    }
    out: dict[str, Any] = {"train_rows": len(rows), "test_rows": len(test)}
    for name, model in models.items():
        model.fit(x_train, y_train)
        predicted_proba = model.predict_proba(x_test)
        proba = np.zeros((len(test), len(classes)))
        for j, label in enumerate(model.classes_):
            if label in classes:
                proba[:, classes.index(label)] = predicted_proba[:, j]
        total = proba.sum(axis=1, keepdims=True)
        proba = np.where(total > 0, proba / np.where(total > 0, total, 1), 1 / len(classes))
        if len(classes) == 2:
            auc = roc_auc_score(y_test == classes[1], proba[:, 1])
        else:
            auc = roc_auc_score(y_test, proba, multi_class="ovr", average="macro", labels=classes)
        predicted = np.asarray(classes)[proba.argmax(axis=1)]
        out[name] = {
            "roc_auc": round(float(auc), 4),
            "accuracy": round(float(accuracy_score(y_test, predicted)), 4),
        }
    return out
