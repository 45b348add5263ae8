"""The networks `python -m bench.dpsgd` times (`--model`): each with how to draw a batch for it
and its per-record loss."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.dpsgd_models import SmallCNN


@dataclass
class Task:
    """A network, how to draw a batch for it, and its per-record loss."""

    name: str
    build: Callable[[], nn.Module]
    batch_size: int
    inputs: Callable[[int, torch.Generator], tuple[Tensor, ...]]  # model inputs
    targets: Callable[[int, torch.Generator], tuple[Tensor, ...]]  # loss-only tensors
    loss: Callable[..., Tensor]  # loss(output, *targets) -> per-record losses [B]


def _images(b: int, g: torch.Generator) -> tuple[Tensor, ...]:
    return (torch.randn(b, 1, 28, 28, generator=g),)


def _labels(b: int, g: torch.Generator) -> tuple[Tensor, ...]:
    return (torch.randint(0, 10, (b,), generator=g),)


def _images_and_onehot(b: int, g: torch.Generator) -> tuple[Tensor, ...]:
    onehot = F.one_hot(torch.randint(0, 10, (b,), generator=g), 10).float()
    return torch.randn(b, 1, 28, 28, generator=g), onehot


def _no_targets(b: int, g: torch.Generator) -> tuple[Tensor, ...]:
    return ()


def _ce(out: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(out, y, reduction="none")


def _real_term(out: Tensor) -> Tensor:
    return F.softplus(-out)


def task(args: argparse.Namespace) -> Task:
    """The benchmark task of `--model`."""
    if args.model == "smallcnn":
        return Task(
            "smallcnn",
            lambda: SmallCNN(channels=args.channels, norm_after_pool=not args.norm_before_pool),
            256,
            _images,
            _labels,
            _ce,
        )
    if args.model == "psg":
        from dpsynth.methods.psg.model import ConvNet
        from dpsynth.methods.psg.presets import PRESETS

        paper = PRESETS["quick"]
        return Task(
            "psg",
            lambda: ConvNet((1, 28, 28), 10, paper["width"], paper["depth"], paper["norm"]),
            int(paper["batch_size"]),
            _images,
            _labels,
            _ce,
        )
    if args.model == "rdpgan-d":
        from dpsynth.methods.blocks import dcgan_init
        from dpsynth.methods.rdpgan.nets import ConvDiscriminator
        from dpsynth.methods.rdpgan.presets import PRESETS

        paper = PRESETS["paper"]

        def build() -> nn.Module:
            return ConvDiscriminator((1, 28, 28), 10, int(paper["width"])).apply(dcgan_init)

        return Task(
            "rdpgan-d", build, int(paper["batch_size"]), _images_and_onehot, _no_targets, _real_term
        )
    if args.model == "dpaf-c":
        from dpsynth.methods.dpaf.model import Classifier, Features
        from dpsynth.methods.dpaf.presets import PRESETS

        paper = PRESETS["paper"]

        def build() -> nn.Module:
            features = Features(
                (1, 28, 28),
                10,
                int(paper["width"]),
                int(paper["conv1_layers"]),
                int(paper["conv2_layers"]),
            )
            return Classifier(features, int(paper["fc_hidden"]))

        batch = int(paper["batch_size"]) * int(paper["window"])
        return Task("dpaf-c", build, batch, _images_and_onehot, _labels, _ce)
    raise ValueError(args.model)


def model_detail(args: argparse.Namespace) -> str:
    """The network of `--model` in words, for the result's title."""
    if args.model == "smallcnn":
        return f"SmallCNN(channels={args.channels}, norm_after_pool={not args.norm_before_pool})"
    return {
        "psg": "PSG ConvNet, paper preset (width 128, depth 3, instance norm), 1x28x28",
        "rdpgan-d": "RDP-GAN conv discriminator, paper preset (width 64), 1x28x28, 10 classes",
        "dpaf-c": "DPAF phase-1 classifier C, paper preset (C2-C1, FC 512), 1x28x28",
    }[args.model]
