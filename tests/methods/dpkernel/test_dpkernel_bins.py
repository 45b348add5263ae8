"""dpkernel's binned numbers (`number_bins`): the public re-encoding the kernel sees, its
inverse at sampling, the mechanism's bound in the binned space, and a table run end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.sources import load_table, read_table
from dpsynth.data.table_codec import block_layout
from dpsynth.methods.dpkernel.binning import NumberBins
from dpsynth.methods.dpkernel.kernel import raw_embedding_gradient
from dpsynth.privacy.mechanisms.functional import (
    derivative_kernel_covariance,
    functional_sensitivity,
)

LAYOUT = (("softmax", 3), ("tanh", 1), ("softmax", 2), ("tanh", 1))
K = 4


def _rows(count: int, generator: torch.Generator) -> torch.Tensor:
    """Rows in the table encoding: one-hot blocks and numbers in [-1, 1] (bounds included)."""
    first = torch.eye(3)[torch.randint(0, 3, (count,), generator=generator)]
    second = torch.eye(2)[torch.randint(0, 2, (count,), generator=generator)]
    numbers = torch.rand(count, 2, generator=generator) * 2 - 1
    numbers[:2] = torch.tensor([[-1.0, 1.0], [1.0, -1.0]])
    return torch.cat([first, numbers[:, :1], second, numbers[:, 1:]], 1)


def test_layout_turns_each_number_into_a_block_of_bins() -> None:
    bins = NumberBins(LAYOUT, K)
    assert bins.layout == (("softmax", 3), ("softmax", K), ("softmax", 2), ("softmax", K))
    assert (bins.source_dim, bins.dim) == (7, 5 + 2 * K)


def test_encode_keeps_categories_and_one_hots_each_numbers_bin() -> None:
    rows = _rows(200, torch.Generator().manual_seed(0))
    binned = NumberBins(LAYOUT, K).encode(rows)
    assert torch.equal(binned[:, :3], rows[:, :3])
    assert torch.equal(binned[:, 3 + K : 5 + K], rows[:, 4:6])
    for start, column in ((3, 3), (5 + K, 6)):
        block = binned[:, start : start + K]
        assert torch.equal(block.sum(1), torch.ones(200))  # exactly one bin
        expected = ((rows[:, column] + 1) / 2 * K).floor().clamp(0, K - 1).long()
        assert torch.equal(block.argmax(1), expected)
    # the bounds fall in the first and the last bin
    assert binned[0, 3] == 1 and binned[0, 5 + 2 * K - 1] == 1


def test_decode_draws_the_bin_and_a_value_inside_it() -> None:
    bins = NumberBins(LAYOUT, K)
    rows = _rows(2000, torch.Generator().manual_seed(1))
    back = bins.decode(bins.encode(rows), torch.Generator().manual_seed(2))
    assert torch.equal(back[:, [0, 1, 2, 4, 5]], rows[:, [0, 1, 2, 4, 5]])
    numbers = back[:, [3, 6]]
    assert numbers.min() >= -1 and numbers.max() <= 1
    same_bin = ((numbers + 1) / 2 * K).floor().clamp(0, K - 1)
    assert torch.equal(same_bin, ((rows[:, [3, 6]] + 1) / 2 * K).floor().clamp(0, K - 1))
    # soft blocks: the bin frequencies follow the block, values uniform inside the bin
    soft = torch.zeros(20_000, bins.dim)
    soft[:, 3 : 3 + K] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    drawn = bins.decode(soft, torch.Generator().manual_seed(3))[:, 3]
    shares = torch.bincount(((drawn + 1) / 2 * K).floor().long().clamp_max(K - 1), minlength=K)
    assert torch.allclose(shares / 20_000, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.015)
    inside_last = drawn[drawn >= 0.5]
    assert abs(float(inside_last.mean()) - 0.75) < 0.01  # the last bin's centre
    # the same public seed gives the same sample
    assert torch.equal(drawn, bins.decode(soft, torch.Generator().manual_seed(3))[:, 3])


def test_the_functional_mechanisms_bound_holds_for_binned_records() -> None:
    """Adding one (binned) record moves the embedding gradient within the sensitivity the
    accountant's σ relies on: the re-encoding is a per-record map into a bounded kernel."""
    bandwidths = (2.0,)
    gen = torch.Generator().manual_seed(4)
    bins = NumberBins(LAYOUT, K)
    batch, normalizer = 9, 8.0
    bound = functional_sensitivity(len(bandwidths), "add_remove") ** 2 / normalizer**2
    worst = 0.0
    for _ in range(100):
        x = bins.encode(_rows(batch + 1, gen)).double()
        y = torch.randint(0, 2, (batch + 1,), generator=gen)
        points = torch.rand(6, bins.dim, generator=gen, dtype=torch.float64)
        labels = torch.tensor([0, 1, 0, 1, 0, 1])
        small = raw_embedding_gradient(x[:batch], y[:batch], points, labels, bandwidths, normalizer)
        large = raw_embedding_gradient(x, y, points, labels, bandwidths, normalizer)
        diff = (large - small).reshape(-1)
        cov = derivative_kernel_covariance(points, labels, bandwidths)
        ratio = float(diff @ torch.linalg.solve(cov, diff)) / bound
        assert ratio <= 1.0 + 1e-9
        worst = max(worst, ratio)
    assert worst > 0.01


