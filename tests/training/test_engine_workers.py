"""`train --workers` and a Dask cluster over TLS (`--engine dask+tls://HOST:PORT`).

- Counted by one DuckDB process or by two (a partitioned Parquet folder: a part per file), one
  secret seed gives the same run: config.json's plan and N, the model's state and the sampled
  rows; every pass of each run was counted with the worker count asked for.
- A local Dask cluster over TLS (a self-signed certificate made with openssl, else with
  `cryptography`) trains through `dask+tls://` with the client's certificate files and one
  counting task in flight, and releases what DuckDB releases; config.json records the
  address, never the credentials.
- Refused in one line (exit 2) before anything is written: a TLS address without credentials,
  a missing certificate file, TLS files for another engine, `--workers` with `--engine
  memory` or below 1.
- A run stopped after a step on one process and resumed with `--workers 2` ends as the
  uninterrupted run; TLS files given on resume are checked against the recorded engine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import dpsynth
from dpsynth.cli import app
from dpsynth.data.engines import parts as engine_parts

runner = CliRunner()
TABLES = Path(__file__).resolve().parents[2] / "dpsynth" / "data" / "tables"
SECRET = 1618


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """german-credit as a folder of three Parquet files (text columns), and its schema."""
    folder = tmp_path_factory.mktemp("engine-workers")
    frame = pd.read_csv(TABLES / "german_credit.csv", dtype=str)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    (folder / "parts").mkdir()
    for i in range(3):
        part = table.slice(i * 334, 334)
        pq.write_table(part, folder / "parts" / f"part-{i}.parquet", row_group_size=100)
    shutil.copy(TABLES / "german_credit.schema.json", folder / "schema.json")
    return folder


def _train(folder: Path, name: str, **fields) -> tuple[dict, dict]:
    """A tiny mst run with the fixed secret: its config.json and final model state."""
    out = folder / name
    result = dpsynth.train(
        method="mst", data=f"parquet:{folder / 'parts'}", epsilon=2.0, out=out,
        schema=folder / "schema.json", schema_public=True, preset="tiny",
        ledger=folder / f"{name}.jsonl", privacy_seed=SECRET, **fields,
    )  # fmt: skip
    assert result is not None and result.to_json()["engine"] == fields["engine"]
    checkpoints = sorted(p for p in out.rglob("*.safetensors") if "private" not in p.parts)
    return json.loads((out / "config.json").read_text()), load_file(checkpoints[-1])


def _assert_same_run(got: tuple[dict, dict], want: tuple[dict, dict]) -> None:
    (config, state), (want_config, want_state) = got, want
    assert config["config"] == want_config["config"]
    assert config["privacy"] == want_config["privacy"]
    for key in ("n", "schema"):  # the fingerprint is keyed by each ledger's own key
        assert config["data"][key] == want_config["data"][key], key
    assert sorted(state) == sorted(want_state)
    for key in state:
        assert torch.equal(state[key], want_state[key]), key


def _counted_by(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The worker count each DuckDB pass over Parquet parts runs with, as it runs."""
    asked: list[int] = []
    each_part = engine_parts._each_part

    def spy(parts, call, add, name, workers, report) -> None:
        asked.append(workers)
        each_part(parts, call, add, name, workers, report)

    monkeypatch.setattr(engine_parts, "_each_part", spy)
    return asked


@pytest.fixture(scope="module")
def one_process(folder: Path) -> tuple[dict, dict]:
    """The run of record: DuckDB counting in one process."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        asked = _counted_by(monkeypatch)
        run = _train(folder, "workers-1", engine="duckdb", workers=1)
    assert asked == [1]  # the check pass, which counts the marginals too
    return run


def test_the_worker_count_does_not_change_the_release(
    folder: Path, one_process: tuple[dict, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _counted_by(monkeypatch)
    two = _train(folder, "workers-2", engine="duckdb", workers=2)
    assert asked == [2]  # three parts, two processes
    _assert_same_run(two, one_process)
    config = one_process[0]
    assert config["data"]["engine"] == "duckdb" and config["data"]["n"] == 1000
    samples = []
    for name in ("workers-1", "workers-2"):
        out = folder / f"{name}.csv"
        dpsynth.sample(folder / name, 300, out, ledger=folder / f"{name}.jsonl")
        samples.append(out.read_bytes())
    assert samples[0] == samples[1] and len(samples[0].splitlines()) == 301


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate (the cluster's CA and every role's certificate, as
    `Security.temporary()` makes) and its key: openssl, else `cryptography`, else skip."""
    cert, key = folder / "cluster.pem", folder / "cluster-key.pem"
    if shutil.which("openssl"):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=dask-internal", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        return cert, key
    pytest.importorskip("cryptography", reason="neither openssl nor cryptography to make a cert")
    from distributed.security import Security

    temporary = Security.temporary()
    cert.write_text(temporary.tls_client_cert)
    key.write_text(temporary.tls_client_key)
    return cert, key


