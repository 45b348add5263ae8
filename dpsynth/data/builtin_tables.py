"""Built-in public tables that ship inside the package (no download).

`german-credit`: the UCI Statlog German Credit data (1,000 rows, CC BY 4.0; see
`tables/README.md`) with its bundled public schema. It is split once with
`train_test_split(test_size=0.2, random_state=0, stratify=target)`, like the image sets:
`german-credit` is the 800-row train split, `german-credit:test` the 200 held-out rows.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpsynth.data.schema import Schema
from dpsynth.data.schema_file import parse_schema
from dpsynth.data.table_codec import RawTable, read_csv_table
from dpsynth.errors import DpsynthError

TABLES_DIR = Path(__file__).parent / "tables"


@dataclass(frozen=True)
class BuiltinTable:
    """The public description of one built-in table."""

    name: str
    description: str
    source: str
    file: str
    schema_file: str
    n_train: int
    n_test: int

    def schema(self) -> Schema:
        """Its bundled public schema."""
        text = (TABLES_DIR / self.schema_file).read_text(encoding="utf-8")
        return parse_schema(json.loads(text), f"built-in {self.name} schema")

    def to_json(self) -> dict:
        """A JSON-ready dict as `dpsynth data list` shows it."""
        schema = self.schema()
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "n": self.n_train,
            "n_test": self.n_test,
            "modality": "table",
            "columns": len(schema.columns),
            "target": schema.target,
            "classes": list(schema.classes),
            "specs": [self.name, f"{self.name}:test"],
        }


TABLE_BUILTINS: dict[str, BuiltinTable] = {
    "german-credit": BuiltinTable(
        name="german-credit",
        description="UCI Statlog German Credit: 20 mixed attributes, target credit_risk "
        "(1 good, 2 bad); CC BY 4.0, bundled",
        source="https://archive.ics.uci.edu/dataset/144 (bundled: dpsynth/data/tables)",
        file="german_credit.csv",
        schema_file="german_credit.schema.json",
        n_train=800,
        n_test=200,
    ),
}


@functools.cache
def _splits(name: str) -> dict[str, RawTable]:
    from sklearn.model_selection import train_test_split

    table = TABLE_BUILTINS[name]
    raw = read_csv_table(TABLES_DIR / table.file, source=f"built-in {name}")
    target = raw.column(table.schema().target)
    train_index, test_index = train_test_split(
        np.arange(raw.n), test_size=0.2, random_state=0, stratify=target
    )
    out = {}
    for split, index in (("train", train_index), ("test", test_index)):
        out[split] = RawTable(raw.header, tuple(c[index] for c in raw.columns), raw.source)
    if (out["train"].n, out["test"].n) != (table.n_train, table.n_test):
        raise DpsynthError(f"built-in table {name} has unexpected split sizes")
    return out


def load_builtin_table(name: str, split: str) -> RawTable:
    """One split of a built-in table as read (shared: do not modify its arrays)."""
    if name not in TABLE_BUILTINS or split not in ("train", "test"):
        raise KeyError(f"{name}:{split}")
    return _splits(name)[split]
