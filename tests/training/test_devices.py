"""Random draws are made on their generator's device (issue 9.8).

There is no GPU in the test run, so a CPU generator feeding a tensor that is then used on CUDA
cannot be caught by running on CUDA. Instead every draw that takes a generator is recorded while
each registered method trains and samples, and must name the generator's own device: a draw that
leaves the device to PyTorch's default (the CPU) crashes with a CUDA generator ("Expected a
'cpu' device type for generator but found 'cuda'"), which is the bug `train --method dpkernel
--device cuda` and `sample` hit.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from dpsynth import sampling
from dpsynth.methods.registry import get_method, method_names
from dpsynth.training import train_run

DRAWS = ("randn", "rand", "randint", "randperm", "normal", "bernoulli", "multinomial")


@pytest.fixture
def draws_without_the_generators_device(monkeypatch) -> list[str]:
    """Patch torch's random functions to record draws not placed on their generator's device."""
    bad: list[str] = []

    def checked(name, original):
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            generator = kwargs.get("generator")
            if isinstance(generator, torch.Generator):
                requested = kwargs.get("device")
                if requested is None or torch.device(requested).type != generator.device.type:
                    import traceback

                    where = traceback.extract_stack(limit=2)[0]
                    bad.append(f"torch.{name} at {Path(where.filename).name}:{where.lineno}")
            return original(*args, **kwargs)

        return wrapper

    for name in DRAWS:
        monkeypatch.setattr(torch, name, checked(name, getattr(torch, name)))
    return bad


@pytest.mark.parametrize("method", method_names())
def test_training_and_sampling_draw_on_the_generators_device(
    tmp_path: Path, method: str, draws_without_the_generators_device: list[str]
) -> None:
    if "image" not in get_method(method).modalities:
        pytest.skip(f"{method} is table-only (see the table variant below)")
    run = tmp_path / "run"
    train_run(
        method=method, data="digits", epsilon=10, preset="tiny", out=run,
        ledger_path=tmp_path / "ledger.jsonl", device="cpu", stop_after_steps=2,
        checkpoint_every_s=0,
    )  # fmt: skip
    images, labels, _ = sampling.generate(run, 4, seed=0, device="cpu", batch_size=3)
    assert images.shape[0] == 4 and labels.shape[0] == 4
    assert draws_without_the_generators_device == []


@pytest.mark.parametrize(
    "method", [m for m in method_names() if "image" not in get_method(m).modalities]
)
def test_table_only_methods_draw_on_the_generators_device(
    tmp_path: Path, method: str, draws_without_the_generators_device: list[str]
) -> None:
    run = tmp_path / "run"
    train_run(
        method=method, data="german-credit", epsilon=10, preset="tiny", out=run,
        ledger_path=tmp_path / "ledger.jsonl", device="cpu", stop_after_steps=1,
        checkpoint_every_s=0,
    )  # fmt: skip
    out = tmp_path / "synth.csv"
    sampling.sample_table(run, 5, out, batch_size=3, seed=0, device="cpu", partial=True)
    assert len(out.read_text().splitlines()) == 6
    assert draws_without_the_generators_device == []


def test_the_check_catches_a_draw_on_the_default_device(
    draws_without_the_generators_device: list[str],
) -> None:
    # the check itself: the pre-fix DPKernelGenerator.sample draw is reported
    torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    assert len(draws_without_the_generators_device) == 1
