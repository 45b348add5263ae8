"""`--engine`: the parsed choice, what `auto` stands for (memory when the table's estimated
in-memory size fits the memory budget, else DuckDB), and the counter of an out-of-core engine
(`duckdb`, `dask://HOST:PORT`, `dask+tls://HOST:PORT`).

A Dask cluster over TLS is named `dask+tls://HOST:PORT` (Dask's own address is
`tls://HOST:PORT`; the `dask+` says which engine, as `dask://` does); its client credentials
(`DaskTLS`: the cluster's CA, a client certificate and its key, the files `dask scheduler
--tls-ca-file/--tls-cert/--tls-key` take) travel with the choice, never in its `spec`, which
config.json records (`dask_tls.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from os import PathLike, fspath

from dpsynth.data.csvtable import BYTES_PER_FIELD
from dpsynth.data.discrete import ChunkEncoder
from dpsynth.data.engines.base import TableCounter
from dpsynth.data.engines.chunks import TableFiles
from dpsynth.data.engines.dask_tls import TLS_PROTOCOL, DaskTLS, dask_security, dask_spec
from dpsynth.errors import UsageError

ENGINES = ("auto", "memory", "duckdb", "dask://HOST:PORT", "dask+tls://HOST:PORT")
# A CSV's text read into memory costs about this many times its size (shared strings, one
# pointer per field, the encoded floats); a compressed one about this many times more.
_CSV_EXPANSION = 8.0
_COMPRESSED = 8.0


@dataclass(frozen=True)
class EngineChoice:
    """A parsed `--engine`: its name, for Dask the cluster's address (`HOST:PORT` over TCP,
    `tls://HOST:PORT` over TLS, as `distributed.Client` takes it) and, over TLS, the client's
    credentials (not part of `spec`)."""

    name: str  # "auto", "memory", "duckdb" or "dask"
    address: str | None = None
    tls: DaskTLS | None = field(default=None, repr=False)

    @property
    def is_tls(self) -> bool:
        """Whether this is a Dask cluster reached over TLS."""
        return self.name == "dask" and (self.address or "").startswith(TLS_PROTOCOL)

    @property
    def spec(self) -> str:
        """The flag's value, as config.json records it (no credentials)."""
        return dask_spec(self.address or "") if self.name == "dask" else self.name


def parse_engine(text: str) -> EngineChoice:
    """`--engine` → an `EngineChoice` (UsageError, exit 2, for anything else)."""
    value = text.strip()
    if value in ("auto", "memory", "duckdb"):
        return EngineChoice(value)
    for scheme, protocol in (("dask://", ""), ("dask+tls://", TLS_PROTOCOL)):
        if value.startswith(scheme):
            address = value.removeprefix(scheme)
            host, sep, port = address.rpartition(":")
            if sep and host and port.isdigit() and "/" not in address:
                return EngineChoice("dask", protocol + address)
    raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, got {text!r}")


def check_workers(workers: int | None, choice: EngineChoice) -> None:
    """`workers` (None: the default): a whole number ≥ 1, for an engine that counts out of
    core (UsageError naming the parameter; `memory` counts in this process)."""
    if workers is None:
        return
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(
            f"{{workers}} must be a whole number ≥ 1, got {workers!r}", parameter="workers"
        )
    if choice.name == "memory":
        raise UsageError(
            "{workers} sets the processes that count a table out of core; {engine} memory "
            "counts in this process (leave {workers} out, or use {engine} duckdb)",
            parameters=("workers", "engine"),
        )


def with_tls(
    choice: EngineChoice,
    ca_file: str | PathLike[str] | None,
    cert: str | PathLike[str] | None,
    key: str | PathLike[str] | None,
) -> EngineChoice:
    """The choice carrying a TLS cluster's client credentials, checked now
    (`dask_tls.dask_security`: the files given, else Dask's configuration; UsageError
    when there are none); any of them with another engine, which would not use them, is a
    UsageError."""
    names = ("tls_ca_file", "tls_cert", "tls_key")
    files = (ca_file, cert, key)
    if not choice.is_tls:
        if any(path is not None for path in files):
            raise UsageError(
                "{tls_ca_file}, {tls_cert} and {tls_key} are for a Dask cluster over TLS "
                f"({{engine}} dask+tls://HOST:PORT), not {{engine}} {choice.spec}",
                parameters=(*names, "engine"),
            )
        return choice
    tls = DaskTLS(*(None if path is None else fspath(path) for path in files))
    dask_security(tls)  # before anything is read
    return replace(choice, tls=tls)


def memory_estimate(files: TableFiles, rows: int | None, width: int) -> float:
    """Bytes the in-memory path would hold for this source (its strings and encoded rows)."""
    if rows is not None:
        return rows * (len_fields(files, width) * BYTES_PER_FIELD + width * 4)
    size = float(files.size_bytes)
    compressed = files.paths[0].endswith((".gz", ".bz2", ".xz", ".zst", ".zip"))
    return size * _CSV_EXPANSION * (_COMPRESSED if compressed else 1.0)


def len_fields(files: TableFiles, width: int) -> int:
    """Fields a row holds in memory (at least one per encoded value)."""
    return max(width, 1)


def choose_engine(choice: EngineChoice, estimate: float, budget: float) -> str:
    """The engine `auto` stands for: memory when the estimate fits the budget, else DuckDB."""
    if choice.name != "auto":
        return choice.name
    return "memory" if estimate <= budget else "duckdb"


def open_counter(
    choice: EngineChoice,
    files: TableFiles,
    encoder: ChunkEncoder,
    record_count: int,
    memory_budget: float,
    workers: int | None = None,
) -> TableCounter:
    """The counter of a file source on an out-of-core engine (`duckdb` or `dask`); `workers`
    (None: the default) is DuckDB's counting processes, or the Dask tasks in flight."""
    if choice.name == "dask":
        from dpsynth.data.engines.dask_engine import DaskCounter, connect

        assert choice.address is not None
        client = connect(choice.address, choice.tls)
        return DaskCounter(client, files, encoder, record_count, workers)
    if choice.name == "duckdb":
        from dpsynth.data.engines.duckdb_engine import DuckDBCounter

        # DuckDB gets half the budget: the batches and the counts live beside it
        budget = int(memory_budget // 2)
        return DuckDBCounter(files, encoder, record_count, budget, workers=workers)
    raise UsageError(f"--engine {choice.spec} does not count out of core")
