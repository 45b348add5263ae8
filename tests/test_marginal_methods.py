"""AIM and MST end to end: the CLI round trip, resume, the model's pieces, and bad input.

The round trip (train → sample → evaluate ml → ledger verify) runs on the built-in
german-credit with the `tiny` presets; bad input must fail before the reservation (no ledger
entry) with one line and the documented exit code.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.builtin_tables import TABLES_DIR
from dpsynth.data.csvtable import RawTable
from dpsynth.data.sources import load_table, read_table
from dpsynth.data.tabular import codec_for
from dpsynth.evaluate.marginals import discretise, marginal_columns
from dpsynth.ledger import Ledger
from dpsynth.methods.base import PrivacyTarget
from dpsynth.methods.marginal.aim import AIMMethod
from dpsynth.methods.marginal.cliquetree import CliqueTree, added_cells
from dpsynth.methods.marginal.domain import codes_from_rows, rows_from_codes, table_domain
from dpsynth.methods.marginal.model import Measurement, estimate
from dpsynth.methods.marginal.sampler import TreeSampler
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting import compose_epsilon
from dpsynth.training import train_run

runner = CliRunner()


@functools.lru_cache
def _german():
    return load_table("german-credit")


def _invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.mark.parametrize("method", ["aim", "mst"])
def test_cli_train_sample_evaluate_verify(tmp_path: Path, method: str, one_torch_thread) -> None:
    ledger, run, out = tmp_path / "ledger.jsonl", tmp_path / "run", tmp_path / "synth.csv"
    train = _invoke(
        "train", "--method", method, "--data", "german-credit", "--epsilon", "2",
        "--preset", "tiny", "--out", str(run), "--ledger", str(ledger), "--device", "cpu",
        "--json",
    )  # fmt: skip
    assert train.exit_code == 0, train.output
    summary = json.loads(train.stdout)
    assert summary["private"] and float(summary["epsilon"]) <= 2.0
    assert summary["steps"] == summary["total_steps"]
    spend = Ledger(ledger).spend(summary["ledger_seq"])
    assert spend["status"] == "completed"
    types = sorted(e["type"] for e in spend["events"])
    assert types == ["gaussian", "pure_dp"]
    # The ledger's events recompose to the printed bound.
    assert compose_epsilon(spend["events"], spend["delta"]).epsilon == pytest.approx(
        float(spend["epsilon"])
    )
    written = {}
    for labels, n in ((None, 300), ("model", 300), ("balanced", 120)):
        chosen = [] if labels is None else ["--labels", labels]
        sample = _invoke(
            "sample", str(run), "--n", str(n), "--out", str(out), "--ledger", str(ledger),
            *chosen, "--force", "--json",
        )  # fmt: skip
        assert sample.exit_code == 0, sample.output
        manifest = json.loads(out.with_name(out.name + ".manifest.json").read_text())
        written[labels] = (manifest["labels"], manifest["label_counts"], out.read_text())
    # the default is the model's own class proportions (the same rows as --labels model)
    assert written[None] == written["model"] and written[None][0] == "the model's own"
    assert written["balanced"][0] == "balanced"
    header = (TABLES_DIR / "german_credit.csv").read_text().splitlines()[0]
    assert out.read_text().splitlines()[0] == header
    frame = pd.read_csv(out, dtype=str)
    assert len(frame) == 120
    assert (frame["credit_risk"].value_counts() == 60).all()
    schema = read_table("german-credit")[2]
    for column in schema.columns:
        if column.type == "categorical":
            assert set(frame[column.name]) <= set(column.categories), column.name
        else:
            values = frame[column.name].astype(float)
            assert values.between(column.min, column.max).all(), column.name
            if column.type == "integer":
                assert (values == values.round()).all(), column.name
    evaluated = _invoke(
        "evaluate", "--synthetic", str(out), "--real", "german-credit:test", "--metrics", "ml",
        "--seeds", "1", "--ledger", str(ledger), "--json",
    )  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    scores = json.loads(evaluated.stdout)["metrics"]["classifiers"]
    assert 0.0 <= scores["logreg"]["roc_auc"]["mean"] <= 1.0
    verify = _invoke("ledger", "verify", "--ledger", str(ledger), "--json")
    assert verify.exit_code == 0, verify.output


def test_resume_continues_with_the_same_measurements(tmp_path: Path, one_torch_thread) -> None:
    common = {
        "method": "aim", "data": "german-credit", "epsilon": 3, "preset": "tiny",
        "device": "cpu", "privacy_seed": 1234, "checkpoint_every_s": 0,
    }  # fmt: skip
    whole = train_run(out=tmp_path / "whole", ledger_path=tmp_path / "a.jsonl", **common)
    part = train_run(
        out=tmp_path / "part", ledger_path=tmp_path / "b.jsonl", stop_after_steps=1, **common
    )
    assert part["interrupted"] and part["steps"] == 1
    resumed = train_run(out=tmp_path / "part", resume=True, ledger_path=None, **common)
    assert resumed["steps"] == whole["steps"] == resumed["total_steps"]
    assert resumed["epsilon"] == whole["epsilon"]
    spends = [Ledger(tmp_path / name).entries() for name in ("a.jsonl", "b.jsonl")]
    assert [e.get("kind") for e in spends[1]].count("spend") == 1  # charged once
    from safetensors.torch import load_file

    def state(run: str) -> dict[str, torch.Tensor]:
        folder = tmp_path / run
        return load_file(next(folder.rglob("*.safetensors")))

    a, b = state("whole"), state("part")
    for key in ("trainer/measurements/cliques", "trainer/measurements/values"):
        torch.testing.assert_close(a[key], b[key])


def test_codes_round_trip_through_encoded_rows() -> None:
    data = _german()
    info = data.info()
    config = AIMMethod().config("small", {}, info)
    domain = table_domain(info, config)
    codes = codes_from_rows(data.x, data.y, domain)
    assert codes.shape == (info.n, len(domain.attributes))
    assert (codes.max(0) < np.array(domain.sizes)).all()
    uniform = np.random.default_rng(0).random(codes.shape)
    rows, labels = rows_from_codes(codes.astype(np.int64), domain, uniform)
    again = codes_from_rows(rows, labels, domain)
    np.testing.assert_array_equal(again, codes)
    np.testing.assert_array_equal(labels.numpy(), data.y.numpy())


@pytest.mark.parametrize("method", ["aim", "mst"])
def test_default_number_bins_keep_every_value_in_the_marginal_metrics_bin(method: str) -> None:
    """The `small` presets' numeric grid lines up with the 10 public bins the marginal metric
    scores: a real row coded and decoded (uniformly inside its bin) lands in the metric's bin
    of the original value, so the representation itself costs no fidelity. With 16 bins
    (before) german-credit's durations at 24 months moved to the next bin 4 times in 5."""
    data = _german()
    info = data.info()
    domain = table_domain(info, get_method(method).config("small", {}, info))
    codes = codes_from_rows(data.x, data.y, domain)
    uniform = np.random.default_rng(1).random(codes.shape)
    rows, labels = rows_from_codes(codes.astype(np.int64), domain, uniform)
    frame = codec_for(info).decode(rows.numpy(), labels.numpy(), np.random.default_rng(2))
    raw, _, _ = read_table("german-credit")
    decoded = RawTable(
        tuple(frame.columns), tuple(frame[c].astype(str).to_numpy() for c in frame.columns), "x"
    )
    numeric = [c.name for c in marginal_columns(data.schema) if c.is_numeric]
    assert numeric  # german-credit has three numeric columns (duration, amount, age)
    before, after = discretise(raw, data.schema), discretise(decoded, data.schema)
    for name in numeric:
        j = before.names.index(name)
        np.testing.assert_array_equal(after.codes[:, j], before.codes[:, j], err_msg=name)


