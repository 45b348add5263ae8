"""One training step of each variant `python -m bench.dpsgd` compares: non-private, dpsynth's
DP-SGD modes (vmap, ghost clipping, micro-batches, compiled) and Opacus's modes."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call

from bench.dpsgd_tasks import Task
from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient

NOISE_MULTIPLIER = 1.0
MAX_GRAD_NORM = 1.0


def record_loss(model: nn.Module, spec: Task, inputs: int) -> Callable[..., Tensor]:
    """The per-record loss `loss_fn(params, buffers, *record)` of the vmap path."""

    def loss_fn(params: dict, buffers: dict, *record: Tensor) -> Tensor:
        xs = tuple(t.unsqueeze(0) for t in record[:inputs])
        out = functional_call(model, (params, buffers), xs)
        return spec.loss(out, *(t.unsqueeze(0) for t in record[inputs:])).sum()

    return loss_fn


class _Criterion(nn.Module):
    """The task's loss as an Opacus criterion (with the `reduction` it switches)."""

    def __init__(self, loss: Callable[..., Tensor]) -> None:
        super().__init__()
        self.loss = loss
        self.reduction = "mean"

    def forward(self, out: Tensor, *targets: Tensor) -> Tensor:
        per_record = self.loss(out, *targets)
        return per_record if self.reduction == "none" else per_record.mean()


def make_step(
    variant: str, model: nn.Module, spec: Task, batch_size: int, inputs: int, device: torch.device
) -> Callable[..., None]:
    """A closure running one training step of `variant` on a batch (*inputs, *targets)."""
    if variant == "non-private":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step(*batch: Tensor) -> None:
            opt.zero_grad(set_to_none=True)
            spec.loss(model(*batch[:inputs]), *batch[inputs:]).mean().backward()
            opt.step()

        return step
    if variant.startswith("dpsynth"):
        from dpsynth.privacy.mechanisms import ghost_layers

        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        dp = PrivateGradient(
            model,
            record_loss(model, spec, inputs),
            noise_multiplier=NOISE_MULTIPLIER,
            max_grad_norm=MAX_GRAD_NORM,
            expected_batch_size=float(batch_size),
            generator=torch.Generator(device=device).manual_seed(0),
            micro_batch_size=64 if variant == "dpsynth-micro64" else None,
            batch_loss_fn=lambda *b: spec.loss(model(*b[:inputs]), *b[inputs:]),
            grad_mode="ghost" if variant.startswith("dpsynth-ghost") else "vmap",
            compile_vmap=variant == "dpsynth-compile",
        )
        conv = "unfold" if variant == "dpsynth-ghost-unfold" else "grouped"

        def step(*batch: Tensor) -> None:
            ghost_layers.CONV_PER_RECORD = conv  # the variants share a process while timed
            dp.compute(*batch)
            opt.step()

        return step
    if variant.startswith("opacus"):
        import warnings

        from opacus import GradSampleModule
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        warnings.filterwarnings("ignore", message=".*Full backward hook.*")
        warnings.filterwarnings("ignore", message=".*Secure RNG.*")
        settings = {
            "noise_multiplier": NOISE_MULTIPLIER,
            "max_grad_norm": MAX_GRAD_NORM,
            "expected_batch_size": batch_size,
        }
        if variant == "opacus-ghost":
            gsm = GradSampleModuleFastGradientClipping(
                model, max_grad_norm=MAX_GRAD_NORM, use_ghost_clipping=True
            )
            opt = DPOptimizerFastGradientClipping(
                torch.optim.SGD(gsm.parameters(), lr=0.01), **settings
            )
            criterion = DPLossFastGradientClipping(gsm, opt, _Criterion(spec.loss))

            def step(*batch: Tensor) -> None:
                opt.zero_grad(set_to_none=True)
                criterion(gsm(*batch[:inputs]), *batch[inputs:]).backward()
                opt.step()

            return step
        gsm = GradSampleModule(model, force_functorch=variant == "opacus-functorch")
        opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=0.01), **settings)

        def step(*batch: Tensor) -> None:
            opt.zero_grad(set_to_none=True)
            spec.loss(gsm(*batch[:inputs]), *batch[inputs:]).mean().backward()
            opt.step()

        return step
    raise ValueError(variant)