def test_a_binned_table_run_samples_numbers_inside_not_at_the_bounds(
    tmp_path: Path, one_torch_thread
) -> None:
    runner = CliRunner()
    ledger, run, out = tmp_path / "l.jsonl", tmp_path / "run", tmp_path / "s.csv"
    trained = runner.invoke(
        app,
        ["train", "--method", "dpkernel", "--data", "german-credit", "--epsilon", "10",
         "--preset", "tiny", "--set", "number_bins=8", "--out", str(run), "--ledger",
         str(ledger), "--device", "cpu", "--json"],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    assert json.loads((run / "config.json").read_text())["config"]["number_bins"] == 8
    sampled = runner.invoke(
        app, ["sample", str(run), "--n", "1000", "--out", str(out), "--ledger", str(ledger)]
    )
    assert sampled.exit_code == 0, sampled.output
    frame = pd.read_csv(out)
    schema = read_table("german-credit")[2]
    width = len(block_layout(load_table("german-credit").info()))
    assert width == len(schema.features)
    for column in schema.features:
        if not column.is_numeric:
            continue
        values = frame[column.name].astype(float)
        assert values.between(column.min, column.max).all()
        at_bounds = float(((values == column.min) | (values == column.max)).mean())
        # uniform inside a bin: only integers rounded onto a bound can land there
        assert at_bounds < 2 / 8, (column.name, at_bounds)
        assert values.nunique() > 8  # values, not bin centres
    assert math.isfinite(json.loads(trained.stdout)["epsilon"])


def test_number_bins_must_be_a_sensible_count(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["train", "--method", "dpkernel", "--data", "german-credit", "--epsilon", "1",
         "--preset", "tiny", "--set", "number_bins=-2", "--out", str(tmp_path / "r"),
         "--ledger", str(tmp_path / "l.jsonl")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "number_bins" in result.stderr
    assert not (tmp_path / "l.jsonl").exists() or not (tmp_path / "l.jsonl").read_text().strip()


@pytest.mark.parametrize("bins", [1, 10])
def test_images_ignore_number_bins(bins: int) -> None:
    from dpsynth.methods.dpkernel.binning import number_bins

    info = load_table("german-credit").info()
    image_info = type(info)("digits", "builtin", 10, (1, 8, 8), tuple("0123456789"), "", "d")
    assert number_bins(image_info, {"number_bins": bins}) is None
    assert number_bins(info, {"number_bins": 0}) is None
    assert number_bins(info, {"number_bins": bins}).bins == bins
