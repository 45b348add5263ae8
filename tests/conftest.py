"""Shared test fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def no_ledger_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests name their ledgers: a `DPSYNTH_LEDGER` of the caller's shell (or of `make`) must
    not reach the commands they run, in process or in a subprocess."""
    monkeypatch.delenv("DPSYNTH_LEDGER", raising=False)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny ops run faster on one thread: it avoids OpenMP spin-waiting when cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
