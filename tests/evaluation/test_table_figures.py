"""A table's report figures (`evaluate --report DIR`): the per-column pages, the pairwise
association heatmap and its matrix, the schema release table, and one real mst run whose DP
schema release the report describes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.schema import Column
from dpsynth.data.schema_file import parse_schema
from dpsynth.data.table_codec import RawTable
from dpsynth.errors import UsageError
from dpsynth.evaluation.associations import association_difference, cramers_v_matrix
from dpsynth.evaluation.table_figures import (
    category_panel,
    number_edges,
    number_panel,
    write_table_figures,
)
from dpsynth.evaluation.table_provenance import schema_release_markdown, schema_release_summary
from dpsynth.evaluation.table_report import run_table_evaluation

runner = CliRunner()
RELEASED = "released with DP (--schema-epsilon 0.5, ledger seq 0)"
SCHEMA_JSON = {
    "target": "label",
    "columns": [
        {"name": "key", "type": "id"},
        {"name": "x", "type": "numeric", "min": 0, "max": 100, "missing": True},
        {"name": "n", "type": "integer", "min": 0, "max": 9},
        {"name": "c", "type": "categorical", "categories": ["a", "b", "c", "d"]},
        {"name": "label", "type": "categorical", "categories": ["no", "yes"]},
    ],
}
SCHEMA = parse_schema(SCHEMA_JSON, "test schema")


def frame(rows: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Columns that depend on each other: c from x's quarter, label from c, n from x."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 100, rows)
    c = np.array(list("abcd"))[np.minimum((x // 25).astype(int), 3)]
    flip = rng.random(rows) < 0.1
    label = np.where((c == "a") | (c == "b"), "no", "yes")
    label = np.where(flip, np.where(label == "no", "yes", "no"), label)
    n = np.clip((x // 10).astype(int) + rng.integers(-1, 2, rows), 0, 9)
    text = np.array([f"{v:.2f}" for v in x], dtype=object)
    text[rng.random(rows) < 0.1] = ""
    return pd.DataFrame(
        {"key": [f"k{i}" for i in range(rows)], "x": text, "n": n.astype(str), "c": c,
         "label": label}
    )  # fmt: skip


def raw(df: pd.DataFrame) -> RawTable:
    """A RawTable of the frame's strings (as `read_csv_table` gives)."""
    return RawTable(
        tuple(df.columns), tuple(df[c].astype(str).to_numpy(dtype=object) for c in df), "test"
    )


