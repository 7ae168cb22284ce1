"""Static-shape verification (specdemo/static_step.py), ON on the CPU: trees padded to buckets, inputs written in place
into buffers allocated once per bucket, a fixed-length KV cache compacted by index tensors.  It must give exactly the
tokens of the plain engine and of AR for every drafter, greedy and sampling, and the same accepted nodes wherever it
verifies the same tree (everywhere, for drafters that do not draft from the target's features)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import OracleDrafter, on_cpu, tolerance

import specdemo.engine as engine
from specdemo.drafters import make_drafter
from specdemo.engine import Drafter, GenerationConfig, run_to_end
from specdemo.verify import check_tree_support, prefilled_cache, trial_forward
from specdemo.kvcache import KVCache
from specdemo.sampling import SamplingConfig
from specdemo.static_step import (CAPACITY_STEP, POOL_LIMIT, STATIC_BUCKETS, StaticSteps, acquire_steps,
                                  buckets_for, configured_buckets, idle_steps, release_steps, wanted)
from specdemo.target import UnsupportedForTree
from specdemo.tree import DraftTree, TreeBuffers

GREEDY = SamplingConfig()
SAMPLING = SamplingConfig(temperature=0.8, top_p=0.9, seed=11)


class Recording(StaticSteps):
    """StaticSteps that note, per forward, the bucket's rows, the real rows and where every buffer lives."""

    made: list["Recording"] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[tuple[int, int]] = []  # (real rows, bucket rows) per forward
        self.where: dict[int, set[tuple[int, ...]]] = {}  # bucket rows -> the data_ptrs its forwards used
        Recording.made.append(self)

    def forward(self, ids, tree, past):
        hidden = super().forward(ids, tree, past)
        step = self._last
        assert torch.isfinite(hidden).all(), "a dummy row's output must be finite"
        tensors = (step.ids, step.positions, step.mask, step.slots, step.keep_src, step.keep_dst, step.allow,
                   self.cache.layers[0]._k, self.cache.layers[-1]._v)
        self.where.setdefault(step.rows, set()).add(tuple(t.data_ptr() for t in tensors))
        self.rows.append((tree.n, step.rows))
        return hidden


@pytest.fixture
def recording(monkeypatch):
    """Every run gets fresh Recording steps of its exact length (no pool: each run's buffers are its own)."""
    Recording.made = []
    monkeypatch.setattr(engine, "acquire_steps", lambda target, committed, nodes, buckets, layers, graphed:
                        Recording(target, committed, nodes, buckets, layers))
    monkeypatch.setattr(engine, "release_steps", lambda target, steps: None)
    return Recording.made


def same_runs(target, ids, make, cfg, same_trees=True):
    """AR and a drafter, each plain and with static shapes: one sequence of tokens, and wherever both drafted runs
    verified the same tree after the same prefix, the same accepted nodes.  Returns the static drafted run's events.

    same_trees: the drafted runs proposed the same trees at every step, so their steps and accept lengths are the
    same throughout.  Not for drafters that draft from the target's features (S4C's heads, SDSAT's probe logits):
    those rows differ from the plain engine's by float rounding (the fixed-length attention, see
    test_padding_is_bit_exact_and_the_fixed_length_only_rounds), which can reorder a draft head's near-tied candidates
    (S4C scores them in bf16) and so change a later tree; the target's tokens stay the same."""
    ref, _ = run_to_end(target, ids, None, replace(cfg, static_shapes=False))
    ar, ar_events = run_to_end(target, ids, None, replace(cfg, static_shapes=True))
    assert ar == ref and len(ar_events) == len(ref)
    plain, plain_events = run_to_end(target, ids, make(), replace(cfg, static_shapes=False))
    static, events = run_to_end(target, ids, make(), replace(cfg, static_shapes=True))
    assert plain == ref and static == ref
    plain_at = {e.position: e for e in plain_events}
    pairs = [(e, plain_at[e.position]) for e in events if e.position in plain_at]
    same = [(e, p) for e, p in pairs if (e.tree.tokens, e.tree.parents) == (p.tree.tokens, p.tree.parents)]
    assert same and all(e.accepted_nodes == p.accepted_nodes and e.tokens == p.tokens for e, p in same)
    if same_trees:
        assert len(same) == len(events) == len(plain_events)
    return events


class ChainDrafter(Drafter):
    """Drafts the known continuation as one chain of up to five tokens, every third chain wrong at its end."""

    name = "chain"

    def __init__(self, reference: list[int]) -> None:
        self.reference, self.calls = reference, 0

    def propose(self, state) -> DraftTree:
        self.calls += 1
        done = len(state.generated)
        truth = list(self.reference[done : done + 5])
        if truth and self.calls % 3 == 0:
            truth[-1] = (truth[-1] + 1) % 5000
        return DraftTree.chain(truth)


