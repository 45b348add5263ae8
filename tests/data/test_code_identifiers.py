"""Repeated codes: whole numbers that name groups (a school's number on each of its pupils'
rows), neither named like an identifier nor a dense run, are drafted `id` so that no real
code reaches a synthetic table; measurements that repeat (prices, scores, amounts, a baseline
income on each of a person's rows) stay numbers."""

from __future__ import annotations

import json

import numpy as np

from dpsynth.data.schema_draft import DraftedColumn, draft_column, draft_table


def _strings(values: np.ndarray | list) -> np.ndarray:
    return np.asarray([str(v) for v in values], dtype=object)


def _school_codes(seed: int = 0, schools: int = 160) -> tuple[np.ndarray, np.ndarray]:
    """Pupils' school numbers as nlme's MathAchieve holds them: `schools` 4-digit codes drawn
    from 1000–9999 (sparse over their range), each on 14–67 rows, shuffled; and the codes."""
    rng = np.random.default_rng(seed)
    codes = rng.choice(np.arange(1000, 10_000), schools, replace=False)
    pupils = np.repeat(codes, rng.integers(14, 68, schools))
    return _strings(rng.permutation(pupils)), codes


def _drafted(name: str, values: np.ndarray | list) -> DraftedColumn:
    strings = _strings(values)
    return draft_column(name, strings, rows=len(strings))


def test_school_codes_repeated_on_their_pupils_rows_are_an_id() -> None:
    pupils, codes = _school_codes()
    drafted = draft_column("School", pupils, rows=len(pupils))
    assert drafted.column.type == "id"
    low, high = codes.min(), codes.max()
    assert drafted.remark is not None
    assert drafted.remark.startswith(
        f"School: repeated codes: 160 whole numbers of 4 digits ({low}–{high})"
    )
    assert (
        "scattered over a range far wider than their count" in drafted.remark
        and "syn-1" in drafted.remark
    )
    assert drafted.units is not None and drafted.units.units == 160
    assert drafted.units.most_rows <= 67
    # any name that does not say "measurement", and other draws of codes
    for seed, name in ((1, "school"), (2, "hosp"), (3, "site"), (4, "x")):
        assert _drafted(name, _school_codes(seed)[0]).column.type == "id", (seed, name)
    # five-digit codes and fewer, larger groups
    rng = np.random.default_rng(5)
    hospitals = rng.choice(np.arange(10_000, 100_000), 40, replace=False)
    patients = np.repeat(hospitals, rng.integers(20, 200, 40))
    assert _drafted("provider", rng.permutation(patients)).column.type == "id"


def test_the_draft_shows_school_codes_as_a_privacy_unit_and_writes_none() -> None:
    pupils, codes = _school_codes(seed=6)
    rng = np.random.default_rng(7)
    rows = len(pupils)
    header = ["School", "SES", "MathAch", "Sex"]
    columns = [
        pupils,
        _strings(np.round(rng.normal(0, 0.8, rows), 3)),
        _strings(np.round(rng.normal(12.7, 6.9, rows), 3)),
        _strings(rng.choice(["Female", "Male"], rows)),
    ]
    schema, remarks = draft_table(header, columns, "Sex")
    assert [c.type for c in schema.columns] == ["id", "numeric", "numeric", "categorical"]
    assert any(r.startswith("School: repeated codes") for r in remarks)
    unit = next(r for r in remarks if "privacy unit" in r)
    assert unit.startswith("School: 160 of its 160 values are held by several rows")
    assert "--privacy-unit School --max-rows-per-unit K" in unit
    document = json.dumps(schema.to_json(), ensure_ascii=False)
    assert not any(f'"{code}"' in document or f" {code}" in document for code in codes)


def test_codes_too_few_or_unlike_codes_stay_numbers() -> None:
    """Each condition of the rule on its own: the same school numbers fail it when ..."""
    pupils = _school_codes(seed=8)[0]
    assert _drafted("School", pupils).column.type == "id"
    # ... they are named for a measurement
    for name in ("income", "score", "price", "weight_g", "year"):
        assert _drafted(name, pupils).column.type == "integer", name
    rng = np.random.default_rng(9)
    # ... they are too few to be more than a category list (25, one or more in each tenth)
    few = 1000 + 360 * np.arange(25) + rng.integers(0, 360, 25)
    assert _drafted("School", np.repeat(few, 40)).column.type == "integer"
    assert _drafted("School", np.repeat(np.append(few, few + 7), 40)).column.type == "id"
    # ... each is on fewer than 3 rows on average
    lone = rng.choice(np.arange(1000, 10_000), 400, replace=False)
    assert _drafted("School", np.repeat(lone, rng.integers(1, 4, 400))).column.type == "integer"
    # ... their widths differ (1–9999: amounts spread over orders of magnitude look alike)
    mixed = rng.choice(np.arange(1, 10_000), 160, replace=False)
    mixed[:10] = rng.integers(1, 100, 10)
    assert _drafted("School", np.repeat(mixed, 30)).column.type == "integer"
    # ... they are rounded (multiples of 10 but one: prices, scores)
    rounded = np.unique(rng.choice(np.arange(100, 1000), 160, replace=False) * 10)
    rounded[0] += 1
    assert _drafted("School", np.repeat(rounded, 30)).column.type == "integer"


