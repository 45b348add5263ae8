"""`--public-size N'`: a public upper bound used in place of the record count (issue 26, risk 4).

Under add/remove adjacency dpsynth treats N as public (q = B/N, δ below 1/N, N in
config.json). A data owner for whom N is sensitive declares N' ≥ N instead: the plan, the
default δ and everything written use N', while Poisson sampling still runs over the records.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpsynth.errors import DataError, UsageError
from dpsynth.ledger import Ledger
from dpsynth.privacy.accounting.calibration import default_delta
from dpsynth.training import TrainRequest, train_run

DIGITS_N = 1437


def _run(tmp_path: Path, name: str, **kwargs) -> dict:
    return train_run(
        method="dpkernel", data="digits", epsilon=5, preset="tiny", out=tmp_path / name,
        ledger_path=tmp_path / f"{name}.jsonl", device="cpu", privacy_seed=5, **kwargs,
    )  # fmt: skip


def test_the_plan_and_the_run_dir_use_the_public_size(tmp_path: Path) -> None:
    plain = _run(tmp_path, "plain", stop_after_steps=1)
    public = _run(tmp_path, "public", public_size=20000, stop_after_steps=1)
    config = json.loads((tmp_path / "public" / "config.json").read_text())
    assert config["data"]["n"] == 20000 and config["data"]["public_size"] is True
    assert str(DIGITS_N) not in (tmp_path / "public" / "config.json").read_text()
    # q = B/N' (the batch size is the preset's), δ below 1/N'
    assert public["sampling_rate"] == pytest.approx(plain["sampling_rate"] * DIGITS_N / 20000)
    assert public["delta"] == default_delta(20000) < plain["delta"]
    # the run resumes with the same public description and finishes its plan
    done = train_run(method="dpkernel", data="digits", epsilon=5, out=tmp_path / "public",
                     ledger_path=None, device="cpu", resume=True)  # fmt: skip
    assert done["ledger_status"] == "completed" and done["steps"] == done["total_steps"]


def test_a_public_size_below_the_record_count_is_refused_before_any_spend(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="public upper bound"):
        _run(tmp_path, "run", public_size=DIGITS_N - 1)
    assert Ledger(tmp_path / "run.jsonl").entries() == []
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("bad", [0, -3])
def test_a_public_size_must_be_positive(tmp_path: Path, bad: int) -> None:
    with pytest.raises(UsageError, match="public_size must be a whole number") as refused:
        TrainRequest.build(out=tmp_path / "run", method="dpkernel", data="digits", epsilon=5,
                           ledger=tmp_path / "l.jsonl", public_size=bad)  # fmt: skip
    assert refused.value.parameter == "public_size"


def test_the_schema_release_reads_its_bins_off_the_public_size(tmp_path: Path) -> None:
    """Every N-derived setting of the DP schema release (quantile and fine bins) comes from
    N', so round(log2 N) does not leak through the released edges."""
    from dpsynth.data.builtin_tables import TABLES_DIR
    from dpsynth.privacy.releases.schema_release import quantile_bins
    from dpsynth.training.table_schema import read_table_input

    schema = json.loads((TABLES_DIR / "german_credit.schema.json").read_text())
    for column in schema["columns"]:
        column["source"] = "data (not private: review or replace)"
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    plans = {}
    for public_size in (None, 2**16):
        table = read_table_input(
            spec="german-credit", schema_path=path, schema_public=False, schema_epsilon=None,
            dataset_id=None, ledger=Ledger(tmp_path / "l.jsonl"), delta=None,
            public_size=public_size, target_epsilon=50.0,
        )  # fmt: skip
        assert table.release is not None
        plans[public_size] = table.release[1]
    assert plans[None].rows < 1000 and plans[2**16].rows == 2**16
    assert plans[2**16].to_json()["quantile_bins"] == quantile_bins(2**16) == 16
    assert plans[None].to_json()["quantile_bins"] != plans[2**16].to_json()["quantile_bins"]