def _tasks_in_flight(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """For each counting task the Dask engine submits, how many it submitted before in the
    same pass were still unfinished."""
    from dpsynth.data.engines.dask_engine import DaskCounter

    seen: list[int] = []
    tasks = DaskCounter._tasks

    def spy(self, part, block):
        submitted: list = []

        def watched(submit):
            def call():
                seen.append(sum(not future.done() for future in submitted))
                submitted.append(submit())
                return submitted[-1]

            return call

        return [(watched(submit), rows) for submit, rows in tasks(self, part, block)]

    monkeypatch.setattr(DaskCounter, "_tasks", spy)
    return seen


def test_a_tls_cluster_releases_what_duckdb_releases(
    folder: Path, one_process: tuple[dict, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    from distributed import LocalCluster
    from distributed.security import Security

    in_flight = _tasks_in_flight(monkeypatch)

    cert, key = _certificate(folder)
    files = {"tls_ca_file": str(cert), "tls_client_cert": str(cert), "tls_client_key": str(key)}
    roles = {f"tls_{r}_{k}": str(f) for r in ("scheduler", "worker") for k, f in
             (("cert", cert), ("key", key))}  # fmt: skip
    security = Security(require_encryption=True, **files, **roles)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, protocol="tls", host="127.0.0.1",
        dashboard_address=None, security=security,
    ) as cluster:  # fmt: skip
        address = cluster.scheduler_address
        assert address.startswith("tls://")
        engine = f"dask+tls://{address.removeprefix('tls://')}"
        run = _train(folder, "tls", engine=engine, workers=1, tls_ca_file=cert,
                     tls_cert=cert, tls_key=key)  # fmt: skip
        # one pass of a task per file, each submitted when the one before had finished
        assert in_flight == [0] * 3
        # the same address over plain TCP, or without the cluster's trust, is refused
        for flags, phrase in (
            (("--engine", f"dask://{address.removeprefix('tls://')}"), "dask+tls://HOST:PORT"),
            (("--engine", engine, "--tls-ca-file", str(key), "--tls-cert", str(key)), "TLS"),
        ):
            _refused(folder, "wrong", phrase, *flags)
    _assert_same_run(run, one_process)
    config = (folder / "tls" / "config.json").read_text()
    assert json.loads(config)["data"]["engine"] == engine
    assert str(cert) not in config and "tls_" not in config  # the credentials stay here


def _refused(folder: Path, name: str, phrase: str, *flags: str) -> None:
    out, ledger = folder / name, folder / f"{name}.jsonl"
    result = runner.invoke(app, [
        "train", "--method", "mst", "--data", f"parquet:{folder / 'parts'}",
        "--schema", str(folder / "schema.json"), "--schema-public", "--epsilon", "1",
        "--out", str(out), "--ledger", str(ledger), *flags,
    ])  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and phrase in lines[0], result.stderr
    assert not out.exists() and not (ledger.exists() and ledger.read_text().strip())


def test_what_cannot_count_is_refused_before_anything_is_written(folder: Path) -> None:
    import dask

    tls = "dask+tls://127.0.0.1:9"
    cert = folder / "schema.json"  # a file: whether it is a certificate is seen on connecting
    # no credentials given, and none in Dask's configuration
    nothing = {"distributed.comm.tls.ca-file": None, "distributed.comm.tls.client.cert": None}
    with dask.config.set(nothing):
        _refused(folder, "no-tls", "--tls-ca-file", "--engine", tls)
        _refused(folder, "half-tls", "--tls-cert", "--engine", tls, "--tls-ca-file", str(cert))
    _refused(folder, "missing", "--tls-key", "--engine", tls, "--tls-ca-file", str(cert),
             "--tls-cert", str(cert), "--tls-key", str(folder / "nowhere.pem"))  # fmt: skip
    _refused(folder, "plain-tls", "not --engine duckdb", "--engine", "duckdb",
             "--tls-ca-file", str(cert))  # fmt: skip
    _refused(folder, "memory", "--engine memory counts in this process", "--engine",
             "memory", "--workers", "2")  # fmt: skip
    _refused(folder, "zero", "--workers must be a whole number ≥ 1", "--workers", "0")


def test_a_resumed_run_counts_with_the_workers_it_is_given(
    folder: Path, one_process: tuple[dict, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped after its first step on one process and resumed on two, a run ends as the
    uninterrupted one; credentials for a TLS cluster are refused for its DuckDB engine."""
    dpsynth.train(
        method="mst", data=f"parquet:{folder / 'parts'}", epsilon=2.0, out=folder / "stopped",
        schema=folder / "schema.json", schema_public=True, preset="tiny", engine="duckdb",
        ledger=folder / "stopped.jsonl", privacy_seed=SECRET, workers=1, stop_after_steps=1,
    )  # fmt: skip
    asked = _counted_by(monkeypatch)
    result = dpsynth.train(
        out=folder / "stopped", resume=True, method=None, data=None, epsilon=None, workers=2
    )
    assert result is not None and asked and set(asked) == {2}
    checkpoints = sorted(
        p for p in (folder / "stopped").rglob("*.safetensors") if "private" not in p.parts
    )
    config = json.loads((folder / "stopped" / "config.json").read_text())
    _assert_same_run((config, load_file(checkpoints[-1])), one_process)
    cert = folder / "schema.json"
    refused = runner.invoke(app, ["train", "--resume", "--out", str(folder / "stopped"),
                                  "--tls-ca-file", str(cert)])  # fmt: skip
    assert refused.exit_code == 2 and "not --engine duckdb" in refused.stderr
