"""bench/preset_times.py: a preset trained and sampled through the CLI, each command timed."""

from __future__ import annotations

import json
from pathlib import Path

from bench import preset_times


def test_a_tiny_preset_is_trained_sampled_and_written_with_its_times(tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "times.json", tmp_path / "times.md"
    preset_times.main(
        ["--data", "digits", "--epsilon", "2", "--runs", "freq:tiny", "--n", "50",
         "--threads", "1", "--json", str(out_json), "--markdown", str(out_md)]
    )  # fmt: skip
    report = json.loads(out_json.read_text())
    (entry,) = report["entries"]
    assert (entry["method"], entry["preset"], entry["n"]) == ("freq", "tiny", 50)
    assert entry["threads"] == 1  # passed to both commands (an unknown flag would fail them)
    assert entry["public"] is None
    assert entry["device"] == "cpu"  # the default; --device cuda trains and samples on the GPU
    for command in ("train", "sample"):
        timed = entry[command]
        assert timed["wall_s"] > 0 and timed["cpu_s"] > 0
        assert timed["load_before"] >= 0 and timed["load_after"] >= 0
    assert report["machine"]["cpu_cores"] >= 1
    assert "| freq | tiny | 2 | 1 |" in out_md.read_text()