def test_clique_tree_pairs_match_mbi_and_sampling_matches_the_model() -> None:
    sizes = (3, 4, 2, 5, 3)
    rng = np.random.default_rng(0)
    codes = np.stack([rng.integers(0, s, 400) for s in sizes], axis=1)
    codes[:, 1] = (codes[:, 0] + rng.integers(0, 2, 400)) % 4  # dependence along a chain
    codes[:, 3] = (codes[:, 1] + codes[:, 2]) % 5

    def counts(clique):
        flat = np.ravel_multi_index(tuple(codes[:, j] for j in clique), [sizes[j] for j in clique])
        return np.bincount(flat, minlength=int(np.prod([sizes[j] for j in clique]))).astype(float)

    cliques = [(0,), (1,), (2,), (3,), (4,), (0, 1), (1, 2), (1, 3), (2, 3), (3, 4)]
    measurements = [Measurement(c, counts(c), 1.0) for c in cliques]
    tree, _ = estimate(sizes, measurements, 400.0, 300)
    assert len(tree.cliques) < len(cliques)  # maximal cliques of a triangulated graph
    pairs = list(itertools.combinations(range(len(sizes)), 2))
    ours = tree.pair_marginals(pairs)
    # The reference: the joint table built from the clique tree by brute force.
    joint = _brute_force_joint(tree)
    for a, b in pairs:
        axes = tuple(k for k in range(len(sizes)) if k not in (a, b))
        np.testing.assert_allclose(ours[(a, b)], joint.sum(axis=axes).reshape(-1), rtol=1e-6)
    # Forward sampling reproduces the model's pair marginals given its target marginal.
    sampler = TreeSampler(tree, 4)
    target = tree.marginal(4) / tree.total
    labels = rng.choice(3, size=60000, p=target)
    drawn = sampler.sample(labels, rng.random((60000, len(sampler.steps))))
    assert (drawn[:, 4] == labels).all()
    for a, b in [(0, 1), (1, 3), (0, 4)]:
        flat = np.ravel_multi_index((drawn[:, a], drawn[:, b]), (sizes[a], sizes[b]))
        empirical = np.bincount(flat, minlength=sizes[a] * sizes[b]) / len(drawn)
        np.testing.assert_allclose(empirical, ours[(a, b)] / tree.total, atol=0.01)
    assert added_cells(tree, 0, 1) == 0 and added_cells(tree, 0, 4) > 0


