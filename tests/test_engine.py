"""Engine correctness: tree buffers, KV compaction, greedy and sampling losslessness, stop conditions, bad input."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import OracleDrafter, tolerance

from specdemo.drafters import make_drafter
from specdemo.engine import Drafter, GenerationConfig, generate, run_to_end
from specdemo.kvcache import KVCache
from specdemo.sampling import SamplingConfig, choose_tokens, filter_logits
from specdemo.target import ModelLoadError, UnsupportedForTree, load_target
from specdemo.tree import DepthTally, DraftTree, TreeBuffers, ancestor_mask, path_to
from specdemo.verify import check_tree_support, tree_forward

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a hash map, then give a short example in Python using a dict.",
]


# ---------------------------------------------------------------- tree buffers on hand-built trees
def test_tree_buffers_hand_built():
    #        root
    #       /    \
    #     a(0)   c(2)
    #     |        \
    #     b(1)     d(3)
    #               |
    #             e(4)
    tree = DraftTree(tokens=[10, 11, 12, 13, 14], parents=[-1, 0, -1, 2, 3])
    buf = TreeBuffers.build(tree, root_pos=7)
    assert buf.n == 6
    assert buf.depth.tolist() == [0, 1, 2, 1, 2, 3]
    assert buf.positions.tolist() == [7, 8, 9, 8, 9, 10]
    expect = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [1, 0, 0, 1, 1, 0],
        [1, 0, 0, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(buf.mask, expect)
    assert [tree.path_to(i) for i in range(len(tree))] == [[0], [0, 1], [2], [2, 3], [2, 3, 4]]
    assert buf.children[0] == {10: 1, 12: 3} and buf.children[3] == {13: 4} and buf.children[5] == {}
    mask4d = buf.attention_mask(past=4, dtype=torch.float32)
    assert mask4d.shape == (1, 1, 6, 10)
    assert (mask4d[0, 0, :, :4] == 0).all()  # everyone sees the committed context
    assert ((mask4d[0, 0, :, 4:] == 0) == expect).all()


def test_tree_probe_nodes_are_not_walkable_and_validation():
    tree = DraftTree(tokens=[5, 6, 7], parents=[-1, 0, 0], probe=[False, True, False])
    buf = TreeBuffers.build(tree, root_pos=0)
    assert buf.children[1] == {7: 3}  # the probe (token 6) is fed but never a candidate
    with pytest.raises(ValueError):
        DraftTree(tokens=[1, 2], parents=[-1, 1])  # parent after child
    with pytest.raises(ValueError):
        DraftTree(tokens=[1, 2], parents=[-1, 0], probe=[True, False])  # draft under a probe
    with pytest.raises(ValueError):
        DraftTree(tokens=[1], parents=[-1, 0])


def test_tree_prune_keeps_topology():
    tree = DraftTree(tokens=[1, 2, 3, 4, 5], parents=[-1, 0, 1, -1, 3], sources=list("abcde"))
    pruned = tree.prune(max_depth=1)
    assert pruned.tokens == [1, 4] and pruned.parents == [-1, -1] and pruned.sources == ["a", "d"]
    assert tree.prune(max_depth=9, max_nodes=3).tokens == [1, 2, 3]
    assert tree.prune(max_depth=0).tokens == []


# ---------------------------------------------------------------- KV compaction
def test_kv_compaction_matches_fresh_forward(tiny):
    """Accept a path through a branching tree, then the cached next-step logits equal a fresh forward."""
    torch.manual_seed(1)
    ctx = torch.randint(100, 5000, (9,)).tolist()
    tree = DraftTree(tokens=[11, 22, 33, 44, 55], parents=[-1, -1, 1, 2, 1])  # accept 22 -> 33 -> 44 (not first)
    cache = KVCache(capacity=8)  # forces a capacity grow too
    with torch.no_grad():
        tiny.decoder(input_ids=torch.tensor([ctx[:-1]], device=tiny.device), past_key_values=cache, use_cache=True)
        past = cache.get_seq_length()
        buf = TreeBuffers.build(tree, len(ctx) - 1, tiny.device)
        tree_forward(tiny, cache, ctx[-1:] + tree.tokens, buf)
        path = [2, 3, 4]  # tree positions of 22, 33, 44
        cache.keep(past + 1, [past + i for i in path])
        committed = ctx + [22, 33, 44]
        assert cache.get_seq_length() == len(committed)  # the bonus token (next root) is not cached yet
        nxt = 777
        h = tiny.decoder(input_ids=torch.tensor([[nxt]], device=tiny.device),
                         position_ids=torch.tensor([[len(committed)]], device=tiny.device),
                         past_key_values=cache, use_cache=True).last_hidden_state
        got = tiny.lm_head(h)[0, -1]
        want = tiny.model(input_ids=torch.tensor([committed + [nxt]], device=tiny.device)).logits[0, -1]
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("capacity", [128, 8])
def test_joint_kv_cache_holds_what_per_layer_buffers_hold(tiny, capacity):
    """Given the layer count, a cache keeps every layer's K and V as views of one tensor, and one gather and one
    scatter compact them all: after a tree step and a compaction its entries equal a per-layer cache's bit for bit.
    A capacity outgrown (8 slots, one key block, for 70 entries) sends the layers to buffers of their own, and
    compaction back to the per-layer loop."""
    torch.manual_seed(2)
    ctx = torch.randint(100, 5000, (65,)).tolist()
    tree = DraftTree(tokens=[11, 22, 33, 44, 55], parents=[-1, -1, 1, 2, 1])
    caches = [KVCache(capacity=capacity), KVCache(capacity=capacity, layers=tiny.n_layers)]
    with torch.no_grad():
        for cache in caches:
            tiny.decoder(input_ids=torch.tensor([ctx[:-1]], device=tiny.device), past_key_values=cache, use_cache=True)
            past = cache.get_seq_length()
            tree_forward(tiny, cache, ctx[-1:] + tree.tokens, TreeBuffers.build(tree, past, tiny.device))
            cache.keep(past + 1, [past + 2, past + 3, past + 4])
    plain, joint = caches
    assert joint._joint_ready() == (capacity == 128) and not plain._joint_ready()
    if capacity == 128:
        assert all(layer._k.untyped_storage().data_ptr() == joint.joint.untyped_storage().data_ptr()
                   for layer in joint.layers)
    assert plain.get_seq_length() == joint.get_seq_length() == len(ctx) + 3
    for a, b in zip(plain.layers, joint.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_check_tree_support_passes_and_catches_a_model_that_ignores_the_mask(tiny_llama):
    check_tree_support(tiny_llama)
    assert tiny_llama.tree_ok
    real = tiny_llama.step  # what decoding steps run (the CPU decoder step where the model has one)

    class IgnoresMask(torch.nn.Module):
        def forward(self, attention_mask=None, **kw):
            return real(**kw)

    tiny_llama.tree_ok = None
    original = tiny_llama.step_decoder
    tiny_llama.step_decoder = IgnoresMask()
    try:
        with pytest.raises(UnsupportedForTree, match="unsupported for tree verification"):
            check_tree_support(tiny_llama)
    finally:
        tiny_llama.step_decoder = original
        tiny_llama.tree_ok = None


def test_trees_stay_within_the_rows_the_target_verifies_row_for_row(tiny_llama):
    """Where the linears give a row other bits past some row count (Target.tree_rows, measured outside fp32), the
    engine sends no larger tree, and the output stays AR's."""
    torch.manual_seed(4)
    prompt = torch.randint(100, 5000, (10,)).tolist()
    cfg = GenerationConfig(max_new_tokens=24)
    ref, _ = run_to_end(tiny_llama, prompt, None, cfg)
    tiny_llama.tree_rows = 3
    try:
        out, events = run_to_end(tiny_llama, prompt, OracleDrafter(ref, tiny_llama.vocab_size, 3), cfg)
    finally:
        tiny_llama.tree_rows = None
    assert out == ref and max(len(ev.tree) for ev in events) == 2


