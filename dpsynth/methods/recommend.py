"""`--method auto`: the backend dpsynth recommends for a data set's public shape and ε.

The rule reads public facts only (the modality, the record's shape, the schema's columns and
the target ε), so the choice spends nothing. It follows what the leaderboard measured on the
2-core CPU (docs/leaderboard.md, docs/tables.md):

- tables: `aim` for tables of at most `AIM_MAX_COLUMNS` feature columns at ε ≤
  `SMALL_EPSILON` (german-credit, 20 features, ε = 1, 2026-11-27: 2-way TVD 0.124 against
  `mst`'s 0.157, in 20 CPU s), else `mst` with the target in every tree edge: at ε = 10 on
  german-credit its marginals are within 0.005 of aim's (0.114 against 0.109) and its ROC-AUC
  means ahead of both SmartNoise tools, in 16–18 CPU s against aim's 75–82 and SmartNoise
  MST's 32–38; on census (40 features) `aim` took 9 minutes at ε = 1 for a 2-way TVD of 0.058
  and did not finish in 12 at ε = 10, while `mst` takes under a minute for 0.032 and logreg
  ROC-AUC 0.92. And only while rows × feature columns is at most `AIM_MAX_ROW_CELLS`: aim
  counts every candidate marginal over every row in each of its rounds, and a 100,000-row,
  18-feature table (1.8M) took aim 30 minutes on this CPU at ε = 1 (2026-11-28), where mst
  takes a few;
- images of at least `LARGE_IMAGE_VALUES` values (28×28): `rdpgan`, whose 28×28 presets fit
  a generator to the DP frequency model and, above ε = 3, label its release with a DP teacher
  (mnist-5k, the leaderboard run of 2026-11-27 20:01 UTC: 0.756 at ε = 1 against 0.742–0.774
  for the other four, and 0.748–0.793 over its five runs; 0.915 at ε = 10 against pge's 0.918
  and psg's 0.911; in 63–81 s of training against pge's 29–64, psg's 342–403, dpaf's 397–402
  and dpkernel's 142–401; on 28×28 digits, the same commit, 0.728 / 0.919 at ε = 1 / 10
  against 0.716–0.774 / 0.868–0.938, and 0.806 / 0.915 in an earlier run). pge is level with
  it at ε = 10 but samples 5× slower and is weaker at ε = 1 over its runs (0.735–0.771);
- smaller images (8×8 digits): `pge` at ε ≤ `SMALL_EPSILON` (0.838 at ε = 1, the best, and
  the one release ahead of DP-SGD on the records, 0.778), `dpkernel` above (0.889 at ε = 10,
  the best, in 15 s of training).
"""

from __future__ import annotations

from dpsynth.data.images import DataInfo
from dpsynth.data.schema import parse_schema
from dpsynth.methods.base import SMALL_EPSILON, Method, is_large_image

AUTO = "auto"
AIM_MAX_COLUMNS = 24
# rows × feature columns above which aim's rounds take too long on a CPU (see the docstring)
AIM_MAX_ROW_CELLS = 500_000


def feature_columns(info: DataInfo) -> int:
    """The number of a table's feature columns (the target and ignored columns excluded)."""
    return len(parse_schema(info.schema).features) if info.schema else 0


def recommend_method(info: DataInfo, epsilon: float) -> str:
    """The recommended backend's name for this public description at the target ε."""
    if info.modality == "table":
        columns = feature_columns(info)
        small = columns <= AIM_MAX_COLUMNS and info.n * columns <= AIM_MAX_ROW_CELLS
        return "aim" if small and epsilon <= SMALL_EPSILON else "mst"
    if is_large_image(info):
        return "rdpgan"
    return "pge" if epsilon <= SMALL_EPSILON else "dpkernel"


def resolve_preset(backend: Method, preset: str, info: DataInfo, epsilon: float) -> str:
    """`preset`, or for `auto` the backend's recommendation for this data's public shape and
    size at the target ε (no data is read: the choice spends no budget)."""
    return backend.recommended_preset(info, epsilon) if preset == AUTO else preset
