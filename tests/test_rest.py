"""REST drafter: request retrieval vs brute force, trie / best-first subtree invariants, per-step cut, budget,
availability messages, and greedy + sampling losslessness on the embedded model."""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import on_cpu

from specdemo import budget as B
from specdemo.drafters import DrafterUnavailable, make_drafter
from specdemo.drafters.rest import build as RB
from specdemo.drafters.rest import drafter as R
from specdemo.drafters.rest import trie as T
from specdemo.drafters.rest.datastore import Datastore
from specdemo.offline import build_datastore as D
from specdemo.tree import DraftTree, TreeBuffers


# ---------------------------------------------------------------------------------------------------------------------
# Retrieval from the request
# ---------------------------------------------------------------------------------------------------------------------
def brute_context(tokens, max_len, min_len, length):
    n = len(tokens)
    for m in range(min(max_len, n - 1), max(min_len, 1) - 1, -1):
        pat = tokens[-m:]
        ends = [j for j in range(m - 1, n - 1) if tokens[j - m + 1 : j + 1] == pat]
        if ends:
            return m, [tokens[j + 1 : j + 1 + length] for j in ends]
    return 0, []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=40), st.integers(1, 16), st.integers(1, 3))
def test_context_matches_equal_brute_force(tokens, max_len, min_len):
    m, rows = R.context_matches(tokens, max_len, min_len, length=5, max_matches=1000)
    bm, conts = brute_context(tokens, max_len, min_len, 5)
    assert m == bm
    got = [[t for t in r if t != T.PAD] for r in rows.tolist()]
    assert got == conts


# ---------------------------------------------------------------------------------------------------------------------
# Trie and subtree
# ---------------------------------------------------------------------------------------------------------------------
# few distinct tokens, so rows share prefixes; among them the ends of one- and two-byte sort keys
TOKENS = st.one_of(st.integers(0, 3), st.sampled_from([255, 256, 65534, 65535, 70000]))
rows_strategy = st.lists(st.tuples(st.lists(TOKENS, min_size=1, max_size=5), st.integers(1, 20), st.booleans()),
                         min_size=1, max_size=60)


def as_arrays(items, length=5):
    rows = np.full((len(items), length), T.PAD, dtype=np.int64)
    for i, (r, _, _) in enumerate(items):
        rows[i, : len(r)] = r
    return rows, np.array([w for _, w, _ in items], float), np.array([c for _, _, c in items])


def node_paths(trie):
    paths = []
    for i in range(len(trie)):
        path, j = [], i
        while j >= 0:
            path.append(int(trie.tokens[j]))
            j = int(trie.parents[j])
        paths.append(tuple(path[::-1]))
    return paths


@settings(max_examples=100, deadline=None)
@given(rows_strategy)
def test_trie_weights_are_prefix_counts(items):
    rows, w, ctx = as_arrays(items)
    trie = T.build_trie(rows, w, ctx)
    want, want_ctx = defaultdict(float), defaultdict(float)
    for r, wt, c in items:
        for d in range(1, len(r) + 1):
            want[tuple(r[:d])] += wt
            want_ctx[tuple(r[:d])] += wt * c
    paths = node_paths(trie)
    assert sorted(paths) == sorted(want) and len(set(paths)) == len(paths)
    for i, p in enumerate(paths):
        assert trie.weight[i] == pytest.approx(want[p])
        assert trie.context_weight[i] == pytest.approx(want_ctx[p])
        assert trie.depth[i] == len(p)
    assert trie.total == pytest.approx(w.sum())


@settings(max_examples=100, deadline=None)
@given(rows_strategy, st.integers(0, 12), st.sampled_from([0.0, 0.05, 0.3]), st.sampled_from(["count", "acceptance"]),
       st.randoms())