# ---------------------------------------------------------------- greedy losslessness
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_lossless_tiny_models_oracle_trees(tiny, seed):
    torch.manual_seed(seed)
    prompt = torch.randint(100, 5000, (12,)).tolist()
    cfg = GenerationConfig(max_new_tokens=40)
    ref, ar_events = run_to_end(tiny, prompt, None, cfg)
    assert len(ar_events) == len(ref)  # AR: one token per forward
    out, events = run_to_end(tiny, prompt, OracleDrafter(ref, tiny.vocab_size, seed, probes=True), cfg)
    assert out == ref
    assert len(events) < len(ref)  # the oracle's drafts really were accepted
    for ev in events:
        assert not any(ev.tree.is_probe(i) for i in ev.accepted_nodes)
        assert ev.from_draft.count(True) == ev.accepted
        assert ev.tokens[: ev.accepted] == [ev.tree.tokens[i] for i in ev.accepted_nodes]


def test_every_token_carries_the_targets_top2_gap_where_it_was_chosen(tiny_llama):
    """A run that differs from AR shows how near a tie the first differing token was: each committed token carries the
    gap between the target's two best logits at the row that chose it, for AR and for drafted steps alike."""
    torch.manual_seed(3)
    prompt = torch.randint(100, 5000, (10,)).tolist()
    cfg = GenerationConfig(max_new_tokens=24)
    ref, ar_events = run_to_end(tiny_llama, prompt, None, cfg)
    with torch.no_grad():  # one full forward over prompt + answer: the logits that chose every answer token
        logits = tiny_llama.model(torch.tensor([prompt + ref[:-1]], device=tiny_llama.device)).logits[0, len(prompt) - 1:]
    best = logits.float().topk(2, -1).values
    ar_margins = [g for ev in ar_events for g in ev.margins]
    assert ar_margins == pytest.approx((best[:, 0] - best[:, 1]).tolist(), abs=1e-4)
    out, events = run_to_end(tiny_llama, prompt, OracleDrafter(ref, tiny_llama.vocab_size, 3), cfg)
    assert out == ref and any(ev.accepted for ev in events)
    assert [g for ev in events for g in ev.margins] == pytest.approx(ar_margins, abs=1e-4)


