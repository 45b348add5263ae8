"""`dpsynth audit` through each mechanism's own code: the frequency model, AIM's and MST's
marginal measurements and selections, and the black-box audit of a whole table run."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from scipy.stats import binom
from typer.testing import CliRunner

import dpsynth.auditing.frequency as audit_frequency
import dpsynth.auditing.marginal as audit_marginal
import dpsynth.sampling
from dpsynth.auditing import planned_audit as audit_run
from dpsynth.auditing.blackbox import canary_rows, match_scores, run_blackbox
from dpsynth.auditing.bound import p_value
from dpsynth.cli import app
from dpsynth.data.builtin_tables import TABLE_BUILTINS, TABLES_DIR
from dpsynth.errors import UsageError
from dpsynth.methods.marginal.domain import table_domain
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.events import PureDp
from dpsynth.privacy.releases.frequency import FrequencyPlan, frequency_statistics

runner = CliRunner()


# ----------------------------------------------------------------- the frequency model


def test_the_frequency_release_runs_through_frequency_statistics(monkeypatch):
    calls = []

    def spy(x, y, num_classes, plan):
        calls.append(int(x.shape[0]))
        return frequency_statistics(x, y, num_classes, plan)

    monkeypatch.setattr(audit_frequency, "frequency_statistics", spy)
    result = audit_run.run_audit("freq", "small", 1.0, canaries=3000, seed=1)
    assert 0 < sum(calls) < 3000  # the included canaries, about half, as records
    assert result.mode == "white-box (frequency model)"
    assert result.verdict == "pass" and result.lower_bound <= result.claimed_epsilon


@pytest.mark.parametrize("broken", ["noise:8", "sensitivity:8"])
def test_a_wrong_noise_or_sensitivity_in_the_frequency_model_is_caught(broken):
    result = audit_run.run_audit("freq", "small", 1.0, canaries=3000, seed=2, break_mode=broken)
    assert result.broken == broken
    assert result.lower_bound > result.claimed_epsilon and result.verdict == "FAIL"


def test_a_bug_in_the_statistic_itself_is_caught(monkeypatch):
    """Counts weighted 8× more than the sensitivity allows (a bug in the code, not --break)."""

    def overweighted(x, y, num_classes, plan):
        return frequency_statistics(x, y, num_classes, plan) * 8.0

    monkeypatch.setattr(audit_frequency, "frequency_statistics", overweighted)
    result = audit_run.run_audit("freq", "small", 1.0, canaries=3000, seed=3)
    assert result.broken is None and result.lower_bound > result.claimed_epsilon


def test_a_plan_with_a_frequency_stage_audits_it_beside_its_steps():
    """pge `mnist`: the release through its own code with the DP-SGD steps; Δ 8× too small
    is caught (the generic full-batch step never called the statistic: issue 48)."""
    honest = audit_run.run_audit("pge", "mnist", 1.0, canaries=3000, seed=4, data="mnist-5k")
    assert honest.mode == "white-box (frequency model + dpsgd)"
    assert honest.lower_bound <= honest.claimed_epsilon
    broken = audit_run.run_audit(
        "pge", "mnist", 1.0, canaries=3000, seed=4, data="mnist-5k", break_mode="sensitivity:8"
    )
    assert broken.lower_bound > broken.claimed_epsilon


def test_a_frequency_canary_meets_the_sensitivity_exactly():
    """One canary with its own label moves the statistic by √(2 + w²) (class moments), the
    plan's Δ: the audit's canary is the worst case, not a weaker record."""
    plan = FrequencyPlan(1.0, 10, 16.8, 0.5, "class")
    image = audit_frequency.canary_image((1, 28, 28))
    stats = frequency_statistics(image[None], torch.zeros(1, dtype=torch.int64), 1, plan)
    assert float(stats.norm()) == pytest.approx(plan.sensitivity, rel=1e-9)


def test_a_sensitivity_break_of_dpsgd_steps_is_their_clip_break():
    """A DP-SGD step's sensitivity is its clipping norm: both breaks give the same run."""
    clip, sensitivity = (
        audit_run.run_audit("pge", "tiny", 1.0, canaries=1000, seed=0, break_mode=mode)
        for mode in ("clip:4", "sensitivity:4")
    )
    assert clip.lower_bound == sensitivity.lower_bound > clip.claimed_epsilon
    with pytest.raises(UsageError, match="--break must be one of clip, noise, sensitivity"):
        audit_run.run_audit("pge", "tiny", 1.0, canaries=100, seed=0, break_mode="delta")


