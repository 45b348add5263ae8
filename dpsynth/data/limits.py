"""Size caps for what a command reads or builds, checked before the work that would need them.

A hostile or mistyped input must end in one clear line, never in a `MemoryError`, a kill by
the OS or hours of work. Two kinds of cap:

- fixed caps on one item (a CSV line or field, an image's pixel count), documented in
  docs/commands.md, which no real data set comes near;
- caps derived from memory: what an input would make a command hold (a table's decoded
  text, a folder's decoded pixels, an audit's canary matrices, a sampling batch) is
  estimated from public sizes before it is allocated (a table's rows as they are
  parsed) and compared with `memory_budget()`.

The budget is half the machine's physical memory (less when the process runs under a lower
address-space limit, `ulimit -v`), or `DPSYNTH_MEMORY_BUDGET` (bytes, or with a K/M/G/T
suffix) when set. Only sizes are checked here; nothing is learned from the data.
"""

from __future__ import annotations

import os
import resource

from dpsynth.errors import UsageError

# One physical line of a CSV (bytes, before decoding): a real record is a few KiB at most; a
# 200 MB "line" is a binary file or a missing newline, and made pandas allocate tens of GiB.
MAX_CSV_LINE_BYTES = 1 << 20
# One field of a CSV (characters, after stripping blanks): a table is held as fixed-width
# strings per column, so one long field costs its length times the number of rows.
MAX_CSV_FIELD_CHARS = 4096
# Columns of a CSV: far beyond any tabular generator's width.
MAX_CSV_COLUMNS = 10_000
# Pixels of one image (width x height), read from its header before decoding: 4096 x 4096.
# PIL warns about decompression bombs only above 89 million; every model here works at 1024
# or below, so a larger image is a mistake or an attack, and is refused before decoding.
MAX_IMAGE_PIXELS = 4096 * 4096
# Records generated at once (`sample --batch-size`): beyond any useful batch; the batch's
# float32 records times BATCH_COPIES must also fit the memory budget.
MAX_BATCH_SIZE = 1 << 17
BATCH_COPIES = 16
ENV_BUDGET = "DPSYNTH_MEMORY_BUDGET"
_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux/macOS
        return 8 << 30


def parse_bytes(text: str) -> int:
    """`123`, `512M`, `8G` → bytes (UsageError otherwise)."""
    value = text.strip().upper().removesuffix("B")
    suffix = value[-1:] if value[-1:] in _SUFFIXES and value[-1:] else ""
    number = value[: len(value) - len(suffix)] if suffix else value
    try:
        parsed = float(number) * _SUFFIXES[suffix]
    except ValueError:
        parsed = -1.0
    if not parsed > 0 or parsed > 1 << 60:
        raise UsageError(f"{ENV_BUDGET}={text!r}: expected a size in bytes such as 4G or 512M")
    return int(parsed)


def memory_budget() -> int:
    """Bytes a command may plan to hold at once (see the module docstring)."""
    configured = os.environ.get(ENV_BUDGET)
    if configured:
        return parse_bytes(configured)
    budget = _physical_memory() // 2
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft > 0:
        budget = min(budget, soft // 2)
    return budget


def fmt_bytes(count: float) -> str:
    """A byte count for a message: 1.5 GiB, 300 MiB, 12 KiB, 80 B."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{int(count)} B"


def over_budget(needed: float) -> str | None:
    """None when `needed` bytes fit the memory budget, else the sentence that says they do not."""
    budget = memory_budget()
    if needed <= budget:
        return None
    return (
        f"would need about {fmt_bytes(needed)} of memory, more than the {fmt_bytes(budget)} budget "
        f"(half the machine's memory; set {ENV_BUDGET} to change it)"
    )


def check_batch_size(flag: str, batch_size: int, record_values: int) -> None:
    """UsageError unless 1 ≤ batch_size ≤ MAX_BATCH_SIZE and a batch of records of
    `record_values` float32 values each (times BATCH_COPIES) fits the memory budget."""
    if batch_size < 1:
        raise UsageError(f"{flag} must be at least 1, got {batch_size}")
    if batch_size > MAX_BATCH_SIZE:
        raise UsageError(f"{flag} must be at most {MAX_BATCH_SIZE}, got {batch_size}")
    problem = over_budget(batch_size * max(record_values, 1) * 4 * BATCH_COPIES)
    if problem:
        raise UsageError(f"{flag} {batch_size}: a batch {problem}; use a smaller batch")