def test_greedy_lossless_tiny_models_pld(tiny):
    prompt = ([321, 654, 987, 111] * 5) + [321, 654]
    cfg = GenerationConfig(max_new_tokens=32)
    ref, _ = run_to_end(tiny, prompt, None, cfg)
    out, _ = run_to_end(tiny, prompt, make_drafter("pld", tiny), cfg)
    assert out == ref


@pytest.mark.slow
def test_greedy_lossless_embedded_all_drafters(embedded):
    cfg = GenerationConfig(max_new_tokens=48)
    for text in PROMPTS:
        ids = embedded.encode_prompt(text)
        ref, _ = run_to_end(embedded, ids, None, cfg)
        assert embedded.decode(ref).strip()
        out, events = run_to_end(embedded, ids, make_drafter("pld", embedded), cfg)
        assert out == ref
        out, _ = run_to_end(embedded, ids, OracleDrafter(ref, embedded.vocab_size), cfg)
        assert out == ref
    # and the AR baseline equals transformers' own greedy generate
    hf = embedded.model.generate(torch.tensor([ids], device=embedded.device), max_new_tokens=48, do_sample=False,
                                 eos_token_id=sorted(embedded.eos_ids), pad_token_id=sorted(embedded.eos_ids)[0])
    assert hf[0, len(ids):].tolist() == ref


# ---------------------------------------------------------------- sampling
def test_sampling_same_seed_same_text_tiny(tiny):
    torch.manual_seed(3)
    prompt = torch.randint(100, 5000, (10,)).tolist()
    for sc in (SamplingConfig(0.8, 0.9, 0, seed=7), SamplingConfig(1.0, 1.0, 20, seed=8)):
        cfg = GenerationConfig(max_new_tokens=32, sampling=sc)
        ref, _ = run_to_end(tiny, prompt, None, cfg)
        out, events = run_to_end(tiny, prompt, OracleDrafter(ref, tiny.vocab_size, 5), cfg)
        assert out == ref and len(events) < len(ref)
        other, _ = run_to_end(tiny, prompt, None, GenerationConfig(32, SamplingConfig(sc.temperature, sc.top_p, sc.top_k, sc.seed + 1)))
        assert other != ref  # the seed matters


@pytest.mark.slow
def test_sampling_same_seed_same_text_embedded(embedded):
    ids = embedded.encode_prompt(PROMPTS[1])
    cfg = GenerationConfig(max_new_tokens=40, sampling=SamplingConfig(0.7, 0.95, 50, seed=123))
    ref, _ = run_to_end(embedded, ids, None, cfg)
    out, _ = run_to_end(embedded, ids, make_drafter("pld", embedded), cfg)
    assert out == ref
    out, _ = run_to_end(embedded, ids, OracleDrafter(ref, embedded.vocab_size, 1), cfg)
    assert out == ref


class FixedDraft(Drafter):
    name = "fixed"

    def __init__(self, tree: DraftTree):
        self.tree = tree

    def propose(self, state):
        return self.tree


