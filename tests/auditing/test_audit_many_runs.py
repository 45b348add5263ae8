"""The many-run audit (`--runs R`): the trials test's power at millions of trials, `--break`
as a documented user option, and `--set` for the black-box audit."""

from __future__ import annotations

import math

from gaussian_reference import gaussian_mu, gaussian_scores
from typer.testing import CliRunner

import dpsynth.auditing.marginal as audit_marginal
import dpsynth.training.entry as entry
from dpsynth.auditing import planned_audit as audit_run
from dpsynth.auditing.limits import audit_memory
from dpsynth.auditing.trials import SELECTION_STRIDE, trials_bound
from dpsynth.cli import app

runner = CliRunner()


def test_ten_million_trials_are_tight_for_a_sound_gaussian_and_catch_root_two():
    """An exactly (1, 1e-5)-DP Gaussian release: 10,000,000 trials (about what a marginal
    audit runs in two minutes) give a bound of at least 0.8 and at most 1 (the expected best is
    0.85, in a tail of about 2e-4); with the noise √2
    too small (true ε ≈ 1.5) the bound of 4,000,000 trials exceeds the claim."""
    mu = gaussian_mu(1.0, 1e-5)
    scores, included = gaussian_scores(mu, 10_000_000, 0)
    sound = trials_bound(scores, included, 1e-5, 0.95)
    assert 0.8 <= sound.lower_bound <= 1.0
    scores, included = gaussian_scores(math.sqrt(2.0) * mu, 4_000_000, 1)
    assert trials_bound(scores, included, 1e-5, 0.95).lower_bound > 1.0


def test_a_sound_mechanism_is_not_caught_on_many_seeds_at_a_million_trials():
    """Soundness of the finer selection: the chosen region is judged on other canaries, so
    an exactly (1, 1e-5)-DP release stays under 1 at every seed."""
    mu = gaussian_mu(1.0, 1e-5)
    for seed in range(6):
        scores, included = gaussian_scores(mu, 1_000_000, 100 + seed)
        outcome = trials_bound(scores, included, 1e-5, 0.95)
        assert outcome.lower_bound <= 1.0
        assert outcome.trials_in + outcome.trials_out == 1_000_000 - 1_000_000 // SELECTION_STRIDE


def test_break_is_a_documented_option():
    help_text = runner.invoke(app, ["audit", "--help"], terminal_width=200).output
    assert "--break" in help_text and "noise:F" in help_text and "sensitivity:F" in help_text
    result = runner.invoke(
        app,
        ["audit", "--method", "pge", "--preset", "tiny", "--epsilon", "1", "--canaries", "500",
         "--seed", "0", "--break", "noise:2"],
    )  # fmt: skip
    assert "BROKEN on purpose: --break noise:2" in result.output


def test_black_box_takes_set_and_hands_it_to_train(monkeypatch):
    """`audit --black-box --set k=v` trains the run with `train`'s overrides."""
    seen: dict = {}

    class Stop(Exception):
        pass

    def fake_train_run(**keywords):
        seen.update(keywords)
        raise Stop

    monkeypatch.setattr(entry, "train_run", fake_train_run)
    result = runner.invoke(
        app,
        ["audit", "--method", "mst", "--epsilon", "1", "--data", "german-credit", "--black-box",
         "--canaries", "20", "--set", "degree=2", "--debug"],
    )  # fmt: skip
    assert isinstance(result.exception, Stop), result.output
    assert seen["overrides"] == {"degree": "2"} and seen["method"] == "mst"


def test_a_marginal_audit_of_a_million_canaries_fits_and_its_selections_are_capped(monkeypatch):
    """The measurements take millions of canaries (a few words each, not a DP-SGD batch's);
    the selections, one `select` call each, take at most `SELECTION_CANARIES` a run."""
    plan = audit_run.plan_for("mst", "small", 1.0, "german-credit")
    assert audit_memory("marginal", plan, 1_000_000) < 2**30
    monkeypatch.setattr(audit_marginal, "SELECTION_CANARIES", 300)
    result = audit_run.run_audit(
        "mst", "small", 1.0, data="german-credit", canaries=4000, runs=2, seed=0
    )
    measured, selected = result.parts
    assert measured["canaries"] == 8000 and selected["canaries"] == 600
    assert result.verdict == "pass"