def test_independent_model_samples_its_one_way_marginals_around_the_labels() -> None:
    # Before any pair is measured (a run stopped after round 0) the target's clique is the
    # target alone: nothing to draw there, every other column from its own marginal.
    sizes = (2, 3, 4)
    tree = CliqueTree(sizes, [(0,), (1,), (2,)], [[50, 50], [10, 30, 60], [25, 25, 25, 25]])
    sampler = TreeSampler(tree, 0)
    assert all(step.new for step in sampler.steps) and len(sampler.steps) == 2
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 40000)
    drawn = sampler.sample(labels, rng.random((40000, len(sampler.steps))))
    assert (drawn[:, 0] == labels).all()
    np.testing.assert_allclose(
        np.bincount(drawn[:, 1], minlength=3) / 40000, [0.1, 0.3, 0.6], atol=0.01
    )


def test_sampling_a_large_clique_takes_memory_of_the_clique_not_of_batch_times_cells() -> None:
    # An AIM model can hold cliques of millions of cells. Drawing a batch must not build a
    # [batch, cells] array (census's aim model was killed for memory in `sample` so).
    import tracemalloc

    sizes = (2, 100, 100, 100)  # the clique (1, 2, 3) has 1,000,000 cells
    rng = np.random.default_rng(2)
    big = rng.random((100, 100, 100))
    big[:, :, 50:] = 0.0  # attribute 3 never above 49
    tree = CliqueTree(sizes, [(0,), (1, 2, 3)], [[300.0, 700.0], big * 1000.0 / big.sum()])
    sampler = TreeSampler(tree, 0)
    labels = rng.integers(0, 2, 2000)
    uniform = rng.random((2000, len(sampler.steps)))
    tracemalloc.start()
    drawn = sampler.sample(labels, uniform)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 * 2**20  # a [2000, 10^6] float64 comparison alone would be 16 GB
    assert (drawn[:, 0] == labels).all()
    assert drawn[:, 3].max() < 50 and drawn[:, 1].min() >= 0 and drawn[:, 1].max() < 100
    # The draws follow the clique's marginal of attribute 1.
    expected = big.sum(axis=(1, 2)) / big.sum()
    empirical = np.bincount(drawn[:, 1], minlength=100) / len(drawn)
    assert np.abs(empirical - expected).sum() / 2 < 0.12  # TVD of 2,000 draws over 100 cells


def _brute_force_joint(tree: CliqueTree) -> np.ndarray:
    """P(all attributes) = Π clique marginals / Π separator marginals, on the full grid."""
    from dpsynth.methods.marginal.cliquetree import spanning_tree

    sizes = tree.sizes
    joint = np.ones(sizes)
    for factor in tree.factors:
        shape = [sizes[a] if a in factor.attrs else 1 for a in range(len(sizes))]
        joint = joint * (factor.values / tree.total).reshape(shape)
    for i, j in spanning_tree(tree.cliques):
        sep = tuple(a for a in tree.cliques[i] if a in tree.cliques[j])
        marginal = tree.factors[i].sum_to(sep).values / tree.total
        shape = [sizes[a] if a in sep else 1 for a in range(len(sizes))]
        joint = joint / marginal.reshape(shape)
    return joint * tree.total


def _no_spend(ledger: Path) -> bool:
    return not ledger.exists() or not [e for e in Ledger(ledger).entries() if e.get("kind")]