# ----------------------------------------------------------------- tables


def _mst(**kwargs):
    return audit_run.run_audit("mst", "small", 1.0, data="german-credit", **kwargs)


def test_mst_on_german_credit_passes_both_parts():
    result = _mst(canaries=1000, seed=5)
    assert result.verdict == "pass" and result.mode == "white-box (marginal)"
    assert [p["verdict"] for p in result.parts] == ["pass", "pass"]
    kinds = " ".join(p["mechanism"] for p in result.parts)
    assert "measurements" in kinds and "pure DP" in kinds
    assert "no row is read" in result.note


@pytest.mark.parametrize("broken", ["noise:8", "sensitivity:8"])
def test_mst_breaks_are_caught(broken):
    result = _mst(canaries=1000, seed=6, break_mode=broken)
    assert result.verdict == "FAIL"
    measurement = result.parts[0]
    assert measurement["lower_bound"] > measurement["claimed_epsilon"]


@pytest.mark.parametrize("broken", [None, "noise:2", "sensitivity:2", "noise:16"])
def test_the_selection_audit_catches_its_error_and_passes_a_sound_selection(broken):
    """One selection through `MarginalQueries.select` at ε_s = 0.5, against ε_s with the pure-DP
    test: sound passes; ε_s × 2, a quality moved 2× by a record, and ε_s × 16 are caught
    (20,000 canaries × 2 runs, the most selections a run takes: the trials test)."""
    domain = _german_domain()
    event = PureDp(0.5, 1)
    (part,), _ = audit_marginal.audit_marginal_plan(
        domain, [event], 1e-4, audit_marginal.SELECTION_CANARIES, 0.95, seed=7,
        break_mode=broken, runs=2,
    )  # fmt: skip
    assert "pure DP" in part.mechanism and part.claimed_epsilon == 0.5
    assert part.outcome.trials is not None
    assert part.leaks == (broken is not None)
    # the family test (the odds ratio of the exponential mechanism on the R = 1 canaries)
    # measures ε_s's factor near 2×; at 16× that candidate vanishes and the trials test's
    # R = 1/8 canaries catch it
    factor = part.outcome.family.factor
    assert factor <= 1.0 if broken is None else (factor > 1.0 or broken == "noise:16")


def _german_domain():
    from dpsynth.methods.marginal.domain import table_domain
    from dpsynth.methods.registry import get_method

    info = audit_run.describe("german-credit")
    return table_domain(info, get_method("mst").config("small", {}, info))


def test_aim_passes_and_table_breaks_are_named():
    result = audit_run.run_audit("aim", "small", 1.0, data="german-credit", canaries=600, seed=8)
    assert result.verdict == "pass"
    with pytest.raises(UsageError, match="noise, sensitivity"):
        _mst(canaries=100, seed=0, break_mode="clip")


def test_table_canaries_are_records_in_distinct_cells():
    info = audit_run.describe("german-credit")
    domain = table_domain(info, get_method("mst").config("small", {}, info))
    clique = audit_marginal.canary_clique(domain, 1000)
    codes = audit_marginal.canary_codes(domain, clique, 1000)
    cells = np.ravel_multi_index(
        tuple(codes[:, j] for j in clique), [domain.sizes[j] for j in clique]
    )
    assert len(set(cells.tolist())) == 1000


def test_a_table_method_on_images_and_a_schema_on_images_are_refused():
    with pytest.raises(UsageError, match="audits tables"):
        audit_run.run_audit("mst", "small", 1.0, canaries=100)
    with pytest.raises(UsageError, match="--schema applies to a table"):
        audit_run.run_audit("pge", "tiny", 1.0, canaries=100, schema="x.json")