def test_best_first_subtree_invariants(items, budget, min_share, scoring, rnd):
    rows, w, ctx = as_arrays(items)
    trie = T.build_trie(rows, w, ctx, scoring=T.Scoring(scoring))
    score = trie.score
    chosen = T.select_subtree(trie, budget, min_share)
    assert len(chosen) <= budget and len(set(chosen)) == len(chosen)
    seen = set()
    for i in chosen:  # every prefix is a subtree: the parent comes first
        assert trie.parents[i] < 0 or int(trie.parents[i]) in seen
        assert score[i] >= min_share - 1e-9
        seen.add(i)
    # best-first: no node left out whose parent is in (or is the root) scores more than the lowest chosen one
    if chosen and len(chosen) == budget:
        lowest = min(score[i] for i in chosen)
        for j in range(len(trie)):
            if j not in seen and (trie.parents[j] < 0 or int(trie.parents[j]) in seen):
                assert score[j] <= lowest + 1e-9
    # deterministic: the same draft whatever the order of the retrieved rows
    perm = list(range(len(items)))
    rnd.shuffle(perm)
    trie2 = T.build_trie(rows[perm], w[perm], ctx[perm], scoring=T.Scoring(scoring))
    t1 = R.to_draft_tree(trie, chosen)
    t2 = R.to_draft_tree(trie2, T.select_subtree(trie2, budget, min_share))
    assert (t1.tokens, t1.parents, t1.sources) == (t2.tokens, t2.parents, t2.sources)
    # a valid engine tree whose root-to-node paths are retrieved prefixes
    TreeBuffers.build(t1, 10)
    paths = set(node_paths(trie))
    for k in range(len(t1)):
        assert tuple(t1.tokens[j] for j in t1.path_to(k)) in paths


@settings(max_examples=150, deadline=None)
@given(rows_strategy, st.integers(1, 20), st.sampled_from(["count", "acceptance"]))
def test_pruned_trie_gives_the_same_draft(items, budget, kind):
    """build_trie(keep=budget) leaves out only nodes that cannot be among the budget best: the draft is unchanged."""
    rows, w, ctx = as_arrays(items)
    drafts = []
    for keep in (0, budget):
        trie = T.build_trie(rows, w, ctx, keep, T.Scoring(kind))
        t = R.to_draft_tree(trie, T.select_subtree(trie, budget))
        drafts.append((t.tokens, t.parents, t.sources, t.scores))
    assert drafts[0] == drafts[1]


def test_lexicographic_order_is_lexsort():
    rng = np.random.default_rng(0)
    for high in (5, 300, 70000):
        rows = rng.integers(-1, high, (200, 6))
        rows[rng.random(200) < 0.3] = rows[0]  # duplicates keep their order (stable)
        assert (T.lexicographic_order(rows) == np.lexsort(rows.T[::-1])).all()


@settings(max_examples=100, deadline=None)
@given(rows_strategy, st.sampled_from(["count", "acceptance"]))
def test_scores_follow_their_definition_node_by_node(items, kind):
    """Each node's score against its definition from the node's path (the trie computes all of them at once)."""
    rows, w, ctx = as_arrays(items)
    scoring = T.Scoring(kind)
    trie = T.build_trie(rows, w, ctx, scoring=scoring)
    weight = {p: trie.weight[i] for i, p in enumerate(node_paths(trie))}
    context = {p: trie.context_weight[i] for i, p in enumerate(node_paths(trie))}
    for i, path in enumerate(node_paths(trie)):
        want = 1.0
        for d in range(1, len(path) + 1):
            wt, parent = weight[path[:d]], weight[path[:d - 1]] if d > 1 else trie.total
            prior = scoring.context_prior if context[path[:d]] * 2 > wt else scoring.prior
            want *= min(scoring.confidence * wt / (parent + prior), 1.0)
        assert trie.score[i] == pytest.approx(trie.weight[i] / trie.total if kind == "count" else want)
        assert 0 < trie.score[i] <= 1
        assert trie.parents[i] < 0 or trie.score[i] <= trie.score[trie.parents[i]]


def test_acceptance_scores_shrink_single_continuations():
    one = T.build_trie(np.array([[1, 2, 3]]), np.array([1.0]))
    many = T.build_trie(np.array([[1, 2, 3]] * 50), np.ones(50))
    s1, s50 = one.score, many.score
    assert s1[0] == pytest.approx(0.95 / 2.6) and s1[2] == pytest.approx((0.95 / 2.6) ** 3)
    assert s50[2] > 0.75 > 0.4 > s1[0]


def test_sources_and_weights_merge_store_and_context():
    rows = np.array([[5, 6, T.PAD], [5, 7, T.PAD], [5, 7, T.PAD], [8, 9, 9]])
    trie = T.build_trie(rows, np.array([1.0, 1.0, 1.0, 20.0]), np.array([False, False, False, True]))
    tree = R.to_draft_tree(trie, T.select_subtree(trie, 10))
    assert tree.tokens[:2] == [5, 8] or tree.tokens[:2] == [8, 5]
    src = dict(zip(tree.tokens, tree.sources))
    assert src[8] == "prompt" and src[5] == "datastore" and src[9] == "prompt"
    assert T.select_subtree(trie, 2) == [int(np.flatnonzero(trie.tokens == 8)[0]),
                                         int(np.flatnonzero((trie.tokens == 9) & (trie.depth == 2))[0])]