# ---------------------------------------------------------------- buckets and buffers
def test_buckets_cover_every_tree_the_engine_lets_through():
    assert buckets_for(64) == STATIC_BUCKETS == (0, 4, 8, 16, 32, 64)
    assert buckets_for(10) == (0, 4, 8, 10) and buckets_for(100) == (0, 4, 8, 16, 32, 64, 100)
    assert buckets_for(6, (2,)) == (2, 6) and buckets_for(0) == (0,)  # without 0, AR steps take the smallest bucket


def test_buckets_from_the_environment(monkeypatch):
    monkeypatch.delenv("SPECDEMO_STATIC_BUCKETS", raising=False)
    assert configured_buckets() == STATIC_BUCKETS == GenerationConfig().static_buckets
    monkeypatch.setenv("SPECDEMO_STATIC_BUCKETS", "16")
    assert configured_buckets() == (16,) == GenerationConfig().static_buckets
    monkeypatch.setenv("SPECDEMO_STATIC_BUCKETS", "8, 0,4")
    assert configured_buckets() == (0, 4, 8)
    for bad in ("x", "-1", ","):
        monkeypatch.setenv("SPECDEMO_STATIC_BUCKETS", bad)
        with pytest.raises(ValueError, match="node counts >= 0"):
            configured_buckets()


def test_ar_in_the_trees_bucket_computes_a_chains_rows_bit_for_bit(tiny_llama, recording):
    """With one bucket for every step, AR's rows and a chain's rows go through the same 17-row forward, and the
    target's top-2 logit gap of every committed token is the same float in both runs.  (With AR in a bucket of its
    own, a one-row forward, the gaps differ in their last bits on the dev CPU: one row and many sum in other orders.)"""
    tiny_llama = on_cpu(tiny_llama)  # a claim about the CPU's kernels
    torch.manual_seed(5)
    prompt = torch.randint(100, 5000, (12,)).tolist()
    cfg = GenerationConfig(max_new_tokens=32, static_shapes=True, static_buckets=(16,), max_tree_nodes=16)
    ref, ar = run_to_end(tiny_llama, prompt, None, cfg)
    out, chain = run_to_end(tiny_llama, prompt, ChainDrafter(ref), cfg)
    assert out == ref and any(e.accepted for e in chain)
    assert {rows for run in recording for _, rows in run.rows} == {17}  # AR's steps padded like the trees
    assert [g for e in ar for g in e.margins] == [g for e in chain for g in e.margins]


def test_default_is_on_for_cuda_only_and_the_env_decides_when_set(monkeypatch):
    monkeypatch.delenv("SPECDEMO_STATIC_SHAPES", raising=False)
    assert wanted(None, torch.device("cuda")) and not wanted(None, torch.device("cpu"))
    assert wanted(True, torch.device("cpu")) and not wanted(False, torch.device("cuda"))
    monkeypatch.setenv("SPECDEMO_STATIC_SHAPES", "1")
    assert wanted(None, torch.device("cpu"))
    monkeypatch.setenv("SPECDEMO_STATIC_SHAPES", "0")
    assert not wanted(None, torch.device("cuda")) and wanted(True, torch.device("cuda"))
    assert GenerationConfig().static_shapes is None


def test_buffers_allocated_once_per_bucket_and_dummies_padded(tiny_llama, recording):
    torch.manual_seed(0)
    prompt = torch.randint(100, 5000, (12,)).tolist()
    cfg = GenerationConfig(max_new_tokens=40)
    ref, _ = run_to_end(tiny_llama, prompt, None, replace(cfg, static_shapes=False))
    events = same_runs(tiny_llama, prompt, lambda: OracleDrafter(ref, tiny_llama.vocab_size, 0, probes=True), cfg)
    ar, steps = recording
    assert set(ar.where) == {1} and len(ar.where[1]) == 1 and len(ar.rows) == len(ref)  # AR: the 1-row bucket
    assert len(steps.rows) == len(events)
    assert all(rows - 1 in steps.buckets and real <= rows for real, rows in steps.rows)
    assert any(real < rows for real, rows in steps.rows), "some trees were padded"
    for rows, where in steps.where.items():
        assert len(where) == 1, f"the {rows}-row bucket's buffers moved between steps"
    assert max(sum(1 for _, r in steps.rows if r == rows) for rows in steps.where) > 1
    assert set(steps.inputs) == {rows - 1 for rows in steps.where}  # allocated for the buckets used, only


