"""`--engine`: the parsed choice, what `auto` stands for (memory when the table's estimated
in-memory size fits the memory budget, else DuckDB), and the counter of an out-of-core engine
(`duckdb`, `dask://HOST:PORT`)."""

from __future__ import annotations

from dataclasses import dataclass

from dpsynth.data.csvtable import BYTES_PER_FIELD
from dpsynth.data.discrete import ChunkEncoder
from dpsynth.data.engines.base import TableCounter
from dpsynth.data.engines.chunks import TableFiles
from dpsynth.errors import UsageError

ENGINES = ("auto", "memory", "duckdb", "dask://HOST:PORT")
# A CSV's text read into memory costs about this many times its size (shared strings, one
# pointer per field, the encoded floats); a compressed one about this many times more.
_CSV_EXPANSION = 8.0
_COMPRESSED = 8.0


@dataclass(frozen=True)
class EngineChoice:
    """A parsed `--engine`: its name, and a cluster's address for Dask."""

    name: str  # "auto", "memory", "duckdb" or "dask"
    address: str | None = None

    @property
    def spec(self) -> str:
        """The flag's value, as config.json records it."""
        return f"dask://{self.address}" if self.name == "dask" else self.name


def parse_engine(text: str) -> EngineChoice:
    """`--engine` → an `EngineChoice` (UsageError, exit 2, for anything else)."""
    value = text.strip()
    if value in ("auto", "memory", "duckdb"):
        return EngineChoice(value)
    if value.startswith("dask://"):
        address = value.removeprefix("dask://")
        host, sep, port = address.rpartition(":")
        if sep and host and port.isdigit():
            return EngineChoice("dask", address)
    raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, got {text!r}")


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
) -> TableCounter:
    """The counter of a file source on an out-of-core engine (`duckdb` or `dask`)."""
    if choice.name == "dask":
        from dpsynth.data.engines.dask_engine import DaskCounter, connect

        assert choice.address is not None
        return DaskCounter(connect(choice.address), files, encoder, record_count)
    if choice.name == "duckdb":
        from dpsynth.data.engines.duckdb_engine import DuckDBCounter

        # DuckDB gets half the budget: the batches and the counts live beside it
        return DuckDBCounter(files, encoder, record_count, int(memory_budget // 2))
    raise UsageError(f"--engine {choice.spec} does not count out of core")