def test_measurements_that_repeat_stay_numbers() -> None:
    """Whole-number measurements with many values, each on several rows, none named for a
    measurement: they pile up on side-by-side typical values, or round, or their extreme
    tenths of the range hold few rows."""
    rng = np.random.default_rng(10)
    n = 6000

    def draw(sample, low: int, high: int) -> np.ndarray:
        values = np.round(sample(4 * n)).astype(np.int64)
        return values[(values >= low) & (values <= high)][:n]

    # a baseline income (whole dollars, five digits) repeated on each of a person's 5 rows
    baseline = draw(lambda k: rng.lognormal(np.log(30_000), 0.35, k), 10_000, 99_999)
    numbers = {
        "baseline": np.repeat(baseline[:1200], 5),
        # incomes rounded to the hundred, lognormal over orders of magnitude
        "inc": (np.round(rng.lognormal(10.5, 0.6, n) / 100) * 100).astype(int),
        # whole-unit prices piled around a typical one, some ending in 9 or 5
        "list": draw(lambda k: rng.normal(550, 90, k), 100, 999),
        "msrp": np.round(draw(lambda k: rng.lognormal(np.log(3000), 0.3, k), 1000, 9999), -2)
        - rng.choice([1, 5, 0], n),
        # test scores: 3 digits, dense, and multiples of 10
        "sat_v": np.round(draw(lambda k: rng.normal(550, 110, k), 200, 800), -1),
        "readk": draw(lambda k: rng.normal(440, 30, k), 315, 627),
        # birth weights in grams, lab values, counts, years
        "bw": draw(lambda k: rng.normal(3300, 450, k), 1000, 5000),
        "chol": draw(lambda k: rng.normal(220, 40, k), 100, 400),
        "steps_k": rng.poisson(8000, n),
        "yr": rng.integers(1950, 2024, n),
        "sales": rng.negative_binomial(2, 0.001, n) + 1000,
        # flat over its range but dense there: every whole number 1000–1999 on 40 rows (too
        # few values for a dense run at this size)
        "reading": rng.permutation(np.repeat(np.arange(1000, 2000), 40)),
    }
    kinds = {name: _drafted(name, values).column.type for name, values in numbers.items()}
    assert kinds == {name: "integer" for name in numbers}, kinds


def test_row_names_written_by_r_or_pandas_are_identifiers() -> None:
    """A table saved by R's write.csv (`rownames`) or pandas (`Unnamed: 0`, `index`) after a
    sample or split carries the original row numbers, unique and scattered (ISLR's Wage:
    3,000 of 7,373–453,870): drafted `id`, never a number whose range and values are
    released. An amount that is nearly unique, or a column named like an index of prices,
    stays a number."""
    rng = np.random.default_rng(0)
    rows = rng.choice(np.arange(7000, 460_000), 3000, replace=False)
    for name in ("rownames", "row.names", "Unnamed: 0", "index", "...1"):
        assert _drafted(name, rows).column.type == "id", name
    amounts = rng.choice(np.arange(7000, 460_000), 3000, replace=False)
    assert _drafted("salary", amounts).column.type == "integer"
    assert _drafted("price_index", amounts).column.type == "integer"


def test_a_survey_sequence_number_is_an_identifier() -> None:
    """NHEFS and NHANES key their respondents by `seqn`: unique whole numbers scattered over a
    range (233–25,061 for 1,629 people), neither a dense run nor named with an id word. It was
    drafted an integer, and the synthetic rows drew numbers equal to 51 real respondents'."""
    rng = np.random.default_rng(1)
    people = rng.choice(np.arange(233, 25_062), 1629, replace=False)
    for name in ("seqn", "SEQN", "seqno", "sequence", "resp_seq"):
        assert _drafted(name, people).column.type == "id", name
    assert _drafted("weight", people).column.type == "integer"


def test_a_code_list_kept_whole_numbers_is_remarked_and_counts_are_not() -> None:
    """ames' MS.SubClass (dwelling-type codes 20, 30, …, 190) stays `integer` (numbers stay
    numbers) with a remark naming the retype; counts, years, ratings and amounts get none."""
    rng = np.random.default_rng(0)
    subclass = [20, 30, 40, 45, 50, 60, 70, 75, 80, 85, 90, 120, 150, 160, 180, 190]
    drafted = _drafted("MS.SubClass", rng.choice(subclass, 2000))
    assert drafted.column.type == "integer"
    assert drafted.remark is not None
    assert drafted.remark.startswith("MS.SubClass: 16 whole numbers on a step of 5 over 20–190")
    assert "retype it categorical" in drafted.remark
    for name, values in {
        "Garage.Cars": rng.integers(0, 6, 2000),  # a count: side-by-side values
        "Yr.Sold": rng.integers(2006, 2011, 2000),
        "Overall.Qual": rng.integers(1, 11, 2000),  # a rating: a step of 1
        "Misc.Val": np.concatenate([np.zeros(1900, int), rng.integers(1, 1600, 100) * 7]),
    }.items():
        assert _drafted(name, values).remark is None, name


def test_a_share_in_zero_to_one_is_remarked_with_its_public_bounds() -> None:
    """labor-market's `frac_black` (floats over 0–0.99) gets a remark naming min 0 and max 1
    as the public bounds to declare; floats beyond [0, 1], over a narrow part of it, and
    whole numbers get none."""
    rng = np.random.default_rng(1)
    drafted = _drafted("frac_black", rng.beta(0.5, 2.0, 2000).round(4))
    assert drafted.column.type == "numeric" and drafted.column.data_derived
    assert drafted.remark is not None and drafted.remark.startswith("frac_black: every value lies")
    assert "write min 0 and max 1" in drafted.remark
    for name, values in {
        "l_med_hh_inc": rng.normal(10.0, 0.4, 2000).round(3),  # beyond 1
        "frac_dropout": rng.uniform(0.0, 0.36, 2000).round(3),  # a narrow part of [0, 1]
        "changed": rng.normal(0.0, 0.3, 2000).round(3),  # below 0
    }.items():
        assert _drafted(name, values).remark is None, name