# ---------------------------------------------------------------------------------------------------------------------
# The drafter on a tiny datastore
# ---------------------------------------------------------------------------------------------------------------------
class FakeTarget:
    def __init__(self, name="some/model", device="cpu", identity="Toy-8-000000000000"):
        self.name, self.device, self.identity = name, torch.device(device), identity
        self.artifacts = {}


def test_drafter_proposes_store_and_context_continuations(tmp_path):
    from specdemo.engine import DecodeState
    from specdemo.sampling import SamplingConfig

    tok = type("T", (), {"__len__": lambda s: 50, "get_vocab": lambda s: {str(i): i for i in range(50)}})()
    RB.build(tmp_path / "s", tok, token_docs=[[1, 2, 3, 4, 5, 6]] * 3 + [[1, 2, 3, 9]], progress=False)
    store = Datastore(tmp_path / "s", vocab_size=50)
    drafter = R.RestDrafter(store=store, budget=8, context_weight=20.0)
    state = DecodeState([40, 41, 42, 43, 7, 1, 2, 3], 3, 64, SamplingConfig(), None)
    tree = drafter.propose(state)
    assert tree.tokens[0] == 4 and tree.sources[0] == "datastore" and store.retrieve(state.tokens, 16, 2, 100, 10)[0] == 3
    chain = [tree.tokens[j] for j in tree.path_to(len(tree) - 1)]
    assert chain == [4, 5, 6] and 9 in tree.tokens
    # the request itself: "42 43" occurred earlier, followed by 7 1 2 3 ...: copied with the prompt label
    state = DecodeState([40, 41, 42, 43, 7, 1, 2, 3, 42, 43], 3, 64, SamplingConfig(), None)
    tree = drafter.propose(state)
    assert tree.tokens[:1] == [7] and tree.sources[0] == "prompt"
    assert [tree.tokens[j] for j in tree.path_to(len(tree) - 1)][:4] == [7, 1, 2, 3]
    assert R.RestDrafter(store=store, budget=0).propose(state) == DraftTree.empty()
    # SuffixDecoding's sizing: a 2-token match ("42 43") allows ceil(1.5 x 2) = 3 nodes, the whole chain without it
    assert len(R.RestDrafter(store=store, budget=8, context_weight=20.0, spec_factor=1.5).propose(state)) == 3
    assert len(tree) > 3


def test_open_store_keeps_one_store_per_model_and_path(tmp_path):
    """Opened once per model and kept on it (Target.artifacts, so it goes with the model); a store rebuilt in place
    is opened afresh."""
    import os

    from specdemo.target import tokenizer_identity

    tok = type("T", (), {"__len__": lambda s: 50, "get_vocab": lambda s: {str(i): i for i in range(50)}})()
    RB.build(tmp_path / "s", tok, token_docs=[[1, 2, 3, 4]], progress=False)
    target = FakeTarget(identity=tokenizer_identity(tok))
    target.tokenizer = tok
    first = R.open_store(tmp_path / "s", target)
    assert R.open_store(str(tmp_path / "s"), target) is first
    assert [v[1] for v in target.artifacts.values()] == [first]
    other = FakeTarget(identity=target.identity)
    other.tokenizer = tok
    assert R.open_store(tmp_path / "s", other) is not first  # another model: its own
    RB.build(tmp_path / "s", tok, token_docs=[[5, 6, 7]], progress=False)
    stamp = (tmp_path / "s" / "manifest.json").stat().st_mtime_ns
    os.utime(tmp_path / "s" / "manifest.json", ns=(stamp + 10**9, stamp + 10**9))  # a clearly newer manifest
    again = R.open_store(tmp_path / "s", target)
    assert again is not first and again.retrieve([5, 6], 16, 2)[0] == 2 and len(target.artifacts) == 1


def test_unavailable_reason_and_errors_name_the_command(tmp_path):
    other = FakeTarget()
    reason = R.unavailable_reason(other)
    assert reason and "python -m specdemo datastore build --model some/model --input" in reason
    with pytest.raises(DrafterUnavailable, match="datastore build --model some/model"):
        R.make(other, budget=4, dynamic=False)
    with pytest.raises(DrafterUnavailable, match="No datastore.*datastore build"):
        R.make(other, datastore=str(tmp_path / "missing"), budget=4, dynamic=False)
    assert R.make(other, datastore="none", budget=4, dynamic=False).store is None
    assert B.pick_budget(FakeTarget(device="cuda"), {16: 2.0}) == 64