def test_bad_input_is_one_line_and_spends_nothing(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    schema = json.loads((TABLES_DIR / "german_credit.schema.json").read_text())
    csv = tmp_path / "german.csv"
    csv.write_text((TABLES_DIR / "german_credit.csv").read_text())
    base = ["train", "--method", "aim", "--data", f"csv:{csv}", "--preset", "tiny",
            "--ledger", str(ledger), "--device", "cpu"]  # fmt: skip

    def run(schema_obj, *extra: str, epsilon: str = "1"):
        path = tmp_path / "schema.json"
        path.write_text(json.dumps(schema_obj))
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        return _invoke(
            *base, "--schema", str(path), "--epsilon", epsilon, "--out", str(out), *extra
        )

    # A numeric column without public bounds: exit 2 (the schema is invalid).
    no_bounds = json.loads(json.dumps(schema))
    numeric = next(c for c in no_bounds["columns"] if c["type"] in ("numeric", "integer"))
    numeric.pop("min")
    result = run(no_bounds)
    assert result.exit_code == 2 and "'min'" in result.output
    # A category outside the list: exit 4.
    short = json.loads(json.dumps(schema))
    column = next(
        c for c in short["columns"] if c["type"] == "categorical" and c["name"] != "credit_risk"
    )
    column["categories"] = column["categories"][:-1]
    result = run(short)
    assert result.exit_code == 4 and "not in the schema's category list" in result.output
    # A domain too large for the marginals: exit 2 with the estimate (two real-valued
    # columns in a million bins each: their pair alone would hold 10^12 cells).
    wide = json.loads(json.dumps(schema))
    for column in wide["columns"]:
        if column["name"] in ("credit_amount", "age_in_years"):
            column["type"] = "numeric"
    result = run(wide, "--set", "bins=1000000", "--set", "max_cells=10000000000000")
    assert result.exit_code == 2 and "too large" in result.output
    # An ε too small for even one useful measurement: exit 2.
    result = run(schema, epsilon="0.001")
    assert result.exit_code == 2 and "too small" in result.output
    assert _no_spend(ledger)
    # Images are refused with the loop's one line.
    image = _invoke("train", "--method", "aim", "--data", "digits", "--epsilon", "1",
                    "--out", str(tmp_path / "img"), "--ledger", str(ledger))  # fmt: skip
    assert image.exit_code == 2 and "for images use" in image.output
    assert len(image.output.strip().splitlines()) == 1


def test_plan_is_public_and_declares_its_rounds() -> None:
    info = _german().info()
    for name in ("aim", "mst"):
        method = get_method(name)
        config = method.config("small", {}, info)
        plan = method.plan(info, PrivacyTarget(1.0, 1e-4), config)
        measure = next(e for e in plan.events if e["type"] == "gaussian")
        assert measure["loop_steps_without_reads"] == plan.steps
        assert plan.noise_multiplier == measure["noise_multiplier"]
        assert plan.epsilon_bound <= 1.0
        inf = method.plan(info, PrivacyTarget(float("inf"), 1e-4), config)
        assert not inf.private and inf.steps == plan.steps


def _trained_mst(overrides: dict, epsilon: float):
    """An mst `tiny` trainer run through every round on german-credit (no CLI, no ledger)."""
    data = _german()
    info = data.info()
    method = get_method("mst")
    config = method.config("tiny", overrides, info)
    plan = method.plan(info, PrivacyTarget(epsilon, 1e-4), config)
    trainer = method.trainer(info, config, plan, torch.device("cpu"), 0)
    for step in range(plan.steps):
        trainer.release_whole_data(step, data.x, data.y)
    return method, config, plan, trainer


def test_mst_label_edges_measure_a_feature_tree_with_the_target(one_torch_thread) -> None:
    """`label_edges`: a spanning tree of the features whose every edge is measured with the
    target (tree-augmented naive Bayes): one edge fewer than MST's tree (the target is in
    every edge, not a node of the tree), so no more noise per measurement than MST's."""
    method, config, plan, trainer = _trained_mst({"label_edges": "true"}, 2.0)
    plain = method.plan(
        _german().info(), PrivacyTarget(2.0, 1e-4), {**config, "label_edges": False}
    )
    assert plain.noise_multiplier * 0.98 < plan.noise_multiplier <= plain.noise_multiplier
    domain = trainer.domain
    d, target = len(domain.attributes), domain.target
    cliques = [m.clique for m in trainer.measurements]
    assert cliques[:d] == [(a,) for a in range(d)]
    edges = cliques[d:]
    assert len(edges) == d - 2 and all(len(c) == 3 and c[2] == target for c in edges)
    components = {a: a for a in range(d)}

    def root(a: int) -> int:
        while components[a] != a:
            a = components[a]
        return a

    for a, b, _ in edges:  # a tree: no edge closes a cycle, and it spans every feature
        assert root(a) != root(b)
        components[root(a)] = root(b)
    assert len({root(a) for a in range(d) if a != target}) == 1
    # The plan accounts exactly what was done.
    measure = next(e for e in plan.events if e["type"] == "gaussian")
    select = next(e for e in plan.events if e["type"] == "pure_dp")
    assert measure["count"] == len(cliques) and select["count"] == trainer.selections == d - 2
    # The exact counts the run may compute are the triples: the memory estimate counts them.
    assert method.memory_mb(domain, config, 800) > method.memory_mb(
        domain, {**config, "label_edges": False}, 800
    )


def test_mst_label_edges_fit_every_features_joint_with_the_target(one_torch_thread) -> None:
    """Without noise the label_edges model reproduces the real (feature, target) marginal of
    every feature, which plain MST's tree (the target joined to a few neighbours) does not:
    a downstream classifier sees every feature's relation to the target."""
    data = _german()
    converged = {"final_iters": "2000"}  # tiny's 200 steps stop short of the exact fit
    _, _, _, trainer = _trained_mst({"label_edges": "true", **converged}, float("inf"))
    _, _, _, plain = _trained_mst({"label_edges": "false", **converged}, float("inf"))
    codes = codes_from_rows(data.x, data.y, trainer.domain)
    target = trainer.domain.target
    pairs = [(a, target) for a in range(target)]
    worst = {}
    for name, fitted in (("label_edges", trainer), ("plain", plain)):
        model = fitted.tree.pair_marginals(pairs)
        errors = []
        for a, t in pairs:
            shape = (trainer.sizes[a], trainer.sizes[t])
            flat = np.ravel_multi_index((codes[:, a], codes[:, t]), shape)
            real = np.bincount(flat, minlength=shape[0] * shape[1])
            errors.append(np.abs(model[(a, t)] - real).sum() / len(codes))
        worst[name] = max(errors)
    assert worst["label_edges"] < 0.01 < 0.05 < worst["plain"]


def test_aims_automatic_selection_count_follows_its_noise_target() -> None:
    """The public rule: as many selections as keep a typical pair's expected L1 noise within
    the target share of N, never below d/4 nor above 3d, non-decreasing in ε and in N."""
    import math

    from dpsynth.methods.marginal import aim
    from dpsynth.privacy.marginal_plan import gdp_mu

    info = _german().info()
    config = AIMMethod().config("small", {}, info)
    domain = table_domain(info, config)
    d = len(domain.attributes)
    share = float(config["selection_share"])
    cells = sorted(domain.cells(p) for p in aim.pairs_within(domain, int(config["max_cells"])))
    typical = cells[len(cells) // 2]
    previous = 0
    for epsilon in (0.3, 0.5, 1.0, 1.5, 2.0, 5.0, 10.0):
        counts = [
            aim.auto_selections(domain, n, epsilon, 1e-4, share, 10_000) for n in (400, 800, 8000)
        ]
        assert counts == sorted(counts) and counts[1] >= previous
        previous = counts[1]
        for n, k in zip((400, 800, 8000), counts, strict=True):
            assert math.ceil(d / 4) <= k <= 3 * d
            sigma = math.sqrt(d + k) / (math.sqrt(1 - share) * gdp_mu(epsilon, 1e-4))
            noise = math.sqrt(2 / math.pi) * sigma * typical
            if k > math.ceil(d / 4):  # above the floor the noise target holds
                assert noise <= aim._TARGET_NOISE_SHARE * n * 1.05
    # german-credit at ε = 1 (the measured case): a few selections (the floor), not the 3d cap;
    # at ε = 10 the cap
    assert aim.auto_selections(domain, 800, 1.0, 1e-4, share, 10_000) == math.ceil(d / 4)
    assert aim.auto_selections(domain, 800, 10.0, 1e-4, share, 10_000) == 3 * d


def test_mbi_is_compiled_at_the_default_xla_optimisation_unless_the_user_says_otherwise() -> None:
    # At `--xla_backend_optimization_level=0` (set here before) aim's final estimation on
    # german-credit at ε = 10 ran 4–20× slower (bench/results/tuning-tables.md): dpsynth must
    # leave XLA's flags to the user, and a user's own flags must reach XLA unchanged.
    script = (
        "import os; from dpsynth.methods.marginal.model import _mbi; _mbi(); "
        "print(repr(os.environ.get('XLA_FLAGS')))"
    )
    base = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    for flags in (None, "--xla_cpu_multi_thread_eigen=false"):
        env = base if flags is None else {**base, "XLA_FLAGS": flags}
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip().splitlines()[-1] == repr(flags)
