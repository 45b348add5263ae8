"""bench/leaderboard.py and its modules (bench/leaderboard_*.py): method discovery, presets, the
rows, and the table/JSON writer."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods import registry

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "leaderboard.py"


@pytest.fixture(scope="module")
def leaderboard():
    return importlib.import_module("bench.leaderboard")


def _row(method: str, epsilon, cnn: float, fid=None, precision=None, recall=None) -> dict:
    return {
        "method": method,
        "preset": "small",
        "epsilon": epsilon,
        "steps": 1200,
        "train_seconds": 42.4,
        "cnn_mean": cnn,
        "cnn_std": 0.01,
        "fid": fid,
        "precision": precision,
        "recall": recall,
        "sample_images_per_s": 512.3,
    }


def _report(rows: list[dict]) -> dict:
    return {
        "data": "digits",
        "date": "2026-01-01T00:00:00+00:00",
        "machine": {"cpu": "Test CPU", "cpu_cores": 2, "torch": "2.x", "gpu": None},
        "command": "python -m bench.leaderboard --data digits",
        "synthetic_n": 2000,
        "seeds": 3,
        "fid": False,
        "real": {"method": "real train data", "preset": None, "epsilon": None} | {
            "cnn_mean": 0.95, "cnn_std": 0.004, "fid": None
        },
        "rows": rows,
    }  # fmt: skip


def test_every_registered_method_is_on_the_board(leaderboard, monkeypatch):
    monkeypatch.setitem(registry._BACKENDS, "newmethod", "dpsynth.methods.pge:PGEMethod")
    assert leaderboard.registered_methods() == registry.method_names()
    assert "newmethod" in leaderboard.registered_methods()
    assert leaderboard.parse_args(["--quick"]).methods is None  # None means: the registry's
    # ... that take the data's modality: a table-only backend has no image row, and back.
    images, tables = leaderboard.methods_for("image"), leaderboard.table_methods()
    assert "newmethod" in images and "pge" in images
    assert "aim" in tables and "mst" in tables and not {"aim", "mst"} & set(images)
    assert set(images) | set(tables) == set(registry.method_names())


def test_default_presets_and_sizes(leaderboard):
    digits = DataInfo("digits", "builtin", 1437, (1, 8, 8), tuple("0123456789"), "f", "digits")
    mnist = dataclasses.replace(digits, spec="mnist-5k", n=4000, shape=(1, 28, 28))
    # --preset for every method; a method without it falls back to small.
    assert leaderboard.preset_for("dpkernel", mnist, "10", "paper-200k") == "paper-200k"
    assert leaderboard.preset_for("dpkernel", mnist, "10", "no-such-preset") == "small"
    # Without --preset each method recommends one from public facts (no 200k-step default).
    assert leaderboard.preset_for("dpkernel", digits, "10", None) == "small-eps1"
    assert leaderboard.preset_for("dpkernel", mnist, "10", None) == "mnist"
    assert leaderboard.preset_for("dpkernel", mnist, "1", None) == "mnist-eps1"
    assert leaderboard.preset_for("dpkernel", mnist, "inf", None) == "mnist"
    for method in registry.method_names():
        for data in (digits, mnist):
            for epsilon in ("1", "10", "inf"):
                chosen = leaderboard.preset_for(method, data, epsilon, None)
                assert chosen in registry.get_method(method).presets, (method, chosen)
                assert not chosen.startswith("paper"), (method, chosen)
    assert leaderboard.default_synthetic_n("digits") == 2000
    assert leaderboard.default_synthetic_n("mnist-5k") == 10_000
    quick = leaderboard.parse_args(["--quick"])
    assert quick.no_fid and quick.seeds == 1


def test_table_has_the_real_row_first_and_percent_of_real(leaderboard):
    report = _report(
        [_row("dpkernel", 9.9922, 0.855, 31.25, 0.612, 0.334), _row("pge", "inf", 0.475)]
    )
    report["rows"][0]["epsilon_target"] = "10"  # the target names the row, not the bound
    table = leaderboard.markdown_table(report).splitlines()
    assert table[0].startswith("| method | preset | ε | steps | train time")
    assert table[2].startswith("| real train data |")
    assert (
        "| dpkernel | small | 10 | 1,200 | 42 | 0.855 ± 0.010 | 90% | 31.2 | 0.61 | 0.33 | 512 |"
        in table
    )
    assert "| pge | small | ∞ (not private) |" in table[4] and "| 50% | – |" in table[4]


def test_the_dpsgd_reference_rows_follow_the_real_row(leaderboard):
    reference = {
        "method": leaderboard.DPSGD_METHOD,
        "preset": "B 256, 15 epochs, Adam 5e-3, C 1",
        "epsilon": 0.998,
        "epsilon_target": "1",
        "steps": 234,
        "train_seconds": 31.0,
        "cnn_mean": 0.886,
        "cnn_std": 0.004,
        "fid": None,
    }
    report = _report([_row("dpkernel", 1.0, 0.741)]) | {"dpsgd": [reference]}
    table = leaderboard.markdown_table(report).splitlines()
    assert table[2].startswith("| real train data |")
    assert table[3] == (
        "| DP-SGD classifier on the real records | B 256, 15 epochs, Adam 5e-3, C 1 | 1 | 234 "
        "| 31 | 0.886 ± 0.004 | 93% | – | – | – | – |"
    )
    assert table[4].startswith("| dpkernel |")
    assert leaderboard.parse_args(["--no-dpsgd"]).no_dpsgd


def test_failed_runs_keep_their_row(leaderboard):
    report = _report([{"method": "pge", "epsilon": "1", "error": "dpsynth train failed"}])
    table = leaderboard.markdown_table(report)
    assert "| pge | – | 1 | failed: dpsynth train failed |" in table


def test_write_results_json_and_markdown(leaderboard, tmp_path):
    report = _report([_row("dpkernel", 1.0, 0.5)])
    leaderboard.write_results(report, tmp_path / "lb.json", tmp_path / "lb.md")
    assert json.loads((tmp_path / "lb.json").read_text()) == report
    page = (tmp_path / "lb.md").read_text()
    assert "Test CPU, 2 cores" in page and "not measured (--no-fid)" in page
    assert "`python -m bench.leaderboard --data digits`" in page
    assert "| dpkernel | small | 1 |" in page


def test_the_page_names_the_commit_the_figures_were_measured_at(leaderboard, tmp_path):
    report = _report([_row("dpkernel", 1.0, 0.5)])
    report["machine"]["commit"] = "0123abc"
    leaderboard.write_results(report, tmp_path / "lb.json", tmp_path / "lb.md")
    first_line_after_title = (tmp_path / "lb.md").read_text().splitlines()[2]
    assert first_line_after_title.startswith("2026-01-01T00:00:00+00:00 at `0123abc` · Test CPU")


def test_table_methods_come_from_the_registry_modalities(leaderboard, monkeypatch):
    from dpsynth.methods.registry import get_method

    expected = [m for m in registry.method_names() if "table" in get_method(m).modalities]
    assert leaderboard.table_methods() == expected
    assert {"dpkernel", "rdpgan"} <= set(expected) and "pge" not in expected
    assert leaderboard.is_table("german-credit") and not leaderboard.is_table("digits")
    # The table path trains `small` (or --preset): every table method must ship it.
    assert all("small" in (get_method(m).table_presets or get_method(m).presets) for m in expected)
    assert leaderboard.default_synthetic_n("csv:x.csv") == 20_000
    assert leaderboard._stem("csv:/a/census_income_kdd_train.csv.gz") == (
        "leaderboard-census_income_kdd_train"
    )


def test_table_leaderboard_on_german_credit_tiny(
    leaderboard, tmp_path, one_torch_thread, monkeypatch
):
    from typer.testing import CliRunner

    from dpsynth.cli import app

    def in_process(args):  # the CLI in this process: no interpreter start-up per command
        result = CliRunner().invoke(app, [*args, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout), 0.0

    # Every row runs the CLI through bench/leaderboard_runs.py's run_cli.
    monkeypatch.setattr(importlib.import_module("bench.leaderboard_runs"), "run_cli", in_process)
    out = tmp_path / "lb.json"
    leaderboard.main(
        ["--data", "german-credit", "--methods", "rdpgan", "--epsilon", "1", "--preset", "tiny",
         "--n", "300", "--seeds", "1", "--json", str(out)]
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert report["modality"] == "table" and report["test"] == "german-credit:test"
    assert 0.6 <= report["majority_class_rate"] <= 0.8
    real, (row,) = report["real"], report["rows"]
    assert "error" not in row, row
    assert 0.72 <= real["logreg_roc_auc_mean"] <= 0.9  # the real-trained reference
    assert row["method"] == "rdpgan" and float(row["epsilon"]) <= 1.0 and row["n"] == 300
    for key in ("logreg_accuracy", "logreg_roc_auc", "gbm_accuracy", "gbm_roc_auc"):
        assert 0.0 <= row[f"{key}_mean"] <= 1.0
    page = (tmp_path / "lb.md").read_text()
    assert "| real train data | – | – |" in page and "| rdpgan | tiny | 1 |" in page
    assert "Majority-class accuracy on the test table" in page


def test_table_rows_combine_training_runs(leaderboard):
    runs = [
        {"method": "m", "train_seconds": t, **{f"{k}_mean": v for k in leaderboard.SCORE_KEYS}}
        for t, v in ((10.0, 0.6), (20.0, 0.8))
    ]
    row = leaderboard.combine_runs(runs)
    assert row["runs"] == 2 and row["train_seconds"] == 15.0 and row["per_run"] == runs
    assert row["logreg_roc_auc_mean"] == pytest.approx(0.7)
    assert row["gbm_accuracy_std"] == pytest.approx(0.1)


def test_images_take_their_held_out_split_from_test(leaderboard, tmp_path, monkeypatch):
    """`--test` names the held-out split of any data (here the unseen 28×28 set of
    bench/digits28.py): the evaluation, the real row and the DP-SGD row read it."""
    args = leaderboard.parse_args(["--data", "npz:train.npz", "--test", "npz:test.npz"])
    assert leaderboard.test_spec(args) == "npz:test.npz"
    assert leaderboard.test_spec(leaderboard.parse_args(["--data", "digits"])) == "digits:test"
    module = importlib.import_module("bench.digits28")
    x, y, classes = module.upscaled("digits:test")
    assert x.shape == (360, 1, 28, 28) and x.dtype.name == "uint8" and len(y) == 360
    assert list(classes) == [str(c) for c in range(10)]
    import numpy as np

    np.savez(tmp_path / "train.npz", x=x[:200], y=y[:200], classes=classes)
    monkeypatch.setitem(leaderboard.DPSGD_SCHEDULE, "epochs", 1.0)
    row = leaderboard.dpsgd_row(
        f"npz:{tmp_path / 'train.npz'}", "10", 1, "cpu", f"npz:{tmp_path / 'train.npz'}"
    )
    assert 0.0 <= row["cnn_mean"] <= 1.0
    with pytest.raises(UsageError, match="no such file or folder"):
        leaderboard.dpsgd_row(
            f"npz:{tmp_path / 'train.npz'}", "10", 1, "cpu", f"npz:{tmp_path / 'missing.npz'}"
        )


def test_ablation_rows_measure_each_stage_once(leaderboard):
    """`--ablation`: the preset, the method alone, with the teacher and both, each with the
    settings the method's preset has; a variant that changes nothing new is not run twice."""
    digits = DataInfo("digits", "builtin", 1437, (1, 8, 8), tuple("0123456789"), "f", "digits")
    mnist = dataclasses.replace(digits, spec="mnist-5k", n=4000, shape=(1, 28, 28))
    args = leaderboard.parse_args(["--data", "mnist-5k", "--ablation", "--variant", "x:steps=7"])
    pge = dict(leaderboard.method_variants("pge", "10", args, mnist))
    assert list(pge) == ["preset", "alone", "teacher", "both", "x"]
    assert pge["preset"] == []
    assert {"frequency_share=0", "warm_start_share=0"} <= set(pge["alone"])
    assert "teacher_share=0.5" in pge["teacher"] and "frequency_share=0" in pge["teacher"]
    assert "teacher_share=0.5" in pge["both"] and "frequency_share=0" not in pge["both"]
    # freq's release is the frequency model: alone is its preset, both is its teacher row,
    # and it has no `steps` for x to change.
    freq = leaderboard.method_variants("freq", "10", args, mnist)
    assert [name for name, _ in freq] == ["preset", "teacher"]
    assert leaderboard.parse_args(["--data", "mnist-5k"]).ablation is False
    plain = leaderboard.parse_args(["--data", "mnist-5k"])
    assert leaderboard.method_variants("pge", "10", plain, mnist) == [None]
    report_variants = dict(leaderboard.requested_variants(args))
    assert set(report_variants) == {"preset", "alone", "teacher", "both", "x"}


