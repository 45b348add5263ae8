"""The privacy ledger: a tamper-evident, append-only record of every privacy spend.

`Ledger` (`spends`) is the API: reserve a spend before a read, complete or abort it, record
zero-cost releases and budgets, compose totals; its read-only queries are `reader`'s
(`LedgerReader`). Below it: `chain` (the hash chain of canonical JSON lines and what makes a
line valid), `file` (reading, locking, appending), `state` (what the lines mean: counting and
grouping rules), `key` (the secret key of data fingerprints), `summary` and `verify` (`ledger
show`, `ledger verify`), and `anchors` (the link from a run directory to its spend). The DP
mechanisms and the accountant are `dpsynth.privacy`, which never imports this package.
"""

from dpsynth.ledger.chain import (
    GENESIS_HASH,
    KINDS,
    as_float,
    canonical_json,
    entry_hash,
    json_safe,
)
from dpsynth.ledger.file import DEFAULT_LEDGER_NAME
from dpsynth.ledger.spends import LEDGER_ENV_VAR, Ledger, default_ledger_path

__all__ = [
    "DEFAULT_LEDGER_NAME",
    "GENESIS_HASH",
    "KINDS",
    "LEDGER_ENV_VAR",
    "Ledger",
    "as_float",
    "canonical_json",
    "default_ledger_path",
    "entry_hash",
    "json_safe",
]