def test_default_tree_size_follows_device_and_calibration(monkeypatch):
    """CPU with a calibration: sized per step under a cap of 24; CPU without one: a fixed 16-node tree; GPU: 64."""
    monkeypatch.setattr(B, "calibration_available", lambda target, method: method == "rest")
    cpu = R.make(FakeTarget(), datastore="none")
    assert (cpu.dynamic, cpu.budget) == (True, 24) and B.TREE_SIZES["rest"]["cpu"].dynamic_cap == 24
    gpu = R.make(FakeTarget(device="cuda"), datastore="none")
    assert (gpu.dynamic, gpu.budget) == (False, B.GPU_BUDGET)
    monkeypatch.setattr(B, "calibration_available", lambda target, method: False)
    plain = R.make(FakeTarget(), datastore="none")
    assert (plain.dynamic, plain.budget) == (False, 16) and B.TREE_SIZES["rest"]["cpu"].budget == 16
    assert R.make(FakeTarget(), datastore="none", dynamic=False, budget=9).budget == 9


# ---------------------------------------------------------------------------------------------------------------------
# On the embedded model
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def target():
    from specdemo.target import load_target

    return load_target()


@pytest.fixture(scope="module")
def tiny_store(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("rest") / "store"
    files = sorted(D.stdlib_dir().glob("*.py"))[:25]
    docs, _ = D.selfdistill_docs(__import__("specdemo.offline.corpus", fromlist=["x"]).SELFDISTILL_PATH, target.identity)
    RB.build_from_paths(out, target.tokenizer, files, progress=False, token_docs=docs[:200])
    return out


PROMPTS = [
    "Complete this Python function:\n```python\ndef add_all(values):\n    \"\"\"Return the sum of values.\"\"\"\n```",
    "Explain what a Python dictionary is, with an example.",
]


@pytest.mark.slow
def test_rest_is_lossless_greedy(target, tiny_store):
    from specdemo.engine import GenerationConfig, run_to_end

    for prompt in PROMPTS:
        ids = target.encode_prompt(prompt)
        cfg = GenerationConfig(max_new_tokens=48)
        ar, _ = run_to_end(target, ids, None, cfg)
        drafter = make_drafter("rest", target, datastore=str(tiny_store), budget=16, dynamic=False)
        got, events = run_to_end(target, ids, drafter, cfg)
        assert got == ar
        assert any(e.tree_size for e in events) and sum(e.accepted for e in events) > 0
        assert len(events) < len(ar)
        for e in events:
            assert e.tree_size <= 16 and (not e.tree.sources or set(e.tree.sources) <= {"datastore", "prompt"})


@pytest.mark.slow
def test_rest_is_lossless_sampling(target, tiny_store):
    from specdemo.engine import GenerationConfig, run_to_end
    from specdemo.sampling import SamplingConfig

    ids = target.encode_prompt(PROMPTS[0])
    for seed in (1,):
        cfg = GenerationConfig(max_new_tokens=48, sampling=SamplingConfig(temperature=0.8, top_p=0.95, seed=seed))
        ar, _ = run_to_end(target, ids, None, cfg)
        for options in ({}, {"spec_factor": 1.0}):
            drafter = make_drafter("rest", target, datastore=str(tiny_store), budget=16, dynamic=False, **options)
            got, events = run_to_end(target, ids, drafter, cfg)
            assert got == ar
            assert any(e.tree_size for e in events)


@pytest.mark.slow
def test_cost_curve_and_budget_on_cpu(target):
    target = on_cpu(target)
    curve = B.verify_cost_curve(target, sizes=(0, 4, 16), repeats=1)
    assert set(curve) == {0, 4, 16} and all(v > 0 for v in curve.values())
    assert B.verify_cost_curve(target, sizes=(0, 4, 16), repeats=1) == curve  # cached per model + device
    rel = B.relative_cost(curve)
    assert rel[0] == 1.0 and rel[4] <= rel[16]
    budget = B.pick_budget(target, {4: 1.6, 16: 1.85}, sizes=(0, 4, 16))
    assert budget in (0, 4, 16)
    assert B.pick_budget(target, {4: 10.0, 16: 10.5}, sizes=(0, 4, 16)) in (4, 16)  # a great drafter always drafts
    assert B.pick_budget(target, {4: 1.0, 16: 1.0}, sizes=(0, 4, 16)) == 0  # a useless one never does
