"""AIM and MST end to end: the CLI round trip, resume, the model's pieces, and bad input.

The round trip (train → sample → evaluate ml → ledger verify) runs on the built-in
german-credit with the `tiny` presets; bad input must fail before the reservation (no ledger
entry) with one line and the documented exit code.
"""

from __future__ import annotations

import functools
import itertools
import json
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
from dpsynth.data.table_codec import codec_for
from dpsynth.evaluation.marginals import discretise, marginal_columns
from dpsynth.ledger import Ledger
from dpsynth.methods.base import PrivacyTarget
from dpsynth.methods.marginal.aim import AIMMethod
from dpsynth.methods.marginal.cliquetree import CliqueTree
from dpsynth.methods.marginal.domain import codes_from_rows, rows_from_codes, table_domain
from dpsynth.methods.marginal.generator import TreeSampler
from dpsynth.methods.marginal.junction import JunctionTree
from dpsynth.methods.marginal.model import Measurement, estimate
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import events_to_json
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
    # the summary names the marginal mechanisms, not a DP-SGD loop's σ and q
    mechanisms = summary["mechanisms"]
    assert [m.split(":")[0] for m in mechanisms] == [
        "Gaussian marginal counts", "exponential mechanism"
    ]  # fmt: skip
    assert "Gaussian releases (σ" in mechanisms[0] and "pure ε-DP" in mechanisms[1]
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
    structure = JunctionTree.of(sizes, cliques)
    assert structure.growth(0, 1) == 0 and structure.growth(0, 4) > 0


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
        measure = next(e for e in events_to_json(plan.events) if e["type"] == "gaussian")
        assert measure["loop_steps_without_reads"] == plan.steps
        # not DP-SGD-shaped: the noise lives in the measurement and selection events only
        assert plan.gaussian_sum is None and measure["noise_multiplier"] > 0
        assert plan.epsilon_bound <= 1.0
        inf = method.plan(info, PrivacyTarget(float("inf"), 1e-4), config)
        assert not inf.private and inf.steps == plan.steps


def _measurement_sigma(plan) -> float:
    """σ of a marginal plan's Gaussian measurements (its event, not a loop parameter)."""
    return next(e for e in plan.events if e.kind == "gaussian").noise_multiplier


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
    sigma, plain_sigma = _measurement_sigma(plan), _measurement_sigma(plain)
    assert plain_sigma * 0.98 < sigma <= plain_sigma
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
    measure = next(e for e in events_to_json(plan.events) if e["type"] == "gaussian")
    select = next(e for e in events_to_json(plan.events) if e["type"] == "pure_dp")
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
    from dpsynth.privacy.accounting.marginal_plan import gdp_mu

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


def _running_intersection(tree: JunctionTree) -> bool:
    """Every attribute's nodes form a connected subtree, and the edges form a forest."""
    cliques, edges = tree.cliques, tree.edges
    if len(edges) >= len(cliques) and cliques:
        return False
    for a in {x for c in cliques for x in c}:
        holders = {i for i, c in enumerate(cliques) if a in c}
        start = min(holders)
        reached, stack = {start}, [start]
        while stack:
            i = stack.pop()
            for u, v in edges:
                for j in (v,) if u == i else (u,) if v == i else ():
                    if j in holders and j not in reached:
                        reached.add(j)
                        stack.append(j)
        if reached != holders:
            return False
    return True


def test_junction_tree_growth_is_exact_and_keeps_the_running_intersection_property() -> None:
    """AIM's size filter reads `growth` before a pair is chosen: the tree then grows by at
    most that (merges only shrink it), holds every clique added, and stays a junction tree."""
    rng = np.random.default_rng(3)
    sizes = tuple(int(s) for s in rng.integers(2, 7, 12))
    tree = JunctionTree.of(sizes, [(a,) for a in range(12)])
    assert tree.cells() == sum(sizes)
    added = []
    for a, b in (tuple(sorted(p)) for p in rng.choice(12, size=(30, 2))):
        if a == b:
            continue
        before, growth = tree.cells(), tree.growth(a, b)
        assert tree.growths([(a, b)])[(a, b)] == growth
        tree.add((a, b))
        added.append((a, b))
        assert tree.cells() <= before + growth
        assert all(tree.holds(c) for c in added) and _running_intersection(tree)
    # No node inside another: the nodes are the maximal cliques of the chordal graph.
    nodes = [set(c) for c in tree.cliques]
    assert not any(x < y for x in nodes for y in nodes)
    # The same cliques in the same order give the same tree (a resumed run refits on it).
    again = JunctionTree.of(sizes, [(a,) for a in range(12)] + added)
    assert again.cliques == tree.cliques and again.edges == tree.edges


def test_triangulated_tree_of_mst_triples_is_the_tree_of_the_triples() -> None:
    """MST with `label_edges` measures a tree of features, every edge with the target: the
    fitted tree has the triples as nodes, not a chain of features grown through the target's
    nodes (census: 20,630 cells instead of 1.1 billion)."""
    sizes = (5, 4, 6, 3, 5, 4, 2)  # the target is the last
    edges = [(0, 1), (1, 2), (1, 3), (3, 4), (4, 5)]
    cliques = [(a,) for a in range(7)] + [(a, b, 6) for a, b in edges]
    tree = JunctionTree.triangulated(sizes, cliques)
    assert sorted(tree.cliques) == sorted((a, b, 6) for a, b in edges)
    assert _running_intersection(tree)
    assert tree.cells() == sum(sizes[a] * sizes[b] * 2 for a, b in edges)


