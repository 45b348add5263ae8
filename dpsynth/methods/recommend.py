"""`--method auto`: the backend dpsynth recommends for a data set's public shape and ε.

The rule reads public facts only (the modality, the record's shape, the schema's columns and
the target ε), so the choice spends nothing. It follows what the leaderboard measured on the
2-core CPU (docs/leaderboard.md, docs/tables.md):

- tables: `aim` for tables of at most `AIM_MAX_COLUMNS` feature columns at ε ≤
  `SMALL_EPSILON` whose estimated training time is at most `AIM_TIME_BUDGET_S` (german-credit,
  20 features, ε = 1, 2026-11-27: 2-way TVD 0.124 against `mst`'s 0.157, in 20 CPU s), else
  `mst` with the target in every tree edge: at ε = 10 on german-credit its marginals are
  within 0.005 of aim's (0.114 against 0.109) and its ROC-AUC means ahead of both SmartNoise
  tools, in 16–18 CPU s against aim's 75–82 and SmartNoise MST's 32–38; on census (40
  features) `mst` trains in 39–48 s for a 2-way TVD of 0.030 and logreg ROC-AUC 0.93, `aim`
  in 103–109 s for 0.020–0.021 and 0.81–0.85 (ε = 10 and 1,
  bench/results/2026-11-28-tables-speed/tables-speed-2026-11-28.json);
- the time rule: AIM's time grows with N (reading the table, counting every candidate pair)
  and with the columns (about d² candidate pairs scored each round), and its estimation with
  the size of its model, which the preset caps. `AIMMethod.estimated_train_seconds`
  (`methods/marginal/cost.py`) adds these up from the public schema (the attributes' domain
  sizes under the preset's bins), N and ε, with constants measured on census on the 2-core
  CPU (129 s estimated for its 199,523 rows, 92–109 s measured); above the budget (10
  minutes) `auto` takes `mst`, which fits one tree of pairs in one round. A 24-column numeric
  table reaches it at about 7 million rows (before the estimator of 2026-11-28, aim took 30
  minutes on 100,000 rows × 18 columns; it now takes about 2);
- images: `dpkernel`. Of at least `LARGE_IMAGE_VALUES` values (28×28), its `mnist` and
  `mnist-eps1` presets, ahead of every other method on FID and CNN accuracy together in the
  runs of record (docs/leaderboard.md): on mnist-5k at ε = 10 CNN 0.849 / FID 82.6 against
  rdpgan's 0.768 / 160.1, the choice before (of 2026-11-27, on accuracy alone), whose images
  are nearly one template a class; at ε = 1 0.711 / 178.5 against 0.653 / 216.5; on the
  unseen digits28 at ε = 10 0.894 / 154.1 against 0.849 / 236.2. It trains in 8.9 minutes
  at ε = 10 on the idle 2-core CPU (rdpgan 3.0), within the 15 minutes of a recommended
  preset; only the frequency model alone is more accurate at ε = 1 (0.793), at FID 274.8;
- smaller images (8×8 digits): its `small-eps1` at every ε. At ε = 1 pge's CNN accuracy is
  3 points above dpkernel's (0.777 against 0.746, the mean of two runs each, seed deviations
  0.03) at more than twice its FID (digits, 2026-12-06: dpkernel 0.761 / 39.8, pge 0.770 /
  93.4; 2026-11-30: 0.730 / 41.5 against 0.784 / 103.5); dpkernel's grid reads as clean
  digits where pge's are speckled, and it trains in about a minute against pge's two (pge
  was the choice at ε ≤ 3 until 2026-12-06). At ε = 10 (2026-12-06) 0.881 with the best FID,
  33.7 (dpaf 0.881 at 52.4, pge 0.869 at 58.3).
"""

from __future__ import annotations

from dpsynth.data.images import DataInfo
from dpsynth.data.schema_file import parse_schema
from dpsynth.errors import UsageError
from dpsynth.methods.base import SMALL_EPSILON, Method
from dpsynth.methods.registry import get_method, methods_for

AUTO = "auto"
# The slow tier: each backend's best release within an hour on the 2-core CPU, where it has one
# (`Method.quality_preset`); `auto` is the fast tier (a quarter of an hour).
QUALITY = "quality"
TIERS = (AUTO, QUALITY)
AIM_MAX_COLUMNS = 24
# The most training seconds `auto` lets aim take (estimated; the 2-core CPU of docs/tables.md).
AIM_TIME_BUDGET_S = 600.0


def feature_columns(info: DataInfo) -> int:
    """The number of a table's feature columns (the target and ignored columns excluded)."""
    return len(parse_schema(info.schema).features) if info.schema else 0


def aim_fits_the_budget(info: DataInfo, epsilon: float) -> bool:
    """Whether aim's public time estimate is within `AIM_TIME_BUDGET_S` (see above)."""
    seconds = get_method("aim").estimated_train_seconds(info, epsilon)
    return seconds is None or seconds <= AIM_TIME_BUDGET_S


def recommend_method(info: DataInfo, epsilon: float) -> str:
    """The recommended backend's name for this public description at the target ε."""
    if info.modality == "table":
        narrow = feature_columns(info) <= AIM_MAX_COLUMNS
        if narrow and epsilon <= SMALL_EPSILON and aim_fits_the_budget(info, epsilon):
            return "aim"
        return "mst"
    return "dpkernel"


def quality_methods(info: DataInfo, epsilon: float) -> list[str]:
    """The backends with a quality tier for this data's public shape at ε."""
    return [
        name
        for name in methods_for(info.modality)
        if get_method(name).quality_preset(info, epsilon) is not None
    ]


def resolve_preset(backend: Method, preset: str, info: DataInfo, epsilon: float) -> str:
    """`preset`, or a tier: for `auto` the backend's recommendation for this data's public
    shape and size at the target ε, for `quality` its slower tier there (UsageError
    where it has none). No data is read: the choice spends no budget."""
    if preset == AUTO:
        return backend.recommended_preset(info, epsilon)
    if preset != QUALITY:
        return preset
    chosen = backend.quality_preset(info, epsilon)
    if chosen is None:
        others = quality_methods(info, epsilon)
        where = f"--method {' or '.join(others)} has one" if others else "no method has one"
        raise UsageError(
            f"--preset quality: {backend.name} has no quality tier for this data ({where}); "
            "--preset auto is its recommended preset"
        )
    return chosen