def test_sampling_distribution_exact_after_wrong_draft(tiny_llama):
    """Drafting the LEAST likely of the top-k tokens must not make it more likely: emitted first tokens, over many
    seeds, follow the target's filtered distribution (chi-square), and the second token follows p(. | first)."""
    prompt = [400, 500, 600, 700]
    sc = SamplingConfig(temperature=1.0, top_k=6)
    with torch.no_grad():
        logits = tiny_llama.model(input_ids=torch.tensor([prompt], device=tiny_llama.device)).logits[0, -1].float()
    probs = filter_logits(logits[None], sc)[0].softmax(-1)
    support = probs.nonzero().flatten().tolist()
    worst = min(support, key=lambda t: probs[t])
    tree = DraftTree(tokens=[worst, worst, support[0]], parents=[-1, 0, -1])
    counts = {t: 0 for t in support}
    n = 1200
    for seed in range(n):
        cfg = GenerationConfig(max_new_tokens=1, sampling=SamplingConfig(1.0, 1.0, 6, seed))
        out, _ = run_to_end(tiny_llama, prompt, FixedDraft(tree), cfg)
        counts[out[0]] += 1
    chi2 = sum((counts[t] - n * probs[t].item()) ** 2 / (n * probs[t].item()) for t in support)
    df = len(support) - 1
    assert chi2 < df + 5 * math.sqrt(2 * df), (chi2, counts, probs[support])  # ~p < 1e-3 for df = 5
    # and the drafted token is not favoured: its frequency within 4 sigma of its probability
    p = probs[worst].item()
    assert abs(counts[worst] - n * p) < 4 * math.sqrt(n * p * (1 - p)) + 1


def test_choose_tokens_keyed_by_position_only():
    logits = torch.randn(3, 50)
    sc = SamplingConfig(1.0, seed=11)
    a = choose_tokens(logits, [5, 6, 5], sc)
    b = choose_tokens(logits[[2, 0]], [5, 5], sc)
    assert a[2] == b[0] and a[0] == b[1]  # same row + same position -> same token, regardless of batch
    assert choose_tokens(logits, [1, 2, 3], SamplingConfig()) == logits.argmax(-1).tolist()


# ---------------------------------------------------------------- stopping: identical in every mode
def test_eos_stop_and_length_identical_across_modes(tiny):
    torch.manual_seed(4)
    prompt = torch.randint(100, 5000, (8,)).tolist()
    ref, _ = run_to_end(tiny, prompt, None, GenerationConfig(max_new_tokens=30))
    # pretend a token from the middle of the output is EOS: every mode must stop right after it
    eos_tok = ref[11]
    tiny.eos_ids.add(eos_tok)
    try:
        cut, ev = run_to_end(tiny, prompt, None, GenerationConfig(max_new_tokens=30))
        assert cut == ref[: ref.index(eos_tok) + 1] and ev[-1].finish_reason == "eos"
        spec, ev = run_to_end(tiny, prompt, OracleDrafter(ref, tiny.vocab_size, 2), GenerationConfig(max_new_tokens=30))
        assert spec == cut and ev[-1].finish_reason == "eos"
    finally:
        tiny.eos_ids.discard(eos_tok)
    text = tiny.decode(ref)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    if stop.strip():
        a, ev_a = run_to_end(tiny, prompt, None, GenerationConfig(max_new_tokens=30, stop_strings=[stop]))
        b, ev_b = run_to_end(tiny, prompt, OracleDrafter(ref, tiny.vocab_size, 3), GenerationConfig(30, stop_strings=[stop]))
        assert a == b and ev_a[-1].finish_reason == ev_b[-1].finish_reason == "stop"
        assert stop in tiny.decode(a) and stop not in tiny.decode(a[:-1])
    for n in (1, 7):
        a, _ = run_to_end(tiny, prompt, OracleDrafter(ref, tiny.vocab_size, 4), GenerationConfig(max_new_tokens=n))
        assert a == ref[:n]


def test_step_clocks_cover_the_same_work(tiny_llama):
    """draft_s times propose and observe (and the drafter's begin, on the first step only); verify_s the forward (and
    the prefill, on the first step); observe runs after every step but the last, so a finished step's draft_s has no
    observe in it."""
    import time

    class Slow(Drafter):
        name = "slow"
        observed = 0

        def begin(self, state, prompt_hidden):
            time.sleep(0.3)

        def propose(self, state):
            time.sleep(0.01)
            return DraftTree.empty()

        def observe(self, state, verified):
            self.observed += 1
            time.sleep(0.1)

    d = Slow()
    _, ev = run_to_end(tiny_llama, [5, 6, 7, 8], d, GenerationConfig(max_new_tokens=3))
    assert len(ev) == 3 and d.observed == 2 and ev[-1].finished
    assert ev[0].draft_s >= 0.41 and ev[1].draft_s >= 0.11
    assert ev[1].draft_s < 0.3  # begin counted once
    assert ev[2].draft_s < 0.1  # one token left: nothing proposed; the run ends: nothing observed
    assert all(e.verify_s < 0.3 for e in ev[1:])  # the drafter's sleeps are not in the verification clock


