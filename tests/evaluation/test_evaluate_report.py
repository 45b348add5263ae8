"""run_evaluation end to end: sample folders and run dirs, report files, ledger warnings and the
zero-cost release record."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dpsynth.data.sources import load_data
from dpsynth.errors import UsageError
from dpsynth.evaluation.feature_cache import caching
from dpsynth.evaluation.report import run_evaluation
from dpsynth.ledger import Ledger
from dpsynth.ledger.key import FingerprintKey


def _write_sample_folder(out: Path, skip_class: str | None = None, per_class: int = 30) -> None:
    """A folder as `sample` writes it: OUT/<class>/<index>.png, labels.csv, manifest.json."""
    data = load_data("digits")
    rows = ["file,label,class"]
    index = 0
    for label, name in enumerate(data.classes):
        if name == skip_class:
            continue
        (out / name).mkdir(parents=True, exist_ok=True)
        for img in data.x[data.y == label][:per_class]:
            file = f"{name}/{index:06d}.png"
            Image.fromarray(img[0].numpy()).save(out / file)
            rows.append(f"{file},{label},{name}")
            index += 1
    (out / "labels.csv").write_text("\n".join(rows) + "\n")
    manifest = {
        "run_id": "run123",
        "method": "pge",
        "ledger": {"dataset_id": "digits", "fingerprint": FingerprintKey.fresh().fingerprint("d")},
    }
    (out / "manifest.json").write_text(json.dumps(manifest))


def test_folder_evaluation_writes_report_and_records_release(tmp_path) -> None:
    synth = tmp_path / "synth"
    _write_sample_folder(synth, skip_class="9")
    ledger = tmp_path / "ledger.jsonl"
    stages: list[str] = []
    result = run_evaluation(
        synthetic=str(synth),
        real="digits:test",
        metrics=["accuracy"],
        classifier="logreg",
        report_dir=tmp_path / "report",
        ledger_path=ledger,
        progress=lambda stage, done, total: stages.append(stage),
    )
    acc = result["metrics"]["accuracy"]
    assert result["n_synthetic"] == 270 and result["real"] == "digits:test"
    assert acc["per_class"]["9"] == 0.0 and acc["per_class"]["0"] > 0.8
    assert any("class(es) 9" in w for w in result["warnings"])
    assert "accuracy" in stages
    report = tmp_path / "report"
    for name in ("report.json", "report.md", "samples.png", "per_class_accuracy.png"):
        assert (report / name).is_file(), name
    assert not (report / "epsilon_curve.png").exists()  # a folder has no training log
    assert Image.open(report / "samples.png").size[0] > 100
    saved = json.loads((report / "report.json").read_text())
    assert saved["metrics"] == result["metrics"]
    assert "![Synthetic samples" in (report / "report.md").read_text()
    # the release is a zero-cost ledger line carrying the hash of report.json
    release = [e for e in Ledger(ledger).entries() if e.get("kind") == "release"]
    assert len(release) == 1 and release[0]["epsilon"] == 0.0
    assert release[0]["dataset_id"] == "digits" and release[0]["command"] == "evaluate"
    expected = hashlib.sha256((report / "report.json").read_bytes()).hexdigest()
    assert release[0]["output_sha256"] == expected
    # the report's real images are named as not covered by the spend
    assert release[0]["details"]["non_private_contents"] == [
        "samples.png shows real records of the reference set"
    ]
    assert not list(report.glob(".*tmp"))  # no temporary files left behind


def test_evaluating_on_training_data_warns_loudly(tmp_path) -> None:
    synth = tmp_path / "synth"
    _write_sample_folder(synth, per_class=10)
    ledger = tmp_path / "ledger.jsonl"
    train = load_data("digits")
    Ledger(ledger).reserve(
        dataset_id="digits",
        fingerprint=Ledger(ledger).data_fingerprint(train.content_digest),
        command="train",
        method="pge",
        run_id="run123",
        events=[{"type": "gaussian", "noise_multiplier": 5.0, "count": 1}],
        delta=1e-5,
    )
    kwargs = dict(synthetic=str(synth), metrics=["accuracy"], classifier="logreg")
    on_train = run_evaluation(real="digits", ledger_path=ledger, **kwargs)
    assert any("NOT private" in w and "run123" in w for w in on_train["warnings"])
    held_out = run_evaluation(real="digits:test", ledger_path=ledger, **kwargs)
    assert not any("NOT private" in w for w in held_out["warnings"])
    upper = run_evaluation(real="digits:test", real_train="digits", ledger_path=ledger, **kwargs)
    assert upper["metrics"]["accuracy"]["real_train_accuracy"] > 0.85
    assert any("--real-train digits" in w and "NOT private" in w for w in upper["warnings"])
    assert held_out["non_private_contents"] == []
    assert "metrics on data that DP training spent budget on" in on_train["non_private_contents"]
    assert any("real training data" in r for r in upper["non_private_contents"])


def test_run_directory_is_sampled_and_gets_an_epsilon_curve(tmp_path, monkeypatch) -> None:
    import dpsynth.sampling

    run = tmp_path / "run"
    run.mkdir()
    # The run is anchored to its spend: the privacy statement of the evaluation comes from it.
    ledger = tmp_path / "ledger.jsonl"
    events = [{"type": "gaussian", "noise_multiplier": 5.0, "count": 1}]
    spend = Ledger(ledger).reserve(
        dataset_id="digits", fingerprint="f" * 64, command="train", method="pge", run_id="r9",
        events=events, delta=1e-5,
    )  # fmt: skip
    (run / "config.json").write_text(
        json.dumps(
            {
                "run_id": "r9",
                "method": "pge",
                "data": {"dataset_id": "digits", "fingerprint": "f" * 64},
                "privacy": {"events": events},
                "ledger": {"spend_seq": spend["seq"], "spend_hash": spend["hash"]},
            }
        )
    )
    log = [{"step": s, "epsilon": 0.1 * s, "loss": 1.0 / (s + 1)} for s in range(1, 21)]
    (run / "train-log.jsonl").write_text("\n".join(json.dumps(row) for row in log) + "\n")
    train = load_data("digits")
    calls = []

    def fake_generate(run_dir, n, seed=0, device="auto"):
        calls.append(n)
        # class names in reverse order: labels must be mapped by name, not by index
        reversed_classes = tuple(reversed(train.classes))
        return train.x[:n], 9 - train.y[:n], reversed_classes

    monkeypatch.setattr(dpsynth.sampling, "generate", fake_generate)
    result = run_evaluation(
        synthetic=str(run),
        real="digits:test",
        metrics=["accuracy"],
        classifier="logreg",
        report_dir=tmp_path / "report",
        ledger_path=ledger,
    )
    assert calls == [360]  # default n: the size of the real reference set
    assert result["synthetic_source"] == "run" and result["provenance"]["run_id"] == "r9"
    assert result["metrics"]["accuracy"]["mean"] > 0.85  # labels mapped back by name
    assert (tmp_path / "report" / "epsilon_curve.png").is_file()
    assert result["privacy"]["epsilon"] == spend["epsilon"]
    assert result["privacy"]["ledger_seq"] == spend["seq"]


def test_bad_metric_and_device_are_usage_errors(tmp_path) -> None:
    with pytest.raises(UsageError, match=r"^metrics takes") as metric:
        run_evaluation(synthetic=str(tmp_path), real="digits:test", metrics=["bleu"])
    assert metric.value.parameter == "metrics"
    with pytest.raises(UsageError, match=r"^device must be") as device:
        run_evaluation(synthetic=str(tmp_path), real="digits:test", metrics=["fid"], device="tpu")
    assert device.value.parameter == "device"


def test_folder_subset_is_seeded(tmp_path) -> None:
    synth = tmp_path / "synth"
    _write_sample_folder(synth, per_class=5)
    from dpsynth.evaluation.folders import load_synthetic

    a = load_synthetic(synth, tuple(str(d) for d in range(10)), (1, 8, 8), n=20)
    b = load_synthetic(synth, tuple(str(d) for d in range(10)), (1, 8, 8), n=20)
    assert torch.equal(a.x, b.x) and len(a.y) == 20
    assert a.provenance["dataset_id"] == "digits"
    with pytest.raises(UsageError):
        load_synthetic(synth, tuple(str(d) for d in range(10)), (1, 8, 8), n=51)
    assert np.unique(a.y.numpy()).size > 1


class _TinyFeatures(torch.nn.Module):
    """A stand-in TorchScript feature network with the Inception interface: [N,3,299,299] ->
    [N, 2048]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 5, stride=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = torch.nn.functional.adaptive_avg_pool2d(self.conv(x), (16, 16))
        return pooled.flatten(1)