def shuffled(df: pd.DataFrame, seed: int = 1) -> pd.DataFrame:
    """Every column permuted on its own: the same 1-way marginals, no association left."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({c: df[c].to_numpy()[rng.permutation(len(df))] for c in df})


def is_png(path: Path, min_side: int = 300) -> bool:
    """A readable PNG of a reasonable size."""
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        return image.format == "PNG" and min(image.size) >= min_side


def test_association_matrix_is_zero_for_the_same_rows_and_large_without_association() -> None:
    real = frame()
    same = association_difference(raw(real), raw(real), SCHEMA)
    assert same.names == ("x", "n", "c", "label")  # the marginals' columns: no id
    assert same.matrix.shape == (4, 4) and np.all(same.matrix == 0.0)
    reordered = association_difference(
        raw(real.sample(frac=1.0, random_state=3)), raw(real), SCHEMA
    )
    assert np.all(reordered.matrix == 0.0)  # row order does not matter
    broken = association_difference(raw(shuffled(real)), raw(real), SCHEMA)
    assert np.allclose(broken.matrix, broken.matrix.T) and np.all(np.diag(broken.matrix) == 0)
    # x, n and c are nearly functions of each other; label follows c: all lost by shuffling
    names = list(broken.names)
    assert broken.matrix[names.index("x"), names.index("c")] > 0.8
    assert broken.matrix[names.index("c"), names.index("label")] > 0.6
    assert broken.matrix.mean() > 0.4
    # another draw of the same distribution only differs by sampling noise
    redrawn = association_difference(raw(frame(seed=5)), raw(real), SCHEMA)
    assert redrawn.matrix.max() < 0.1
    assert redrawn.png[:8] == b"\x89PNG\r\n\x1a\n"
    assert association_difference(raw(frame(seed=5)), raw(real), SCHEMA).png == redrawn.png


def test_bias_corrected_cramers_v_of_independent_and_equal_columns() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, 5000)
    codes = np.stack([a, rng.integers(0, 7, 5000), a, np.zeros(5000, int)], axis=1)
    v = cramers_v_matrix(codes)
    assert v[0, 2] == pytest.approx(1.0)  # a column with itself
    assert v[0, 1] < 0.03  # independent: the small-sample bias is corrected away
    assert np.all(v[3] == 0) and np.all(np.diag(v) == 0)  # a constant column


def test_panels_share_bins_and_show_missing_rates() -> None:
    column = SCHEMA.columns[1]  # x: numeric, missing cells
    values = frame()["x"].to_numpy(dtype=object)
    same = number_panel(values, values, column)
    assert same.kind == "linear" and len(same.edges) == 21
    assert np.array_equal(same.real, same.synthetic) and same.real.sum() == pytest.approx(1.0)
    assert same.missing[0] == same.missing[1] == pytest.approx(0.1, abs=0.02)
    wider = np.append(values[values != ""][:100], ["150", "-3", "abc"])  # 3 outside
    assert number_panel(values, wider, column).outside == pytest.approx(3 / 103)
    # whole numbers: a bin per value; skewed numbers: the real rows' quantiles
    integer = SCHEMA.columns[2]
    edges, kind = number_edges(np.arange(10.0), integer)
    assert kind == "linear" and np.array_equal(edges, np.arange(-0.5, 10.0))
    skewed = np.concatenate([np.zeros(900), np.random.default_rng(0).exponential(50, 300)])
    edges, kind = number_edges(skewed, column)
    assert kind == "quantile" and np.all(np.diff(edges) > 0)
    # categories: the 20 commonest real values by share, then the other values of each table
    many = Column("c", "categorical", categories=tuple(f"v{i}" for i in range(30)))
    real = np.array([f"v{i}" for i in range(30) for _ in range(30 - i)] + [""] * 5, dtype=object)
    synthetic = np.array(["v0"] * 50 + ["new"] * 50, dtype=object)
    panel = category_panel(real, synthetic, many)
    assert panel.labels[:3] == ("v0", "v1", "v2") and len(panel.labels) == 21
    assert panel.labels[-1] == "other values"
    assert panel.synthetic[0] == 0.5 and panel.synthetic[-1] == 0.5
    assert panel.real.sum() == pytest.approx(1.0) and panel.missing == (5 / len(real), 0.0)
    nothing = np.array([""] * 4, dtype=object)
    assert category_panel(nothing, nothing, many).kind == "empty"


def _write_run(tmp_path: Path, schema_json: dict, release: dict | None) -> Path:
    """A sample's CSV and manifest (naming a run folder with its config.json) as `sample`
    writes them, and the real held-out CSV."""
    run = tmp_path / "run"
    run.mkdir()
    config = {"run_id": "r1", "method": "mst"} | ({"schema_release": release} if release else {})
    (run / "config.json").write_text(json.dumps(config))
    frame(600, seed=2).to_csv(tmp_path / "synth.csv", index=False)
    frame(400, seed=3).to_csv(tmp_path / "real.csv", index=False)
    manifest = {"run_id": "r1", "run": str(run), "method": "mst", "schema": schema_json}
    (tmp_path / "synth.csv.manifest.json").write_text(json.dumps(manifest))
    return tmp_path / "synth.csv"


def released_schema() -> dict:
    """SCHEMA as a run releases it: x's range and edges, c's list, n dropped, label public."""
    columns = [dict(c) for c in SCHEMA_JSON["columns"]]
    columns[1] |= {"edges": [0, 30, 60, 100], "decimals": 2, "source": RELEASED}
    columns[2] = {"name": "n", "type": "ignored", "source": RELEASED}
    columns[3] = {"name": "c", "type": "categorical", "categories": ["a", "b", "(other)"],
                  "other": "(other)", "source": RELEASED}  # fmt: skip
    return {"target": "label", "columns": columns}


RELEASE = {
    "ledger_seq": 0,
    "released_columns": ["c", "x", "n"],
    "noise_multiplier": 4.0,
    "category_noise_std": 5.5,
    "category_threshold": 30.0,
    "range_noise_std": 8.25,
    "shape_noise_std": 7.0,
    "epsilon": 0.5,
    "delta": 1e-5,
    "warnings": ["column 'n': no range cleared the noise at this ε and size, so it is written "
                 "empty: declare public bounds (min, max) to keep it"],
}  # fmt: skip


def test_table_report_writes_figures_and_the_schema_release(tmp_path: Path) -> None:
    synth = _write_run(tmp_path, released_schema(), RELEASE)
    report = tmp_path / "report"
    result = run_table_evaluation(
        synthetic=str(synth), real=f"csv:{tmp_path / 'real.csv'}", metrics=["marginals"],
        report_dir=report, ledger_path=tmp_path / "ledger.jsonl",
    )  # fmt: skip
    files = sorted(p.name for p in report.iterdir())
    assert files == ["association.png", "columns-1.png", "report.json", "report.md"]
    page = (report / "report.md").read_text()
    for name in ("columns-1.png", "association.png"):
        assert is_png(report / name) and f"]({name})" in page
        assert (report / name).stat().st_size > 10_000
    assert result["report_files"]["columns"] == ["columns-1.png"]
    assert (
        json.loads((report / "report.json").read_text())["figures"]["association"]["columns"] == 3
    )
    assert "do not publish this report where the real data are private" in page
    assert any("report's figures" in r for r in result["non_private_contents"])
    # every column, with what the release did to it and its noise
    rows = {row["column"]: row for row in result["schema_release"]["columns"]}
    assert list(rows) == ["key", "x", "n", "c", "label"]
    assert result["schema_release"]["status"] == "released"
    assert rows["x"]["what"] == "range [0, 100], 3 bins, with missing cells, 2 decimal(s)"
    assert rows["x"]["noise_std"] == "range 8.25, shape 7"
    assert rows["n"]["what"].startswith("dropped: no range cleared the noise")
    assert rows["c"]["what"] == "kept 2 categories (a, b); the rest becomes (other)"
    assert rows["c"]["noise_std"] == "5.5 (threshold 30)"
    assert not rows["label"]["released"] and not rows["key"]["released"]
    section = page[page.index("## Schema release") :]
    assert "ledger entry 0 (ε = 0.5, δ = 1e-05, noise multiplier 4)" in section
    table = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert [line.split(" | ")[0][2:] for line in table[1:]] == ["key", "x", "n", "c", "label"]
    assert "| label | categorical | not released: declared (public) | — |" in section

    # the same folder again (an earlier report) is accepted; a page it no longer has is removed
    (report / "columns-2.png").write_bytes((report / "columns-1.png").read_bytes())
    run_table_evaluation(
        synthetic=str(synth), real=f"csv:{tmp_path / 'real.csv'}", metrics=["marginals"],
        report_dir=report,
    )  # fmt: skip
    assert not (report / "columns-2.png").exists()
    (report / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="did not write"):
        run_table_evaluation(
            synthetic=str(synth), real=f"csv:{tmp_path / 'real.csv'}", metrics=["marginals"],
            report_dir=report,
        )  # fmt: skip


def test_declared_schema_and_missing_manifest_take_one_line(tmp_path: Path) -> None:
    declared = schema_release_summary({"run_id": "r1", "run": str(tmp_path), "schema": SCHEMA_JSON})
    assert declared["status"] == "declared" and declared["columns"] == []
    lines = [line for line in schema_release_markdown(declared) if line]
    assert lines == ["## Schema release", "Nothing was released with DP: the run's schema was "
                     "declared (public)."]  # fmt: skip
    unknown = schema_release_summary({})
    assert unknown["status"] == "unknown" and "no manifest" in unknown["note"]
    # the run folder is gone: the released entries still show, without their noise
    gone = schema_release_summary({"run_id": "r1", "run": str(tmp_path / "moved"),
                                   "schema": released_schema()})  # fmt: skip
    assert "was not found" in gone["note"]
    rows = {row["column"]: row for row in gone["columns"]}
    assert rows["c"]["released"] and rows["c"]["noise_std"] is None
    assert "| c | categorical | kept 2 categories" in "\n".join(schema_release_markdown(gone))


def test_fifty_columns_are_split_over_pages(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    columns = [{"name": f"col{i:02d}", "type": "categorical", "categories": list("abc")}
               for i in range(50)]  # fmt: skip
    schema = parse_schema({"target": "col00", "columns": columns}, "wide")
    real = pd.DataFrame({c["name"]: rng.choice(list("abc"), 150) for c in columns})
    found = write_table_figures(tmp_path, raw(shuffled(real)), raw(real), schema)
    assert found["columns"] == ["columns-1.png", "columns-2.png", "columns-3.png"]
    assert found["drawn"] == found["total"] == 50 and found["association"]["columns"] == 50
    for name in [*found["columns"], "association.png"]:
        assert is_png(tmp_path / name, min_side=800), name


@pytest.mark.slow
def test_report_of_a_real_mst_run_with_a_dp_schema_release(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    rows = 2400
    ward = rng.choice([f"W{i}" for i in range(8)], rows, p=np.arange(8, 0, -1) / 36)
    age = rng.integers(18, 90, rows)
    rare = np.full(rows, "", dtype=object)
    rare[:12] = rng.uniform(0, 1e6, 12).round(1).astype(str)  # too few rows for a range
    outcome = np.where(rng.random(rows) < 0.3 + 0.004 * (age - 18), "yes", "no")
    df = pd.DataFrame({"ward": ward, "age": age, "rare": rare, "outcome": outcome})
    df.iloc[:2000].to_csv(tmp_path / "train.csv", index=False)
    df.iloc[2000:].to_csv(tmp_path / "holdout.csv", index=False)
    drafted = runner.invoke(app, ["data", "schema", f"csv:{tmp_path / 'train.csv'}",
                                  "--target", "outcome"])  # fmt: skip
    assert drafted.exit_code == 0, drafted.output
    (tmp_path / "schema.json").write_text(drafted.stdout)
    ledger = str(tmp_path / "ledger.jsonl")
    for args in (
        ["train", "--method", "mst", "--data", f"csv:{tmp_path / 'train.csv'}", "--schema",
         str(tmp_path / "schema.json"), "--epsilon", "3", "--out", str(tmp_path / "run"),
         "--device", "cpu", "--threads", "1"],
        ["sample", str(tmp_path / "run"), "--n", "800", "--out", str(tmp_path / "synth.csv")],
        ["evaluate", "--synthetic", str(tmp_path / "synth.csv"), "--real",
         f"csv:{tmp_path / 'holdout.csv'}", "--metrics", "marginals", "--report",
         str(tmp_path / "report"), "--threads", "1"],
    ):  # fmt: skip
        done = runner.invoke(app, [*args, "--ledger", ledger])
        assert done.exit_code == 0, done.output
    page = (tmp_path / "report" / "report.md").read_text()
    for name in re.findall(r"\]\(([^)]+\.png)\)", page):
        assert is_png(tmp_path / "report" / name), name
    assert "](columns-1.png)" in page and "](association.png)" in page
    section = page[page.index("## Schema release") :]
    assert "Released with DP by the run's ledger entry 0" in section
    assert re.search(r"\| ward \| categorical \| kept \d+ categor", section)
    assert re.search(r"\| age \| integer \| range \[\d+, \d+\]", section)
    # dropped either way; which round found too little depends on the run's secret noise
    # (no range in round 1, or a range whose values' count round 3 could not tell from noise)
    assert re.search(
        r"\| rare \| ignored \| dropped: (no range cleared the noise|its values' count did not "
        r"clear the noise)",
        section,
    )
    assert "| outcome | categorical | label set no, yes" in section