# ---------------------------------------------------------------- the logits of one forward
def _static_logits(target, ctx, tree, buckets, max_nodes=64, committed_max=None):
    past = len(ctx) - 1
    steps = StaticSteps(target, committed_max or len(ctx) + 8, max_nodes, buckets)
    target.decoder(input_ids=torch.tensor([ctx[:-1]], device=target.device), past_key_values=steps.cache,
                   use_cache=True)
    buf = TreeBuffers.build(tree, past, target.device)
    with torch.no_grad():
        hidden = steps.forward([ctx[-1]] + tree.tokens, buf, past)
        return target.lm_head(hidden[: buf.n]), steps._last.rows


@torch.no_grad()
def test_padding_is_bit_exact_and_the_fixed_length_only_rounds(tiny):
    """Dummy rows change no real row's logits by a single bit.  Against the plain engine the real rows are
    argmax-identical but not bitwise: the CPU attention kernel sums over the key length in blocks split by that
    length, and the static cache's length is its capacity (the extra keys at weight exactly 0), not past + n.  With
    a cache exactly as long as the plain engine's keys the two are the same bits: that length is the only cause.
    (The CPU's kernels: a GPU's products pick other kernels for other row counts, which AR in the trees' bucket
    answers, docs/gpu/README.md.)"""
    tiny = on_cpu(tiny)
    torch.manual_seed(1)
    ctx = torch.randint(100, 5000, (20,)).tolist()
    tree = DraftTree(tokens=[11, 22, 33, 44, 55], parents=[-1, -1, 1, 2, 1])
    exact, rows = _static_logits(tiny, ctx, tree, (5,))
    assert rows == 6
    for buckets, padded_rows in (((8,), 9), ((16,), 17), ((), 65)):
        got, rows = _static_logits(tiny, ctx, tree, buckets)
        assert rows == padded_rows and torch.equal(got, exact)
    plain, _ = trial_forward(tiny, prefilled_cache(tiny, ctx[:-1], 8), ctx[-1], tree)
    assert torch.equal(plain.argmax(-1), exact.argmax(-1))
    assert (plain - exact).abs().max() <= 1e-4 * plain.abs().max()
    # capacity = committed_max + the largest bucket (5) + 2 = past + 6 = the plain engine's key length
    same_length, rows = _static_logits(tiny, ctx, tree, (), max_nodes=5, committed_max=len(ctx) - 2)
    assert rows == 6
    assert torch.equal(same_length, plain)


@torch.no_grad()
def _one_tree_step(tiny, tree: DraftTree, seed: int) -> tuple[StaticSteps, list[int], int]:
    """Static steps after a 9-token context's prefill and one padded step over `tree`: (steps, context, root slot)."""
    torch.manual_seed(seed)
    ctx = torch.randint(100, 5000, (9,)).tolist()
    steps = StaticSteps(tiny, 20, 8, (0, 8))
    tiny.decoder(input_ids=torch.tensor([ctx[:-1]], device=tiny.device), past_key_values=steps.cache, use_cache=True)
    past = len(ctx) - 1
    steps.forward(ctx[-1:] + tree.tokens, TreeBuffers.build(tree, past, tiny.device), past)
    return steps, ctx, past


def test_compaction_keeps_only_the_accepted_path(tiny):
    """After a padded step and an index-tensor compaction, the cache holds context + accepted path: the next
    step's logits equal a fresh forward over the committed tokens (no dummy or rejected entry survives)."""
    tree = DraftTree(tokens=[11, 22, 33, 44, 55], parents=[-1, -1, 1, 2, 1])  # accept 22 -> 33 -> 44 (not first)
    steps, ctx, past = _one_tree_step(tiny, tree, seed=1)
    steps.keep(past + 1, [past + 2, past + 3, past + 4])
    assert steps.cache._joint_ready()  # every layer's entries moved by one gather and one scatter
    committed = ctx + [22, 33, 44]
    assert steps.cache.get_seq_length() == len(committed)
    nxt = DraftTree.empty()
    h = steps.forward([777], TreeBuffers.build(nxt, len(committed), tiny.device), len(committed))
    got = tiny.lm_head(h[:1])[0]
    want = tiny.model(input_ids=torch.tensor([committed + [777]], device=tiny.device)).logits[0, -1]
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    assert steps._last.rows == 1