# ---------------------------------------------------------------- bad input
def test_bad_inputs_give_clear_errors(tiny_llama):
    with pytest.raises(ValueError, match="empty"):
        run_to_end(tiny_llama, [], None, GenerationConfig())
    with pytest.raises(ValueError, match="max_new_tokens"):
        run_to_end(tiny_llama, [1, 2], None, GenerationConfig(max_new_tokens=0))
    with pytest.raises(ValueError, match="context"):
        run_to_end(tiny_llama, [5] * 500, None, GenerationConfig(max_new_tokens=100))
    with pytest.raises(ValueError, match="temperature"):
        run_to_end(tiny_llama, [1, 2], None, GenerationConfig(sampling=SamplingConfig(temperature=-1)))
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-model"):
        load_target("no-such-org/no-such-model")
    with pytest.raises(ValueError, match="Unknown method"):
        make_drafter("warp", tiny_llama)


# ---------------------------------------------------------------- prompt lookup's cost-aware policy
def test_prompt_lookup_finds_what_a_brute_force_scan_finds():
    """The latest earlier occurrence of the longest suffix n-gram (max_ngram down to min_ngram), as a plain scan over
    every start finds it, on random contexts with many repeats."""
    import random

    from specdemo.drafters.pld import lookup_with_ngram_length

    def scan(tokens, num_tokens, max_ngram, min_ngram):
        for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
            for start in range(len(tokens) - 1 - n, -1, -1):
                if tokens[start : start + n] == tokens[-n:]:
                    return n, tokens[start + n : start + n + num_tokens]
        return 0, []

    rng = random.Random(5)
    for case in range(600):
        tokens = [rng.randrange(rng.choice([2, 4, 30])) for _ in range(rng.randrange(0, 60))]
        args = (rng.randrange(1, 12), rng.randrange(1, 6))
        args += (rng.randrange(1, args[1] + 1),)
        assert lookup_with_ngram_length(tokens, *args) == scan(tokens, *args), (tokens, args)


def test_pld_shadow_scoring_and_length_choice():
    """Every lookup is scored against what gets committed, sent or not; the draft length follows p and the cost curve."""
    from types import SimpleNamespace

    from specdemo.drafters.pld import PromptLookupDrafter

    rel = {0: 1.0, 1: 1.5, 2: 1.7, 4: 1.7, 8: 1.7, 16: 1.9}
    d = PromptLookupDrafter(rel_cost=rel)
    state = SimpleNamespace(tokens=[1, 2, 3, 4, 5, 6, 1, 2, 3])
    tree = d.propose(state)  # match "1 2 3" -> continuation 4 5 6 1 2 3; prior p = 0.5 -> worth a long draft
    assert len(tree) > 0 and tree.tokens == [4, 5, 6, 1, 2, 3][: len(tree)]
    state.tokens += [4, 5, 9]  # two tokens came true, the third did not
    d.observe(state, SimpleNamespace(tokens=[4, 5, 9]))
    assert d.stats == {(3, False): [2.0, 1.0]} and d._hit and d._shadows == []
    # a situation whose matches keep failing is not worth its cost; one that keeps matching gets a long draft
    d.stats = {(1, False): [1.0, 30.0], (3, True): [60.0, 2.0]}
    assert d._best_length((1, False), 10) == 0
    assert d._best_length((3, True), 10) == 10
    # an unsent continuation stays pending until it is decided
    d.stats, d._shadows = {}, [((2, False), 9, [7, 8, 9])]
    state.tokens = [0] * 9 + [7]
    d.observe(state, SimpleNamespace(tokens=[7]))
    assert d._shadows and d.stats == {}
    state.tokens += [8, 9]
    d.observe(state, SimpleNamespace(tokens=[8, 9]))
    assert d.stats == {(2, False): [3.0, 0.0]} and not d._shadows


