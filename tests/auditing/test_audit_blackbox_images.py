"""`dpsynth audit --black-box` on an image method: canary images through the real `train` →
`sample`, scored from the released images only."""

from __future__ import annotations

import json
import shutil

import numpy as np

import dpsynth.sampling.images
import dpsynth.training.entry
from dpsynth.auditing.blackbox_images import canary_images, nearest_scores, run_image_blackbox


def test_nearest_scores_rank_a_reproduced_canary_first():
    pixels, labels = canary_images((1, 8, 8), 2, 4, seed=0)
    released = np.concatenate([pixels[[2]], np.zeros((3, 1, 8, 8), dtype=np.uint8)])
    scores = nearest_scores(pixels, labels, released, np.array([0, 0, 1, 1]))
    assert float(scores[2]) == 0.0 and bool((scores[[0, 1, 3]] < 0).all())
    assert set(np.unique(pixels)) <= {0, 255} and list(labels) == [0, 1, 0, 1]


def test_an_image_run_passes_and_a_copying_release_is_caught(monkeypatch, tmp_path):
    honest = run_image_blackbox(
        "freq", "tiny", 1.0, canaries=40, seed=1, workdir=tmp_path, synthetic_images=300
    )
    assert honest.method == "freq" and not honest.leaks
    assert 0.0 <= honest.lower_bound <= honest.claimed_epsilon <= 1.0
    assert 0 < honest.canaries_in < 40 and honest.synthetic_rows == 300

    def no_training(**fields):
        (fields["out"]).mkdir()
        return {"method": "freq", "preset": "tiny", "epsilon": 1.0, "delta": 1e-5}

    def copy_training_images(run, n, out, **kwargs):
        # A "release" that copies its training images: every member is reproduced exactly.
        out.mkdir()
        shutil.copy(run.parent / "train.npz", out / "samples.npz")
        return {}

    monkeypatch.setattr(dpsynth.training.entry, "train_run", no_training)
    monkeypatch.setattr(dpsynth.sampling.images, "sample_run", copy_training_images)
    leaky = run_image_blackbox("freq", "tiny", 1.0, canaries=40, seed=1, workdir=tmp_path)
    assert leaky.leaks and leaky.lower_bound > leaky.claimed_epsilon
    assert leaky.correct == leaky.guesses


def test_a_method_of_both_modalities_is_audited_on_the_image_set_it_is_given():
    """dpkernel trains tables and images: `--black-box --data digits` audits its image run
    (canary images, scored from the released images), not a table run."""
    from typer.testing import CliRunner

    from dpsynth.cli import app

    result = CliRunner().invoke(app, [
        "audit", "--black-box", "--method", "dpkernel", "--preset", "tiny", "--data", "digits",
        "--epsilon", "1", "--canaries", "40", "--seed", "0", "--json",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["method"] == "dpkernel" and out["data"] == "digits"
    assert "released images" in out["mode"] and out["verdict"] == "pass"