def test_estimation_reaches_mbis_least_squares_fit_and_stays_in_the_simplex() -> None:
    """The numpy estimator minimises mbi's objective: from the same noisy measurements it
    ends at a loss no higher than mbi's MirrorDescent after 1,000 steps, with the same
    marginals; and its first mirror-descent-only steps are mbi's iterates."""
    pytest.importorskip("mbi")
    import jax

    jax.config.update("jax_enable_x64", True)
    import mbi

    from dpsynth.methods.marginal import estimator

    sizes = (3, 4, 2, 5, 3)
    rng = np.random.default_rng(0)
    codes = np.stack([rng.integers(0, s, 400) for s in sizes], axis=1)
    codes[:, 1] = (codes[:, 0] + rng.integers(0, 2, 400)) % 4
    codes[:, 3] = (codes[:, 1] + codes[:, 2]) % 5
    cliques = [(0,), (1,), (2,), (3,), (4,), (0, 1), (1, 2), (1, 3), (2, 3), (3, 4)]
    measured = []
    for c in cliques:
        shape = [sizes[j] for j in c]
        flat = np.ravel_multi_index(tuple(codes[:, j] for j in c), shape)
        counts = np.bincount(flat, minlength=int(np.prod(shape))).astype(float)
        measured.append((c, counts + rng.normal(0, 2.0, counts.size), 2.0))
    domain = mbi.Domain([f"a{j}" for j in range(5)], list(sizes))
    linear = [
        mbi.LinearMeasurement(v, tuple(f"a{j}" for j in c), sigma) for c, v, sigma in measured
    ]
    theirs = mbi.estimation.MirrorDescent().estimate(domain, linear, 400.0, iters=1000)
    their_loss = float(mbi.marginal_loss.from_linear_measurements(linear, domain)(theirs.marginals))
    tree, _ = estimate(sizes, [Measurement(c, v, s) for c, v, s in measured], 400.0, 1000)
    targets = estimator.Targets.of(cliques, measured)
    ours = [tree.factors[tree.home[c[0]]].sum_to(c).values for c in cliques[:5]]
    ours += [tree.pair_marginals([c])[c] for c in cliques[5:]]
    assert targets.loss(ours) <= their_loss * 1.0001
    for c, mine in zip(cliques, ours, strict=True):
        theirs_c = np.asarray(theirs.project(tuple(f"a{j}" for j in c)).datavector())
        assert np.abs(mine.reshape(-1) - theirs_c).max() < 1.0  # counts out of 400
        assert (mine >= 0).all() and abs(mine.sum() - 400.0) < 1e-6
    # Mirror descent alone (no scaled steps) takes mbi's steps.
    junction = JunctionTree.triangulated(sizes, cliques)
    oracle = estimator.TreeOracle(sizes, junction.cliques, junction.edges, cliques)
    start = [np.zeros([sizes[j] for j in c]) for c in cliques]
    plain = estimator.fit(oracle, targets, start, 400.0, 100, tolerance=-1.0, scaled=False)
    hundred = mbi.estimation.MirrorDescent().estimate(domain, linear, 400.0, iters=100)
    mus = oracle.clique_marginals(plain.marginals)
    for c, mine in zip(cliques, mus, strict=True):
        theirs_c = np.asarray(hundred.project(tuple(f"a{j}" for j in c)).datavector())
        np.testing.assert_allclose(mine.reshape(-1), theirs_c, rtol=1e-9, atol=1e-9)


def test_aim_keeps_its_fitted_model_within_the_size_cap(one_torch_thread) -> None:
    """The cap of `max_model_mb` holds for the tree the model is fitted on, in every round."""
    data = _german()
    info = data.info()
    method = get_method("aim")
    config = method.config(
        "tiny", {"selections": "30", "rounds": "3", "max_model_mb": "0.02"}, info
    )
    plan = method.plan(info, PrivacyTarget(10.0, 1e-4), config)
    trainer = method.trainer(info, config, plan, torch.device("cpu"), 0)
    cap = 0.02 * 2**20 / 8
    for step in range(plan.steps):
        trainer.release_whole_data(step, data.x, data.y)
        cells = sum(f.values.size for f in trainer.tree.factors)
        assert cells <= max(cap * step / 3, sum(trainer.sizes))
        assert trainer.junction().cells() == cells
    assert trainer.selections > 3  # pairs were chosen: the cap bound, not an empty model


@pytest.mark.parametrize("spread", [1.0, 400.0])
def test_message_passing_matches_the_brute_force_joint_for_any_range_of_potentials(
    spread: float,
) -> None:
    """Noisy measurements push potentials hundreds apart (census at ε = 1): the node
    marginals must still be the model's, as the full joint computed in log space gives them
    (linear-space passing lost whole tables to underflow there)."""
    from scipy.special import logsumexp

    from dpsynth.methods.marginal import estimator

    rng = np.random.default_rng(0)
    sizes = (3, 4, 2, 5, 3)
    cliques = [(0,), (1,), (2,), (3,), (4,), (0, 1), (1, 2), (1, 3), (2, 3), (3, 4)]
    tree = JunctionTree.triangulated(sizes, cliques)
    oracle = estimator.TreeOracle(sizes, tree.cliques, tree.edges, cliques)
    for _ in range(10):
        theta = [rng.normal(0.0, spread, [sizes[a] for a in c]) for c in cliques]
        joint = np.zeros(sizes)
        for clique, table in zip(cliques, theta, strict=True):
            joint = joint + table.reshape([sizes[a] if a in clique else 1 for a in range(5)])
        joint -= logsumexp(joint)
        for node, table in zip(oracle.nodes, oracle.node_marginals(theta, 1.0), strict=True):
            axes = tuple(a for a in range(5) if a not in node)
            np.testing.assert_allclose(table, np.exp(logsumexp(joint, axis=axes)), atol=1e-9)