def test_prompt_lookup_reads_every_size_of_the_cost_curve():
    """At int4 a verification's cost is a staircase: torch's kernel computes rows in blocks of 4, so 1-3 drafts
    (2-4 rows) cost about alike, then 4-7 drafts, and so on.  The int4 curve has every size, and prompt lookup sizes
    its chain on the measured points, not on a line drawn between sparse sizes; a curve saved over the sparse sizes
    cannot size an int4 model's trees."""
    from types import SimpleNamespace

    from specdemo.budget import CURVE_SIZES, INT4_CURVE_SIZES, curve_sizes, pin_cost_curves
    from specdemo.drafters.pld import PromptLookupDrafter

    def step(n: int) -> float:  # the relative cost of n drafts: one level per block of 4 rows
        return 1.0 if n == 0 else 1.3 + 0.6 * (n // 4) + 0.001 * n

    def saved(sizes):
        return {",".join(map(str, sizes)): {str(n): step(n) for n in sizes}}

    target = SimpleNamespace(artifacts={}, precision="int4")
    assert curve_sizes(target) == INT4_CURVE_SIZES and set(range(17)) <= set(INT4_CURVE_SIZES)
    assert curve_sizes(SimpleNamespace(precision="bf16")) == CURVE_SIZES
    with pytest.raises(ValueError, match="cannot replay"):
        pin_cost_curves(target, saved(CURVE_SIZES))
    pin_cost_curves(target, saved(INT4_CURVE_SIZES))
    d = PromptLookupDrafter()
    d.begin(SimpleNamespace(target=target), None)
    d.stats = {(3, True): [100.0, 0.0]}  # lookups in this situation nearly always come true
    assert d._best_length((3, True), 7) == 7  # a line from 6 drafts to 8 would price 7 above 6: it would send 6
    assert d._best_length((3, True), 3) == 3  # a line from 2 to 4 would price 3 above 2: it would send 2


def test_bench_replays_pinned_cost_curves(tiny_llama):
    """Drafts are sized by the verify cost curve: a pinned curve decides whether prompt lookup drafts at all, the
    bench JSON carries the curve it used, and the same request twice gives the same steps (no state carried over)."""
    from specdemo.bench import run_bench
    from specdemo.budget import CURVE_SIZES, CURVES, pin_cost_curves
    from specdemo.drafters import make_drafter
    from specdemo.engine import GenerationConfig, run_to_end

    ids = tiny_llama.encode_prompt("one two three one two three one two three one two")
    cfg = GenerationConfig(max_new_tokens=16)
    sizes = ",".join(map(str, CURVE_SIZES))
    saved = tiny_llama.artifacts.pop(CURVES, None)

    def curve(*costs: float) -> dict[str, float]:
        return {str(n): c for n, c in zip(CURVE_SIZES, costs)}

    def drafted() -> list[int]:
        return [e.tree_size for e in run_to_end(tiny_llama, ids, make_drafter("pld", tiny_llama), cfg)[1]]

    try:
        pin_cost_curves(tiny_llama, {sizes: curve(1.0, *range(50, 150, 10))})
        assert set(drafted()) == {0}  # no draft pays for itself
        res = run_bench(tiny_llama, ["pld"], [{"id": "a", "prompt": "one two"}], 4, warmup=False)
        assert res["cost_curves"][sizes]["1"] == 50.0
        assert res["methods"]["pld"]["per_prompt"][0]["tokens"] == res["methods"]["ar"]["per_prompt"][0]["tokens"]
        pin_cost_curves(tiny_llama, {sizes: curve(*[1.0] * len(CURVE_SIZES))})
        first = drafted()
        assert max(first) > 0 and drafted() == first
    finally:
        tiny_llama.artifacts.pop(CURVES, None)
        if saved is not None:
            tiny_llama.artifacts[CURVES] = saved


def test_bench_runs_labelled_variants_side_by_side(tiny_llama):
    """`s4c:chain`-style labels: one drafter module, its own options, its own row; AR is always added first."""
    from specdemo.bench import parse_options, run_bench

    opts = parse_options(["pld:short.num_tokens=2", "pld.max_ngram=2"])
    assert opts == {"pld:short": {"num_tokens": 2}, "pld": {"max_ngram": 2}}
    prompts = [{"id": "a", "prompt": "one two three one two three one two"}]
    res = run_bench(tiny_llama, ["pld", "pld:short"], prompts, 12, options=opts, warmup=False)
    assert list(res["methods"]) == ["ar", "pld", "pld:short"]
    assert all(m["identical"] == 1.0 for m in res["methods"].values())
    assert all(m["tau"] >= 1.0 for m in res["methods"].values())
    for m in res["methods"].values():  # a step's whole cost: the run's wall time over its steps
        steps = sum(len(p["accept_lengths"]) for p in m["per_prompt"])
        assert m["step_ms"] == pytest.approx(1e3 * sum(p["wall_time"] for p in m["per_prompt"]) / steps)
        assert all(0 < p["prefill_s"] < p["wall_time"] for p in m["per_prompt"]) and m["decode_speedup"] > 0
    assert res["methods"]["ar"]["decode_speedup"] == pytest.approx(1.0)
    events = list(generate(tiny_llama, tiny_llama.encode_prompt(prompts[0]["prompt"]), None, GenerationConfig(8)))
    assert events[0].prefill_s > 0 and all(e.prefill_s == 0 for e in events[1:])  # the first step carries it


def test_evicting_a_model_frees_it(tiny_llama):
    """What a race loads for a model (cost curves, drafter state) lives on the Target: once the model cache drops
    it and the race is over, nothing else holds the weights."""
    import gc
    import weakref

    from specdemo.app.models import ModelCache
    from specdemo.drafters import make_drafter
    from specdemo.engine import GenerationConfig, run_to_end

    path = tiny_llama.model.config._name_or_path or tiny_llama.name
    cache = ModelCache(keep=1)
    target = cache.get(path)
    assert target is not tiny_llama
    ids = target.encode_prompt("one two three one two three")
    run_to_end(target, ids, make_drafter("pld", target), GenerationConfig(max_new_tokens=8))
    assert target.artifacts, "the race measured a cost curve and kept it on the model"
    model = weakref.ref(target.model)
    del target
    cache.put("other", tiny_llama)  # keep=1: the loaded model is evicted
    cache.get("other")
    gc.collect()
    assert model() is None, "an evicted model must be freed"


def test_graft_follows_matching_nodes_and_hangs_the_rest():
    tree = DraftTree(tokens=[10, 11, 12], parents=[-1, 0, -1], sources=["head1", "head2", "head1"],
                     scores=[0.9, 0.5, 0.2])
    grafted = tree.graft([10, 11, 20, 21], "context")
    assert grafted.tokens == [10, 11, 12, 20, 21] and grafted.parents == [-1, 0, -1, 1, 3]
    assert grafted.sources[3:] == ["context", "context"] and grafted.scores[3:] == [1.0, 1.0]
    assert tree.graft([10, 11], "context") is tree  # nothing new to hang
    assert DraftTree.empty().graft([5, 6], "context").parents == [-1, 0]
    # a probe node never matches: the chain hangs off the root beside it
    probed = DraftTree(tokens=[7], parents=[-1], probe=[True])
    assert probed.graft([7], "context").parents == [-1, -1]


def test_ancestor_mask_matches_paths():
    parents = [-1, 0, 1, 0, -1, 4]
    allow = ancestor_mask(parents)
    for i in range(len(parents)):
        assert allow[i].nonzero().flatten().tolist() == sorted(path_to(parents, i))


def test_depth_tally():
    tally = DepthTally(3)
    tally.add(3, 0)
    tally.add(3, 2)
    tally.add(1, 1)
    both = tally + tally
    assert tally.reached == [3, 2, 2] and tally.accepted == [2, 1, 0] and both.steps == 6
    assert tally.share() == [2 / 3, 1 / 3, 0.0] and tally.conditional() == [2 / 3, 0.5, 0.0]
    assert tally.given_reached() == [2 / 3, 0.5, 0.0]


# ---------------------------------------------------------------- precision: the GPU default keeps the promise
def test_cuda_default_is_fp32_where_it_fits(monkeypatch):
    """On a GPU models load in fp32 when their weights fit in FP32_SHARE of its memory (exact output), in bf16 (or
    fp16) only when they do not or their size is unknown; an explicit dtype is obeyed.  A fake 16 GiB device."""
    from types import SimpleNamespace

    from specdemo.target import pick_device_dtype

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: SimpleNamespace(total_memory=16 * 2**30))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    cuda = torch.device("cuda")
    assert pick_device_dtype("cuda", None, 135_000_000) == (cuda, torch.float32)
    assert pick_device_dtype("cuda", "auto", 2_500_000_000) == (cuda, torch.float32)  # 10 GB of 16: fits
    assert pick_device_dtype("cuda", None, 3_500_000_000) == (cuda, torch.bfloat16)  # 14 GB > 0.7 x 16 GiB
    assert pick_device_dtype("cuda", None) == (cuda, torch.bfloat16)  # size unknown
    assert pick_device_dtype("cuda", "bfloat16", 1_000) == (cuda, torch.bfloat16)
    assert pick_device_dtype("cuda", "float32", 10**11) == (cuda, torch.float32)
    assert pick_device_dtype("cpu", None, 10**11) == (torch.device("cpu"), torch.float32)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert pick_device_dtype("cuda", None, 3_500_000_000) == (cuda, torch.float16)


