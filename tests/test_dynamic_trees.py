"""Per-step tree sizing: best-first order, the cost cut, the calibration, and losslessness with dynamic trees on."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdemo import budget as B
from specdemo import calibration as C
from specdemo.drafters import make_drafter
from specdemo.engine import GenerationConfig, run_to_end
from specdemo.sampling import SamplingConfig
from specdemo.tree import DraftTree

REL = {0: 1.0, 1: 1.1, 2: 1.15, 4: 1.25, 8: 1.4, 16: 1.7, 32: 2.4}


def random_tree(rng: random.Random, n: int) -> DraftTree:
    parents = [rng.randrange(-1, i) for i in range(n)]
    return DraftTree([rng.randrange(100) for _ in range(n)], parents, ["datastore"] * n, None,
                     [rng.random() for _ in range(n)])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 40), st.integers(0, 10**6))
def test_best_first_prefixes_are_subtrees(n, seed):
    tree = random_tree(random.Random(seed), n)
    order = tree.best_first()
    assert sorted(order) == list(range(n))
    for k in range(n + 1):
        taken = set(order[:k])
        assert all(tree.parents[i] < 0 or tree.parents[i] in taken for i in taken)
    cut = B.cut_to_cost(tree, REL)
    assert len(cut) <= n
    # the cut is a best-first prefix, re-indexed in the tree's own order (parents first)
    want = tree.subtree(sorted(order[: len(cut)]))
    assert (cut.tokens, cut.parents, cut.scores) == (want.tokens, want.parents, want.scores)
    probs = [tree.scores[i] for i in order]
    assert len(cut) == B.best_size(probs, REL)
    # a cap keeps the cut within the budget, still a best-first prefix
    capped = B.cut_to_cost(tree, REL, max_nodes=n // 2)
    assert len(capped) == B.best_size(probs[: n // 2], REL) <= n // 2
    assert capped.tokens == tree.subtree(sorted(order[: len(capped)])).tokens


def test_best_first_takes_the_best_available_node():
    # root children 0 (0.9) and 1 (0.2); 2 under 0 (0.8); 3 under 1 (0.95: only once 1 is in)
    tree = DraftTree([1, 2, 3, 4], [-1, -1, 0, 1], None, None, [0.9, 0.2, 0.8, 0.95])
    assert tree.best_first() == [0, 2, 1, 3]


def test_best_size_weighs_expected_tokens_against_cost():
    assert B.best_size([0.05, 0.02], REL) == 0  # not worth a 1.1x forward
    assert B.best_size([0.9, 0.8, 0.7, 0.01], REL) == 3
    assert B.best_size([0.95] * 40, REL) == 40
    assert B.best_size([], REL) == 0
    # nodes that ride along (probes) make a draft dearer
    assert B.best_size([0.2], REL) == 1 and B.best_size([0.2], REL, lambda n: 8 * n) == 0
    assert B.cost_at(REL, 3) == pytest.approx(1.2) and B.cost_at(REL, 64) == pytest.approx(3.8)


def test_cut_without_curve_or_scores_is_the_tree():
    tree = DraftTree.chain([1, 2, 3])
    assert B.cut_to_cost(tree, REL) is tree
    scored = DraftTree([1, 2], [-1, 0], None, None, [0.9, 0.9])
    assert B.cut_to_cost(scored, None) is scored


def test_isotonic_is_monotone_and_matches_rates():
    rng = np.random.default_rng(0)
    x = rng.random(4000)
    y = (rng.random(4000) < x**2).astype(float)  # true acceptance = score squared
    xs, ys = C.isotonic(x, y)
    assert all(a <= b for a, b in zip(ys, ys[1:])) and all(a < b for a, b in zip(xs, xs[1:]))
    for q in (0.2, 0.5, 0.9):
        assert abs(np.interp(q, xs, ys) - q**2) < 0.08
    xs, ys = C.isotonic(np.array([0.5] * 10), np.array([1.0] * 3 + [0.0] * 7))
    assert xs == [0.5] and ys == [0.3]


def test_isotonic_maps_each_tied_score_to_one_rate():
    # lookup nodes score by n-gram length (1, 2 or 3): many bins of one score must become one knot with its rate
    x = np.array([1.0] * 240 + [2.0] * 160 + [3.0] * 80)
    # within a score the outcomes come in runs (the order the rows were recorded in), so its bins' rates differ
    y = np.concatenate([[0] * 160 + [0, 0, 0, 1] * 20, [0, 1] * 80, [0, 1, 1, 1] * 20]).astype(float)
    xs, ys = C.isotonic(x, y)
    assert xs == [1.0, 2.0, 3.0] and ys == pytest.approx([20 / 240, 0.5, 0.75], abs=1e-6)


def test_fit_load_and_refusal(tmp_path):
    rows = [("head1", 1, s / 100, s > 50) for s in range(100)] + [("prompt", 6, 1.0, k % 4 == 0) for k in range(80)]
    tables = C.fit(rows)
    assert set(tables) == {"head1|1", "prompt|4"}  # depths past MAX_DEPTH share a table
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"format": C.FORMAT, "tokenizer": "tok-A", "tables": {"greedy": {"s4c": tables}}}))
    cal = C.load("m", "tok-A", "s4c", sampling=False, path=path)
    p = cal(["head1", "head1", "prompt", "other"], [1, 1, 5, 2], [0.1, 0.9, 1.0, 0.42])
    assert p[0] < 0.2 and p[1] > 0.8 and p[2] == pytest.approx(0.25) and p[3] == 0.42  # no table: raw score
    assert C.load("m", "tok-B", "s4c", sampling=False, path=path) is None  # another tokenizer
    assert C.load("m", "tok-A", "s4c", sampling=True, path=path) is None  # no sampling table
    assert C.load("m", "tok-A", "rest", sampling=False, path=path) is None
    assert C.load("m", "tok-A", "s4c", sampling=False, path=tmp_path / "missing.json") is None


def test_a_call_maps_each_score_through_its_own_table():
    """Scores of several tables in one call, interleaved, get what np.interp of each score alone gives, bit for bit;
    knots, points between and outside them, ties."""
    rng = random.Random(3)
    tables = {}
    for key in ("head1|1", "head2|2", "prompt|1"):
        xs = sorted(rng.random() for _ in range(6))
        tables[key] = {"x": xs, "y": sorted(rng.random() for _ in range(6)), "n": 1}
    cal = C.Calibrator(tables)
    sources = [rng.choice(["head1", "head2", "prompt", "other"]) for _ in range(200)]
    depths = [{"head1": 1, "head2": 2}.get(s, 1) for s in sources]
    scores = [rng.choice([rng.uniform(-0.5, 1.5), *tables["head1|1"]["x"]]) for _ in sources]
    expected = [float(np.interp(x, tables[f"{s}|{d}"]["x"], tables[f"{s}|{d}"]["y"])) if f"{s}|{d}" in tables else x
                for s, d, x in zip(sources, depths, scores)]
    assert cal(sources, depths, scores) == expected


def test_tables_fitted_under_a_former_source_name_serve_the_current_one():
    """Prompt lookup's grafts were "context" when the shipped calibration was fitted: those tables map "prompt"
    nodes (the old name still reads them too), and a table under the current name wins over the old one."""
    legacy = {"x": [0.0, 1.0], "y": [0.2, 0.2], "n": 1}
    current = {"x": [0.0, 1.0], "y": [0.7, 0.7], "n": 1}
    cal = C.Calibrator({"context|1": legacy, "context|2": legacy, "prompt|2": current, "head1|1": current})
    assert cal(["prompt", "context", "prompt", "head1"], [1, 1, 2, 1], [0.5] * 4) == [0.2, 0.2, 0.7, 0.7]
    shipped = C.load("embedded", _shipped_identity(), "s4c", sampling=False)
    if shipped is not None:
        assert "prompt|1" in shipped.tables and not any(k.startswith("context|") for k in shipped.tables)


def _shipped_identity() -> str:
    return json.loads(C.default_path("embedded").read_text())["tokenizer"] if C.default_path("embedded").exists() \
        else ""


def _calibration_file(tmp_path, target, generous: bool) -> str:
    """A calibration that maps every raw score to a fixed probability per depth: generous keeps big trees, the
    other says no node is ever accepted, so no tree can pay and every step is a plain one: both ends of the cut."""
    p = [0.9, 0.8, 0.7, 0.6] if generous else [0.0, 0.0, 0.0, 0.0]
    table = {f"{src}|{d}": {"x": [0.0, 1.0], "y": [p[d - 1], p[d - 1]], "n": 1}
             for src in ("head1", "head2", "head3", "prompt", "datastore", "adaptive") for d in range(1, 5)}
    tables = {m: table for m in ("rest", "s4c", "sdsat")}
    path = tmp_path / f"cal-{generous}.json"
    path.write_text(json.dumps({"format": C.FORMAT, "tokenizer": target.identity,
                                "tables": {"greedy": tables, "sampling": tables}}))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rest", "s4c", "sdsat"])
def test_dynamic_trees_lossless_and_within_budget(embedded, tmp_path, method):
    from specdemo.drafters import unavailable_reason

    assert unavailable_reason(method, embedded) is None, "the shipped artifact must load"
    prompt = embedded.encode_prompt("Write a Python function that returns the sum of a list of numbers.")
    greedy, sampled = SamplingConfig(), SamplingConfig(temperature=0.8, top_p=0.9, seed=5)
    refs = {}
    for generous, sampling in ((True, greedy), (True, sampled), (False, greedy)):
        cfg = GenerationConfig(max_new_tokens=24, sampling=sampling)
        if sampling.greedy not in refs:
            refs[sampling.greedy] = run_to_end(embedded, prompt, None, cfg)[0]
        opts = {"dynamic": True, "calibration": _calibration_file(tmp_path, embedded, generous)}
        if method != "sdsat":
            opts["budget"] = 12
        got, events = run_to_end(embedded, prompt, make_drafter(method, embedded, **opts), cfg)
        assert got == refs[sampling.greedy]
        drafts = [sum(not e.tree.is_probe(i) for i in range(len(e.tree))) for e in events]
        if method != "sdsat":
            assert max(e.tree_size for e in events) <= 12
        if generous:
            assert sum(drafts) > 0
        else:
            assert not any(drafts)  # no step judged worth a tree
        assert all(e.tree.scores is None or len(e.tree.scores) == len(e.tree) for e in events)


def test_calibrate_update_keeps_other_methods_and_refuses_other_settings(tmp_path):
    from types import SimpleNamespace

    from specdemo.offline import calibrate

    target = SimpleNamespace(identity="tok-A")
    prompts = [("sg:a:0", [1, 2]), ("sg:b:0", [3, 4])]
    args = SimpleNamespace(max_new_tokens=64)
    out = tmp_path / "cal.json"
    assert calibrate._kept(out, target, prompts, args) == ({}, {}, {})  # no file yet: start empty
    rest = {"datastore|1": {"x": [0.5], "y": [0.4], "n": 50}}
    out.write_text(json.dumps({"format": C.FORMAT, "tokenizer": "tok-A", "prompts": ["sg:a:0", "sg:b:0"],
                               "max_new_tokens": 64, "sampling": calibrate.SAMPLING, "command": "python -m specdemo calibrate",
                               "tables": {"greedy": {"rest": rest}}, "counts": {"greedy": {"rest": {"nodes": 50}}}}))
    tables, counts, commands = calibrate._kept(out, target, prompts, args)
    assert tables == {"greedy": {"rest": rest}} and counts["greedy"]["rest"] == {"nodes": 50}
    assert commands == {"greedy": {"rest": "python -m specdemo calibrate"}}  # the older file's one command
    with pytest.raises(ValueError, match="without --update"):
        calibrate._kept(out, target, prompts[:1], args)  # other prompts: its tables are not comparable


def test_calibrate_passes_drafter_options_and_records_them(tmp_path, monkeypatch):
    """`calibrate --option sdsat.adapter=DIR` calibrates a candidate adapter (into its own --out) rather than the
    shipped one; the file records the options its tables were collected with."""
    import argparse
    from types import SimpleNamespace

    from specdemo.offline import calibrate

    made = []
    monkeypatch.setattr(calibrate, "load_target", lambda name: SimpleNamespace(name="m", identity="tok"))
    monkeypatch.setattr(calibrate, "calibration_prompts", lambda n, max_tokens, target: [("sg:a:0", [1, 2])])
    monkeypatch.setattr(calibrate, "make_drafter", lambda method, target, **options: made.append((method, options)))
    monkeypatch.setattr(calibrate, "generate", lambda *args, **kwargs: iter(()))
    parser = argparse.ArgumentParser()
    calibrate.register(parser.add_subparsers())
    out = tmp_path / "cal.json"
    args = parser.parse_args(["calibrate", "--methods", "sdsat", "--modes", "greedy", "--option",
                              "sdsat.adapter=runs/x", "--option", "sdsat.k=2", "--out", str(out)])
    assert args.func(args) == 0
    assert made == [("sdsat", {**calibrate.METHOD_OPTIONS["sdsat"], "adapter": "runs/x", "k": 2})]
    collection = json.loads(out.read_text())["collection"]
    assert collection["sdsat"]["adapter"] == "runs/x" and collection["rest"] == calibrate.METHOD_OPTIONS["rest"]
    with pytest.raises(ValueError, match="not with --update"):
        args.func(parser.parse_args(["calibrate", "--option", "sdsat.k=2", "--update"]))


def test_every_default_tree_fits_the_engines_cap():
    """The engine trims any tree to `GenerationConfig.max_tree_nodes` in tree order (not best-first): a default above
    it would silently lose its best nodes."""
    from specdemo.budget import TREE_SIZES
    from specdemo.engine import GenerationConfig

    cap = GenerationConfig().max_tree_nodes
    for method, by_device in TREE_SIZES.items():
        for device, size in by_device.items():
            for nodes in (size.budget, size.dynamic_cap):
                assert nodes is None or nodes <= cap, (method, device, nodes)


def test_the_cost_curve_script_measures_a_random_model_from_its_shape_alone():
    """scripts/verify_cost_curve.py --random: a Llama of a named shape, random weights, no download (a GPU run reads
    the curves of 1B and 8B targets this way); here the tiny shape on the CPU."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "verify_cost_curve.py"
    out = subprocess.run([sys.executable, str(script), "--random", "tiny", "--dtype", "float32", "--sizes", "0,2,8",
                          "--repeats", "1", "--context", "20"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-1000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["model"] == "random tiny" and row["dtype"] == "float32"
    assert set(row["ms"]) == {"0", "2", "8"} and row["relative"]["0"] == 1.0 and all(v > 0 for v in row["ms"].values())


@pytest.mark.slow
def test_s4c_skips_head_calls_whose_nodes_the_cut_would_drop(embedded, monkeypatch):
    """With a steep cost curve (4-bit weights: each 4 more rows cost about another step) the deeper heads' calls
    whose nodes could not pay are skipped: fewer calls, and every step sends the tree it sends with every head run.
    (The calls' own price is left out here: it changes the trees by design; the next test has it.)"""
    import specdemo.drafters.s4c.drafter as s4c

    steep = {0: 1.0, 1: 1.11, 2: 1.19, 4: 1.6, 8: 2.14, 16: 3.2}
    calibrated = s4c.calibrated_cost
    monkeypatch.setattr(s4c, "calibrated_cost", lambda *a, **k: (calibrated(*a, **k)[0], steep))
    prompt = embedded.encode_prompt("Explain in three sentences how a refrigerator keeps food cold.")
    cfg = GenerationConfig(max_new_tokens=40)
    runs = {}
    for skipping in (True, False):
        drafter = make_drafter("s4c", embedded, dynamic=True, price_calls=False)
        calls = []
        run_head = drafter._run_head
        drafter._run_head = lambda h, *a, run_head=run_head, calls=calls: calls.append(h) or run_head(h, *a)
        if not skipping:
            drafter._deeper_may_pay = lambda *a: True
        out, events = run_to_end(embedded, prompt, drafter, cfg)
        runs[skipping] = (out, [(e.tree.tokens, e.tree.parents) for e in events], calls)
    (out, trees, calls), (out_all, trees_all, calls_all) = runs[True], runs[False]
    assert out == out_all and trees == trees_all
    assert len(calls) < len(calls_all) and calls.count(0) == calls_all.count(0)


@pytest.mark.slow
def test_s4c_prices_its_deeper_head_calls(embedded):
    """With the calls priced, a deeper head is called while its expected nodes pay for the call: a call that costs
    as much as a step stops the deeper heads after the calls that first measure them, free ones are made where the
    nodes are expected to make the cut (no more than the bound allows), and the output is AR's either way."""
    prompt = embedded.encode_prompt("Explain in three sentences how a refrigerator keeps food cold.")
    cfg = GenerationConfig(max_new_tokens=40)
    want, _ = run_to_end(embedded, prompt, None, cfg)
    deeper = {}
    for price in ("dear", "free", "off"):
        drafter = make_drafter("s4c", embedded, dynamic=True, price_calls=price != "off")
        calls = []
        run_head = drafter._run_head
        drafter._run_head = lambda h, *a, run_head=run_head, calls=calls: calls.append(h) or run_head(h, *a)
        if price != "off":
            begin = drafter.begin

            def priced_begin(state, hidden, begin=begin, drafter=drafter, price=price):
                begin(state, hidden)
                timed = drafter.pricing.timed_call  # every call timed at a step's seconds, or at none
                drafter.pricing.timed_call = lambda s, timed=timed, p=drafter.pricing: timed(
                    p.step_seconds if price == "dear" else 0.0)

            drafter.begin = priced_begin
        out, _ = run_to_end(embedded, prompt, drafter, cfg)
        assert out == want
        deeper[price] = sum(h > 0 for h in calls)
    assert deeper["dear"] <= 2 < deeper["free"] <= deeper["off"], deeper


def test_head_call_pricing_weighs_the_calls_against_their_nodes():
    from specdemo.drafters.s4c.head_calls import HeadCallPricing

    pricing = HeadCallPricing(n_heads=3, step_seconds=0.02)
    assert pricing.mean_top(2, 3) == [1.0, 1.0, 1.0]  # nothing seen: as sure as the parent, so that it is called
    pricing.saw(1, [[np.log(0.6), np.log(0.2), np.log(0.1)], [np.log(0.4), np.log(0.2), np.log(0.1)]])
    assert np.allclose(pricing.mean_top(1, 3), [0.5, 0.2, 0.1])
    assert np.allclose(pricing.mean_top(2, 3), [0.5, 0.2, 0.1])  # a deeper head unseen: head 1's
    pricing.saw(2, [[np.log(0.9), np.log(0.05), np.log(0.01)]] * 2)  # two rows of its own, shrunk towards head 1's
    assert np.allclose(pricing.mean_top(2, 3), [(1.8 + 4 * 0.5) / 6, (0.1 + 4 * 0.2) / 6, (0.02 + 4 * 0.1) / 6])
    now, sure = [0.9], [[0.8, 0.7]]
    assert pricing.pays(now, sure, REL, budget=8, drafting_seconds=0.0)  # free calls: two likely nodes pay
    pricing.timed_call(0.02)  # a call as dear as a step
    assert not pricing.pays(now, sure, REL, budget=8, drafting_seconds=0.0)
    assert not pricing.pays(now, [[0.01]], REL, budget=8, drafting_seconds=0.0)


def test_measured_costs_read_the_loaded_curve_and_never_measure():
    """The page's "cost of one verifying forward" line: the curve measured at load, relative to a plain step (made
    non-decreasing); a model without a measured curve gives nothing rather than a measurement inside a request."""
    from types import SimpleNamespace

    from specdemo.budget import CURVE_SIZES, measured_costs, pin_cost_curves

    target = SimpleNamespace(artifacts={})
    assert measured_costs(target) == {}
    seconds = {0: 0.01, 1: 0.011, 2: 0.012, 3: 0.0125, 4: 0.019, 6: 0.02, 8: 0.034, 12: 0.04, 16: 0.052, 24: 0.05,
               32: 0.09}
    pin_cost_curves(target, {",".join(map(str, CURVE_SIZES)): {str(n): t for n, t in seconds.items()}})
    assert measured_costs(target) == {4: 1.9, 16: 5.2}
    assert measured_costs(target, (24,)) == {24: 5.2}  # a dip in the timings never makes more drafts cheaper