def test_the_dpsgd_reference_pretrains_on_declared_public_images(
    leaderboard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `--public`, the reference classifier first fits the public images, as the DP teacher
    does; at an ε whose noise leaves a CNN at chance, that is what it then knows."""
    import numpy as np

    from dpsynth.data.sources import load_data

    digits = load_data("digits")
    x, y = digits.x.numpy(), digits.y.numpy()
    classes = np.asarray(digits.classes)
    np.savez(tmp_path / "public.npz", x=x, y=y, classes=classes)
    np.savez(tmp_path / "other.npz", x=x, y=y % 5, classes=classes[:5])
    monkeypatch.setitem(leaderboard.DPSGD_SCHEDULE, "epochs", 1.0)
    plain = leaderboard.dpsgd_row("digits", "0.05", 1, "cpu")
    helped = leaderboard.dpsgd_row(
        "digits", "0.05", 1, "cpu", public=f"npz:{tmp_path / 'public.npz'}"
    )
    assert plain["cnn_mean"] < 0.4 and plain["public"] is None
    assert helped["cnn_mean"] > plain["cnn_mean"] + 0.3
    assert helped["public"].endswith("public.npz")
    assert helped["epsilon"] <= 0.05 + 1e-9  # the public steps cost nothing
    with pytest.raises(SystemExit, match="classes"):
        leaderboard.dpsgd_row("digits", "0.05", 1, "cpu", public=f"npz:{tmp_path / 'other.npz'}")


def test_methods_none_runs_only_the_references(leaderboard, tmp_path: Path) -> None:
    out = tmp_path / "none.json"
    leaderboard.main(
        ["--data", "digits", "--methods", "none", "--no-real", "--no-dpsgd",
         "--json", str(out), "--markdown", str(tmp_path / "none.md")]
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert report["rows"] == [] and report["dpsgd"] == []


def test_with_public_images_the_board_scores_them_alone_as_a_release(
    leaderboard, tmp_path: Path
) -> None:
    """With `--public`, a row evaluates the public images as if they were the release (the bar
    a release that uses them has to clear): images that are the data score like the data, and
    the same images under shifted labels do not."""
    import numpy as np

    from dpsynth.data.sources import load_data

    digits = load_data("digits")
    x, y = digits.x.numpy(), digits.y.numpy()
    classes = np.asarray(digits.classes)
    np.savez(tmp_path / "public.npz", x=x, y=y, classes=classes)
    np.savez(tmp_path / "shifted.npz", x=x, y=(y + 1) % 10, classes=classes)
    scores = {}
    for name in ("public", "shifted"):
        out = tmp_path / f"{name}.json"
        leaderboard.main(
            ["--data", "digits", "--methods", "none", "--no-real", "--no-dpsgd", "--no-fid",
             "--seeds", "1", "--public", f"npz:{tmp_path / name}.npz",
             "--grids", str(tmp_path / f"grids-{name}"),
             "--json", str(out), "--markdown", str(tmp_path / f"{name}.md")]
        )  # fmt: skip
        report = json.loads(out.read_text())
        row = report["public_images"]
        assert row["method"] == leaderboard.PUBLIC_METHOD and row["n"] == len(y)
        assert row["epsilon"] is None and report["rows"] == []
        assert (tmp_path / f"grids-{name}" / "digits" / "public-images.png").is_file()
        assert f"| {leaderboard.PUBLIC_METHOD} |" in (tmp_path / f"{name}.md").read_text()
        scores[name] = row["cnn_mean"]
    assert scores["public"] > 0.8 and scores["shifted"] < 0.3
    plain = leaderboard.parse_args(["--data", "digits", "--public", "npz:p.npz", "--no-public-row"])
    assert plain.no_public_row


def test_grids_of_a_data_file_go_in_one_folder_named_after_it(leaderboard) -> None:
    assert leaderboard.grid_folder("mnist-5k") == "mnist-5k"
    assert leaderboard.grid_folder("npz:/tmp/digits28/train.npz") == "npz-digits28-train"
    assert "/" not in leaderboard.grid_folder("folder:/srv/data/images")