def test_a_target_outside_fp32_says_so(tiny_llama):
    """A Target in half precision carries a note (exact = False) that describe(), the page's header, shows."""
    from dataclasses import replace

    from specdemo.target import _param_count, precision_note

    assert tiny_llama.exact and "near-ties" not in tiny_llama.describe()
    assert precision_note(torch.float32, None) == "" and precision_note(torch.float32, "float32") == ""
    big = replace(tiny_llama, dtype=torch.bfloat16, precision_note=precision_note(torch.bfloat16, None))
    assert not big.exact and "bfloat16 (too large for fp32 on this GPU)" in big.describe()
    assert big.describe().endswith(" · " + big.precision_note) and "near-ties" in big.describe()
    asked = precision_note(torch.float16, "float16")
    assert "as asked" in asked and "near-ties" in asked
    assert _param_count(tiny_llama.model.config._name_or_path) == tiny_llama.n_params


class _LayerProbe(Drafter):
    """Declares decoder layers and records the features it is handed; drafts the known continuation (3 tokens, the
    third wrong) so that steps accept paths."""

    name = "layer-probe"
    needs_hidden = True
    feature_layers = (1, 2)

    def __init__(self, reference: list[int]):
        self.reference, self.prompt_hidden, self.seen = reference, None, []

    def begin(self, state, prompt_hidden):
        self.prompt_hidden = prompt_hidden

    def propose(self, state):
        done = len(state.generated)
        return DraftTree.chain(self.reference[done : done + 2] + [0])

    def observe(self, state, verified):
        positions = len(state.tokens) - len(verified.tokens) - 1 + torch.arange(len(verified.hidden))
        self.seen.append((positions, verified.hidden))