def test_audit_a_csv_file_with_its_schema(tmp_path):
    """csv:PATH --schema FILE: N is the file's record count; nothing else is read."""
    table = TABLE_BUILTINS["german-credit"]
    data = tmp_path / "credit.csv"
    shutil.copy(TABLES_DIR / table.file, data)
    assert audit_run.describe(f"csv:{data}", str(TABLES_DIR / table.schema_file)).n == 1000
    result = runner.invoke(
        app,
        [
            "audit", "--method", "mst", "--preset", "small", "--epsilon", "1",
            "--data", f"csv:{data}", "--schema", str(TABLES_DIR / table.schema_file),
            "--canaries", "400", "--seed", "9", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["verdict"] == "pass" and len(out["parts"]) == 2 and out["canaries"] == 400
    missing = runner.invoke(
        app, ["audit", "--method", "mst", "--epsilon", "1", "--data", f"csv:{data}"]
    )
    assert missing.exit_code == 2 and "--schema" in missing.output


def test_the_pure_dp_p_value_is_the_binomial_tail():
    """δ = 0 is the pure-DP test (Theorem 3.1): no 2·m·δ term."""
    accuracy = math.exp(0.7) / (1 + math.exp(0.7))
    assert p_value(500, 60, 45, 0.7, 0.0) == pytest.approx(binom.sf(44, 60, accuracy))


# ----------------------------------------------------------------- black box


def test_match_scores_count_the_columns_the_nearest_row_reproduces():
    schema = TABLE_BUILTINS["german-credit"].schema()
    header = tuple(c.name for c in schema.columns)
    canaries = canary_rows(schema, header, 5, seed=0)
    synthetic = canaries.iloc[[2]].copy()
    scores = match_scores(schema, canaries, synthetic)
    assert scores[2] == len(schema.features) + 1
    assert bool((scores[[0, 1, 3, 4]] < scores[2]).all())


def test_black_box_mst_run_passes_and_a_copying_release_is_caught(monkeypatch, tmp_path):
    honest = run_blackbox("mst", "tiny", 1.0, canaries=40, seed=1, workdir=tmp_path)
    assert honest.method == "mst" and not honest.leaks
    assert 0.0 <= honest.lower_bound <= honest.claimed_epsilon <= 1.0
    assert 0 < honest.canaries_in < 40

    def copy_training_rows(run, n, out, **kwargs):
        # A "release" that copies its training table: every member is reproduced exactly.
        shutil.copy(run.parent / "train.csv", out)
        return {}

    monkeypatch.setattr(dpsynth.sampling, "sample_table", copy_training_rows)
    leaky = run_blackbox("mst", "tiny", 1.0, canaries=40, seed=1, workdir=tmp_path)
    assert leaky.leaks and leaky.lower_bound > leaky.claimed_epsilon


def test_black_box_needs_a_built_in_table():
    result = runner.invoke(app, ["audit", "--method", "mst", "--epsilon", "1", "--black-box"])
    assert result.exit_code == 2 and "built-in table" in result.output


# ----------------------------------------------------------------- central images


def test_central_images_run_through_noisy_statistics_and_a_wrong_delta_is_caught(monkeypatch):
    """psg `small`: the central-images release through `noisy_statistics` beside the DP-SGD
    steps, judged also against its own event's claim; Δ 8× too small is caught there."""
    import dpsynth.auditing.central as audit_central

    calls = []
    real = audit_central.noisy_statistics

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(audit_central, "noisy_statistics", spy)
    honest = audit_run.run_audit("psg", "small", 1.0, canaries=3000, seed=10)
    assert calls and honest.mode == "white-box (central images + dpsgd)"
    assert honest.verdict == "pass" and honest.parts[0]["verdict"] == "pass"
    broken = audit_run.run_audit(
        "psg", "small", 1.0, canaries=3000, seed=10, break_mode="sensitivity:8"
    )
    own = broken.parts[0]
    assert "central images" in own["mechanism"] and own["claimed_epsilon"] < broken.claimed_epsilon
    assert own["lower_bound"] > own["claimed_epsilon"] and broken.verdict == "FAIL"