def test_entries_already_in_place_move_nothing(tiny, monkeypatch):
    """An AR step's entry and a chain accepted from its first node are where the compaction would put them: no copy
    runs (on a GPU each is ~120 kernel launches), and the next step still sees exactly the committed tokens."""
    moves = []
    monkeypatch.setattr(KVCache, "move", lambda self, dst, src, length: moves.append(length))
    tree = DraftTree(tokens=[11, 22, 33, 44], parents=[-1, 0, 1, -1])  # accept 11 -> 22 -> 33: rows 1, 2, 3
    steps, ctx, past = _one_tree_step(tiny, tree, seed=2)
    steps.keep(past + 1, [past + 1, past + 2, past + 3])
    committed = ctx + [11, 22, 33]
    steps.forward([777], TreeBuffers.build(DraftTree.empty(), len(committed), tiny.device), len(committed))
    steps.keep(len(committed) + 1, [])  # an AR step
    assert moves == [] and steps.cache.get_seq_length() == len(committed) + 1
    h = steps.forward([5], TreeBuffers.build(DraftTree.empty(), len(committed) + 1, tiny.device), len(committed) + 1)
    want = tiny.model(input_ids=torch.tensor([committed + [777, 5]], device=tiny.device)).logits[0, -1]
    assert torch.allclose(tiny.lm_head(h[:1])[0], want, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- the self-check
def test_self_check_holds_with_padded_masks_and_catches_a_model_that_ignores_them(tiny_llama, monkeypatch):
    tiny_llama.tree_ok = tiny_llama.static_ok = None
    check_tree_support(tiny_llama, static=True)
    assert tiny_llama.tree_ok and tiny_llama.static_ok
    real = tiny_llama.step  # what decoding steps run, static ones included (the CPU decoder step where it exists)

    class IgnoresMask(torch.nn.Module):
        def forward(self, attention_mask=None, **kw):
            return real(**kw)

    monkeypatch.setattr(tiny_llama, "step_decoder", IgnoresMask())
    try:
        tiny_llama.tree_ok = tiny_llama.static_ok = None
        with pytest.raises(UnsupportedForTree, match="padded static-shape mask|custom 4D attention mask"):
            check_tree_support(tiny_llama, static=True)
        with pytest.raises(UnsupportedForTree):
            run_to_end(tiny_llama, [5, 6, 7], None, GenerationConfig(max_new_tokens=3, static_shapes=True))
        # asked for by default (the env stands in for CUDA): AR falls back to the plain path, which needs no mask
        monkeypatch.setenv("SPECDEMO_STATIC_SHAPES", "1")
        out, _ = run_to_end(tiny_llama, [5, 6, 7], None, GenerationConfig(max_new_tokens=3))
        assert len(out) == 3
    finally:
        monkeypatch.undo()
        tiny_llama.tree_ok = tiny_llama.static_ok = None


# ---------------------------------------------------------------- losslessness, tiny models
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLING], ids=["greedy", "sampling"])
@pytest.mark.parametrize("seed", [0, 1])
def test_oracle_trees_tiny_models(tiny, sampling, seed):
    torch.manual_seed(seed)
    prompt = torch.randint(100, 5000, (12,)).tolist()
    cfg = GenerationConfig(max_new_tokens=40, sampling=sampling)
    ref, _ = run_to_end(tiny, prompt, None, cfg)
    events = same_runs(tiny, prompt, lambda: OracleDrafter(ref, tiny.vocab_size, seed, probes=True), cfg)
    assert len(events) < len(ref) and any(e.tree_size not in STATIC_BUCKETS for e in events)
    assert not any(e.tree.is_probe(i) for e in events for i in e.accepted_nodes)


def test_small_buckets_one_token_prompt_and_stops(tiny_llama):
    """Custom buckets under a low node ceiling, a prompt with nothing to prefill, and the length limit reached with a
    full tree: the fixed capacity holds every slot a step touches."""
    prompt = [321]
    cfg = GenerationConfig(max_new_tokens=24, max_tree_nodes=6, static_buckets=(2,))
    ref, _ = run_to_end(tiny_llama, prompt, None, cfg)
    events = same_runs(tiny_llama, prompt, lambda: OracleDrafter(ref, tiny_llama.vocab_size, 3), cfg)
    assert max(e.tree_size for e in events) <= 6 and events[-1].finish_reason == "length"