@pytest.mark.parametrize("static", [False, True])
def test_declared_feature_layers_reach_the_drafter(tiny_llama, static):
    """A drafter declaring layers gets those layers' states beside the last ones, for the prompt and every accepted
    position, equal to one plain forward's hidden states there; the output stays AR's."""
    t, d = tiny_llama, tiny_llama.model.config.hidden_size
    ids = t.encode_prompt("The first features of a tree")
    cfg = GenerationConfig(max_new_tokens=16, static_shapes=static)
    ref, _ = run_to_end(t, ids, None, cfg)
    probe = _LayerProbe(ref)
    out, events = run_to_end(t, ids, probe, cfg)
    assert out == ref and any(e.accepted for e in events)
    with torch.no_grad():
        full = t.decoder(input_ids=torch.tensor([ids + out], device=t.device), output_hidden_states=True)
    want = torch.cat([full.hidden_states[1][0], full.hidden_states[2][0], full.last_hidden_state[0]], -1)
    assert probe.prompt_hidden.shape == (len(ids) - 1, 3 * d)
    tol = tolerance(t)
    torch.testing.assert_close(probe.prompt_hidden, want[: len(ids) - 1], rtol=tol, atol=tol)
    for positions, hidden in probe.seen:
        assert hidden.shape == (len(positions), 3 * d)
        torch.testing.assert_close(hidden, want[positions], rtol=tol, atol=tol)


def test_a_model_that_has_decoded_can_still_be_trained(tiny_llama):
    """generate runs in inference mode; nothing it leaves on the model (packed or fused weights, rotary tables,
    pooled caches) may turn the model's weights into inference tensors, which autograd refuses to save."""
    t = tiny_llama
    ids = t.encode_prompt(PROMPTS[0])
    cfg = GenerationConfig(max_new_tokens=12)
    before, _ = run_to_end(t, ids, make_drafter("pld", t), cfg)
    assert not any(p.is_inference() for p in t.model.parameters())
    q = t.model.get_decoder().layers[0].self_attn.q_proj.weight
    q.requires_grad_(True)
    try:
        with torch.enable_grad():
            loss = t.model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss
            loss.backward()
        assert q.grad is not None and torch.isfinite(q.grad).all()
    finally:
        q.requires_grad_(False)
        q.grad = None
    assert run_to_end(t, ids, make_drafter("pld", t), cfg)[0] == before