def test_fid_precision_recall_through_run_evaluation_with_given_weights(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("DPSYNTH_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    weights = tmp_path / "tiny.pt"
    torch.jit.save(torch.jit.script(_TinyFeatures()), str(weights))
    synth = tmp_path / "synth"
    _write_sample_folder(synth, per_class=20)
    kwargs = dict(
        synthetic=str(synth),
        real="digits:test",
        metrics=["fid", "precision", "recall"],
        inception_weights=str(weights),
        report_dir=tmp_path / "report",
    )
    with caching(True):  # what `evaluate --cache-real-features` asks for
        first = run_evaluation(**kwargs)
        # the second run reads the real set's features from the cache (no FID: slow on CPU)
        second = run_evaluation(
            **{**kwargs, "metrics": ["precision", "recall"], "report_dir": None}
        )
    fid = first["metrics"]["fid"]
    assert fid["value"] > 0 and fid["reference"] == "digits:test"
    assert fid["n_synthetic"] == 200 and fid["n_real"] == 360
    assert fid["weights"] == str(weights)
    assert "fid" not in second["metrics"]
    assert not fid["real_features_cached"] and second["metrics"]["recall"]["real_features_cached"]
    for name in ("precision", "recall"):
        assert 0.0 <= first["metrics"][name]["value"] <= 1.0
        assert second["metrics"][name]["value"] == first["metrics"][name]["value"]
    assert any("FID from fewer than" in w for w in first["warnings"])
    assert "| FID |" in (tmp_path / "report" / "report.md").read_text()


# --- evaluation on private data is structural (issue 9.4) -----------------------------------


def _write_npz(path: Path, data, keep: slice = slice(None)) -> None:
    np.savez(
        path, x=data.x[keep, 0].numpy(), y=data.y[keep].numpy(), classes=np.array(data.classes)
    )


def _reserve(ledger: Path, dataset_id: str, fingerprint: str) -> None:
    Ledger(ledger).reserve(
        dataset_id=dataset_id,
        fingerprint=fingerprint,
        command="train",
        method="pge",
        run_id="run123",
        events=[{"type": "gaussian", "noise_multiplier": 5.0, "count": 1}],
        delta=1e-5,
    )


def test_training_data_minus_one_record_is_marked_non_private(tmp_path) -> None:
    synth = tmp_path / "synth"
    _write_sample_folder(synth, per_class=5)
    digits = load_data("digits")
    real = tmp_path / "real.npz"
    _write_npz(real, digits)
    trained_on = load_data(f"npz:{real}")
    ledger = tmp_path / "ledger.jsonl"
    _reserve(
        ledger, trained_on.dataset_id, Ledger(ledger).data_fingerprint(trained_on.content_digest)
    )
    _write_npz(real, digits, slice(1, None))  # the same data set, one record removed
    assert load_data(f"npz:{real}").content_digest != trained_on.content_digest
    result = run_evaluation(
        synthetic=str(synth), real=f"npz:{real}", metrics=["accuracy"], classifier="logreg",
        ledger_path=ledger,
    )  # fmt: skip
    assert result["non_private"] is True
    assert any(w.startswith("WARNING:") and "NOT private" in w for w in result["warnings"])
    assert "metrics on data that DP training spent budget on" in result["non_private_contents"]
    release = [e for e in Ledger(ledger).entries() if e.get("kind") == "release"]
    assert release[-1]["details"]["non_private"] is True
    assert (
        "metrics on data that DP training spent budget on"
        in (release[-1]["details"]["non_private_contents"])
    )


def test_same_records_under_another_id_are_marked_non_private(tmp_path) -> None:
    synth = tmp_path / "synth"
    _write_sample_folder(synth, per_class=5)
    test_split = load_data("digits:test")
    ledger = tmp_path / "ledger.jsonl"
    # trained on it under another id (the ledger links it by its keyed fingerprint)
    _reserve(ledger, "hospital-a", Ledger(ledger).data_fingerprint(test_split.content_digest))
    result = run_evaluation(
        synthetic=str(synth), real="digits:test", metrics=["accuracy"], classifier="logreg",
        ledger_path=ledger,
    )  # fmt: skip
    assert result["non_private"] is True
    assert any("NOT private" in w for w in result["warnings"])
    assert result["real_fingerprint"].startswith("hmac-sha256:")


def test_spends_a_ledger_recorded_by_plain_digest_before_the_key_still_match(tmp_path) -> None:
    synth = tmp_path / "synth"
    _write_sample_folder(synth, per_class=5)
    test_split = load_data("digits:test")
    ledger = tmp_path / "ledger.jsonl"
    _reserve(ledger, "hospital-a", test_split.content_digest)  # as dpsynth 0.1 wrote it
    result = run_evaluation(
        synthetic=str(synth), real="digits:test", metrics=["accuracy"], classifier="logreg",
        ledger_path=ledger,
    )  # fmt: skip
    assert result["non_private"] is True
    # the report names the data only by a keyed fingerprint (here: none, the ledger has no key)
    assert result["real_fingerprint"] is None
    assert test_split.content_digest not in json.dumps(result)


def test_metrics_on_a_users_own_held_out_data_are_listed_as_non_private(tmp_path) -> None:
    synth = tmp_path / "synth"
    _write_sample_folder(synth, per_class=5)
    real = tmp_path / "held_out.npz"
    _write_npz(real, load_data("digits:test"))
    ledger = tmp_path / "ledger.jsonl"
    kwargs = dict(synthetic=str(synth), metrics=["accuracy"], classifier="logreg")
    own = run_evaluation(real=f"npz:{real}", ledger_path=ledger, **kwargs)
    assert own["non_private"] is False  # no spends on it
    assert any(
        r.startswith("accuracy on npz:") and "held-out records" in r
        for r in own["non_private_contents"]
    )
    release = [e for e in Ledger(ledger).entries() if e.get("kind") == "release"]
    assert release[-1]["details"]["non_private_contents"] == own["non_private_contents"]
    public = run_evaluation(real="digits:test", ledger_path=ledger, **kwargs)
    assert public["non_private"] is False and public["non_private_contents"] == []