def test_pooled_steps_serve_later_requests_with_the_tokens_of_fresh_ones(tiny_llama, monkeypatch):
    """Runs take their static steps (cache, buffers, and on CUDA the captured graphs) from a pool on the target: a
    later request of similar size reuses them, reset, and decodes exactly what the plain engine decodes; a run the
    caller stops early gives them back too, and interleaved runs (a race) each hold their own."""
    from specdemo.budget import measure_cost_curves

    def pooled():
        return idle_steps(tiny_llama)

    measure_cost_curves(tiny_llama)  # on a GPU the curve is timed through pooled steps of its own: not these runs'
    pooled().clear()
    prompts = [([321, 654, 987, 111] * 5) + [321, 654], [77, 88, 99, 77, 88, 99, 5], [321, 654, 987]]
    cfg = GenerationConfig(max_new_tokens=24, sampling=SAMPLING)
    for prompt in prompts + prompts[:1]:
        ref, _ = run_to_end(tiny_llama, prompt, make_drafter("pld", tiny_llama), replace(cfg, static_shapes=False))
        got, _ = run_to_end(tiny_llama, prompt, make_drafter("pld", tiny_llama), replace(cfg, static_shapes=True))
        assert got == ref
    assert len(pooled()) == 1  # one entry served all four requests
    first = engine.generate(tiny_llama, prompts[0], None, replace(cfg, static_shapes=True))
    second = engine.generate(tiny_llama, prompts[1], None, replace(cfg, static_shapes=True))
    next(first), next(second)
    assert pooled() == []  # both runs hold steps: the pool made a second entry
    first.close(), second.close()
    assert len(pooled()) == 2
    for committed in range(0, 12 * CAPACITY_STEP, CAPACITY_STEP):  # twelve shapes released: the oldest go
        release_steps(tiny_llama, acquire_steps(tiny_llama, committed + 1, 8, (0, 8), ()))
    assert len(pooled()) == POOL_LIMIT and pooled()[-1][0][0] == 12 * CAPACITY_STEP
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")  # ZeroGPU attaches the GPU per call: nothing is kept
    release_steps(tiny_llama, acquire_steps(tiny_llama, 1, 8, (0, 4), ()))
    assert len(pooled()) == POOL_LIMIT and pooled()[-1][0][0] == 12 * CAPACITY_STEP


def test_prompt_lookup_tiny_models(tiny):
    prompt = ([321, 654, 987, 111] * 5) + [321, 654]
    for sampling in (GREEDY, SAMPLING):
        cfg = GenerationConfig(max_new_tokens=32, sampling=sampling)
        same_runs(tiny, prompt, lambda: make_drafter("pld", tiny), cfg)


# ---------------------------------------------------------------- losslessness, every drafter on the embedded model
@pytest.mark.slow
@pytest.mark.parametrize("method", ["pld", "rest", "s4c", "sdsat"])
def test_every_drafter_embedded(embedded, method):
    ids = embedded.encode_prompt("Write a Python function that returns the n-th Fibonacci number, with a docstring.")
    accepted = 0
    for sampling in (GREEDY, SAMPLING):
        cfg = GenerationConfig(max_new_tokens=40, sampling=sampling)
        events = same_runs(embedded, ids, lambda: make_drafter(method, embedded), cfg,
                           same_trees=method in ("pld", "rest"))
        accepted += sum(e.accepted for e in events)
    assert accepted > 0, f"{method} drafted nothing that was accepted: the comparison proved little"


def test_cost_curves_measure_the_steps_runs_take(tiny_llama, monkeypatch):
    """Where runs verify through static steps (CUDA graphs on a GPU), the cost curve is timed through them too (a
    launch-bound GPU's eager curve is flat where its graphed one is not): the same logits as the plain harness, the
    steps back in the pool afterwards."""
    from specdemo import budget

    g = torch.Generator().manual_seed(4)
    ids = torch.randint(100, 3000, (40,), generator=g).tolist()
    tree = DraftTree.chain(ids[20:26])
    monkeypatch.setenv("SPECDEMO_STATIC_SHAPES", "0")
    with budget.trial_cache(tiny_llama, ids[:19], 8) as (cache, steps):
        assert steps is None
        want, _ = trial_forward(tiny_llama, cache, ids[19], tree)
    monkeypatch.setenv("SPECDEMO_STATIC_SHAPES", "1")
    idle_steps(tiny_llama).clear()
    with budget.trial_cache(tiny_llama, ids[:19], 8) as (cache, steps):
        got, seconds = trial_forward(tiny_llama, cache, ids[19], tree, steps)
        again, _ = trial_forward(tiny_llama, cache, ids[19], tree, steps)  # the trial leaves the cache as it found it
    assert seconds > 0 and torch.equal(got, again) and len(idle_steps(tiny_llama)) == 1
    torch.testing.assert_close(got, want, rtol=tolerance(tiny_llama), atol=tolerance(tiny_llama))
