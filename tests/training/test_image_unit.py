"""A privacy unit for a class folder of images (`--privacy-unit UNITS.csv
--max-rows-per-unit 1`): one image a person, drawn with secret randomness, the statement per
person, and the refusals (exit 2 before anything is read, exit 4 for a bad mapping)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.ledger import Ledger
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.training.data import load_recorded

runner = CliRunner()


def _folder(tmp_path: Path) -> tuple[Path, Path, dict[str, int]]:
    """Two classes of 8×8 images; 14 people with 1–4 images each; the unit file."""
    rng = np.random.default_rng(0)
    root = tmp_path / "scans"
    lines = ["path,patient_id"]
    images_of: dict[str, int] = {}
    image = 0
    for person in range(14):
        label = ("healthy", "sick")[person % 2]
        (root / label).mkdir(parents=True, exist_ok=True)
        count = 1 + person % 4
        images_of[f"p{person}"] = count
        for _ in range(count):
            pixels = rng.integers(0, 256, size=(8, 8), dtype=np.uint8)
            name = f"{label}/img{image:03d}.png"
            Image.fromarray(pixels, mode="L").save(root / name)
            lines.append(f"{name},p{person}")
            image += 1
    units = tmp_path / "units.csv"
    units.write_text("\n".join(lines) + "\n")
    return root, units, images_of


def _train(tmp_path: Path, root: Path, *extra: str, out: str = "run"):
    args = ["train", "--method", "dpkernel", "--data", f"folder:{root}", "--epsilon", "5"]
    args += ["--preset", "tiny", "--set", "steps=2", "--set", "batch_size=4"]
    args += ["--out", str(tmp_path / out)]
    args += ["--ledger", str(tmp_path / "ledger.jsonl"), "--device", "cpu", "--json", *extra]
    return runner.invoke(app, args)


def _spends(tmp_path: Path) -> list[dict]:
    path = tmp_path / "ledger.jsonl"
    return [e for e in Ledger(path).entries() if e["kind"] == "spend"] if path.exists() else []


def test_one_image_a_person_and_the_statement_per_person(tmp_path: Path) -> None:
    root, units, images_of = _folder(tmp_path)
    result = _train(tmp_path, root, "--privacy-unit", str(units), "--max-rows-per-unit", "1")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data"]["n"] == len(images_of)  # one image for each of the 14 people
    spend = _spends(tmp_path)[0]
    assert spend["privacy_unit"] == {
        "column": "patient_id", "max_rows_per_unit": 1, "records": "images",
    }  # fmt: skip
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert summary["privacy_unit"]["column"] == "patient_id"
    # read again (resume) with the run's secret: the same images
    secret = json.loads((tmp_path / "run" / "private" / "secret.json").read_text())
    first = load_recorded(config["data"], "run", None, PrivateRandomness.from_json(secret))
    again = load_recorded(config["data"], "run", None, PrivateRandomness.from_json(secret))
    assert first.n == len(images_of) and bool((first.x == again.x).all())
    sampled = runner.invoke(
        app,
        [
            "sample",
            str(tmp_path / "run"),
            "--n",
            "20",
            "--out",
            str(tmp_path / "s"),
            "--ledger",
            str(tmp_path / "ledger.jsonl"),
            "--device",
            "cpu",
        ],
    )
    assert sampled.exit_code == 0, sampled.output
    assert "per patient_id (at most 1 image each)" in sampled.output


@pytest.mark.parametrize(
    ("extra", "code", "says"),
    [
        (["--max-rows-per-unit", "2"], 2, "one image a person"),
        (["--max-rows-per-unit", "1", "--data-override", "digits"], 2, "no person"),
    ],
)
def test_refused_before_anything_is_read(tmp_path: Path, extra, code, says) -> None:
    root, units, _ = _folder(tmp_path)
    if "--data-override" in extra:
        args = ["train", "--method", "dpkernel", "--data", "digits", "--epsilon", "5"]
        args += ["--out", str(tmp_path / "run"), "--ledger", str(tmp_path / "ledger.jsonl")]
        result = runner.invoke(app, [*args, "--privacy-unit", str(units), *extra[:2]])
    else:
        result = _train(tmp_path, root, "--privacy-unit", str(units), *extra)
    assert result.exit_code == code, result.output
    assert says in result.output
    assert _spends(tmp_path) == []


def test_a_mapping_that_misses_an_image_or_names_another_exits_4(tmp_path: Path) -> None:
    root, units, _ = _folder(tmp_path)
    lines = units.read_text().splitlines()
    units.write_text("\n".join(lines[:-1]) + "\n")  # the last image has no person
    missing = _train(tmp_path, root, "--privacy-unit", str(units), "--max-rows-per-unit", "1")
    assert missing.exit_code == 4 and "have no unit" in missing.output
    units.write_text("\n".join([*lines, "healthy/nope.png,p1"]) + "\n")
    extra = _train(tmp_path, root, "--privacy-unit", str(units), "--max-rows-per-unit", "1")
    assert extra.exit_code == 4 and "not images of" in extra.output
    assert _spends(tmp_path) == []
