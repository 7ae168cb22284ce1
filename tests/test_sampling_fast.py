"""choose_tokens (its sampling half is sampling_fast.py) against the straightforward full-vocabulary definition:
filter_logits over every row, then the argmax of filtered / T + noise (the reference below, written out again here
with its own noise so that sampling.reference_tokens is checked too).

The fast path decides top-k / top-p from a few candidates per row and takes the noise's logs only at kept tokens; it
must return the reference's tokens exactly, including where float32 rounding or equal logits decide the top-p cut.
No model is loaded.
"""
from __future__ import annotations

import hashlib
import itertools
import math

import pytest
import torch

from specdemo import sampling, sampling_fast
from specdemo.sampling import (
    SamplingConfig,
    choose_tokens,
    filter_logits,
    position_noise,
    reference_tokens,
)


# ---------------------------------------------------------------- the reference: every row over the whole vocabulary
def ref_position_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    key = int.from_bytes(hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest(), "little")
    u = torch.rand(vocab, generator=torch.Generator().manual_seed(key & 0x7FFF_FFFF_FFFF_FFFF), dtype=torch.float64)
    return -torch.log(-torch.log(u.clamp_min(1e-300)))


def ref_choose_tokens(logits: torch.Tensor, positions: list[int], cfg: SamplingConfig) -> list[int]:
    if cfg.greedy:
        return logits.argmax(-1).tolist()
    filtered = filter_logits(logits.float(), cfg).cpu().double()
    noise_by_pos: dict[int, torch.Tensor] = {}
    out = []
    for row, pos in zip(filtered, positions):
        if pos not in noise_by_pos:
            noise_by_pos[pos] = ref_position_noise(cfg.seed, pos, row.shape[-1])
        out.append(int((row + noise_by_pos[pos]).argmax()))
    return out


# ---------------------------------------------------------------- inputs
def make_logits(kind: str, n: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Row shapes the cut behaves differently on: LLM-like (a few strong tokens over a long tail), peaked, flat,
    Gaussian, and heavily tied (rounded, as bf16 logits are)."""
    g = torch.randn(n, vocab, generator=gen)
    if kind == "llm":
        x = g * 2.0 - 4.0
        x[:, :12] += torch.rand(n, 12, generator=gen) * 14.0
        return x[:, torch.randperm(vocab, generator=gen)]
    if kind == "peaked":
        x = g * 2.0
        x[torch.arange(n), torch.randint(vocab, (n,), generator=gen)] += 12.0
        return x
    if kind == "flat":
        return g * 0.05
    if kind == "gauss":
        return g * 3.0
    if kind == "ties":
        return (g * 3.0).round() / 2  # a few dozen distinct values
    raise ValueError(kind)


KINDS = ["llm", "peaked", "flat", "gauss", "ties"]
TOP_PS = [0.5, 0.9, 0.95, 1.0]
TOP_KS = [0, 1, 20, 50]


def positions_for(n: int) -> list[int]:
    """A tree step's positions: the root, then nodes whose depths repeat."""
    return [40] + [41 + (i % 3) for i in range(n - 1)]


@pytest.mark.parametrize("vocab", [49152, 1000, 50])
@pytest.mark.parametrize("kind", KINDS)
def test_same_tokens_as_reference(vocab, kind):
    gen = torch.Generator().manual_seed(vocab + KINDS.index(kind))
    n = 16 if vocab < 49152 else 6
    logits = make_logits(kind, n, vocab, gen)
    positions = positions_for(n)
    for temperature, top_p, top_k in itertools.product([0.6, 1.0], TOP_PS, TOP_KS):
        cfg = SamplingConfig(temperature, top_p, top_k, seed=int(torch.randint(1000, (1,), generator=gen)))
        assert choose_tokens(logits, positions, cfg) == ref_choose_tokens(logits, positions, cfg), (temperature,
                                                                                                   top_p, top_k)


def test_the_rule_in_sampling_py_is_the_reference():
    """sampling.reference_tokens (the rule as the package states it) gives this file's reference tokens, greedy too."""
    gen = torch.Generator().manual_seed(4)
    for kind in KINDS:
        logits = make_logits(kind, 6, 1000, gen)
        for temperature, top_p, top_k in itertools.product([0.0, 0.8], [0.9, 1.0], [0, 20]):
            cfg = SamplingConfig(temperature, top_p, top_k, seed=kind.__len__())
            assert reference_tokens(logits, positions_for(6), cfg) == ref_choose_tokens(logits, positions_for(6), cfg)


def test_same_tokens_many_seeds_small_vocab():
    """Many seeds on few rows: the kept set and the noise both have to match for every draw, not only the likely one."""
    gen = torch.Generator().manual_seed(5)
    for kind in KINDS:
        logits = make_logits(kind, 3, 40, gen)
        for seed, (top_p, top_k) in zip(range(60), itertools.cycle(itertools.product(TOP_PS, TOP_KS))):
            cfg = SamplingConfig(0.8, top_p, top_k, seed=seed)
            assert choose_tokens(logits, [7, 8, 8], cfg) == ref_choose_tokens(logits, [7, 8, 8], cfg), (kind, seed)


def test_float16_and_bfloat16_logits():
    gen = torch.Generator().manual_seed(6)
    for dtype in (torch.float16, torch.bfloat16):
        logits = make_logits("llm", 8, 4096, gen).to(dtype)  # many exact ties after the cast
        for top_p, top_k in itertools.product(TOP_PS, TOP_KS):
            cfg = SamplingConfig(0.7, top_p, top_k, seed=3)
            assert choose_tokens(logits, positions_for(8), cfg) == ref_choose_tokens(logits, positions_for(8), cfg)


@pytest.fixture
def paths(monkeypatch):
    """Counts the rows that leave the candidate path: sorted (cut too close to call) or sent to filter_logits."""
    counts = {"sorted": 0, "reference": 0}
    sorted_cut = sampling_fast._sorted_cut

    def counting_sorted_cut(masked, top_p):
        counts["sorted"] += masked.shape[0]
        return sorted_cut(masked, top_p)

    def counting_filter_logits(logits, cfg):
        counts["reference"] += logits.shape[0]
        return filter_logits(logits, cfg)

    monkeypatch.setattr(sampling_fast, "_sorted_cut", counting_sorted_cut)
    monkeypatch.setattr(sampling_fast, "filter_logits", counting_filter_logits)
    return counts


def test_cut_exactly_on_a_float32_boundary(paths):
    """top_p equal to a cumulative mass as the reference computes it in float32: float64 masses cannot tell which
    side the reference lands on, so those rows take the sorted path, and still match."""
    gen = torch.Generator().manual_seed(7)
    for kind, vocab in itertools.product(["llm", "gauss", "flat"], [49152, 300]):
        logits = make_logits(kind, 4, vocab, gen)
        for temperature, rank in itertools.product([0.7, 1.0], [1, 2, 5]):
            x = logits[0] / temperature
            p = torch.sort(x, descending=True).values.softmax(-1)
            before = (p.cumsum(-1) - p)[rank].item()  # the reference's own float32 value
            for top_p in (before, math.nextafter(before, 0.0), math.nextafter(before, 1.0)):
                if not 0 < top_p < 1:
                    continue
                cfg = SamplingConfig(temperature, top_p, 0, seed=rank)
                assert choose_tokens(logits, [3, 4, 4, 5], cfg) == ref_choose_tokens(logits, [3, 4, 4, 5], cfg)
    assert paths["sorted"] > 0


def test_ties_across_the_cut_and_at_the_kth_value(paths):
    """Equal logits straddling the top-p cut (which of them the reference keeps depends on its sort's order among
    equals) go through filter_logits; ties at the k-th value are all kept."""
    gen = torch.Generator().manual_seed(8)
    logits = make_logits("ties", 16, 2000, gen)
    logits[:, :6] = 4.0  # six equal leaders: every cut below their mass splits them
    for top_p, top_k in itertools.product([0.05, 0.2, 0.5, 0.9, 1.0], [0, 3, 20]):
        cfg = SamplingConfig(1.0, top_p, top_k, seed=top_k)
        assert choose_tokens(logits, positions_for(16), cfg) == ref_choose_tokens(logits, positions_for(16), cfg)
    assert paths["reference"] > 0


def test_wide_kept_sets_widen_or_sort(paths):
    """Rows whose top-p set is wider than the first candidates: widened candidate sets, then a sort, same tokens."""
    gen = torch.Generator().manual_seed(9)
    logits = torch.cat([make_logits("gauss", 4, 49152, gen) * 0.3, make_logits("gauss", 4, 49152, gen)])
    for top_p in (0.5, 0.9, 0.99):
        cfg = SamplingConfig(1.0, top_p, 0, seed=11)
        assert choose_tokens(logits, list(range(8)), cfg) == ref_choose_tokens(logits, list(range(8)), cfg)
    assert paths["sorted"] > 0


def test_masked_logits_and_top_k_beyond_the_finite_ones():
    gen = torch.Generator().manual_seed(10)
    logits = make_logits("llm", 6, 500, gen)
    logits[:, 100:] = float("-inf")  # a model that masks part of its vocabulary
    logits[5, 3:] = float("-inf")  # three finite tokens: top-k 20 keeps -inf ones too
    for top_p, top_k in itertools.product(TOP_PS, TOP_KS):
        cfg = SamplingConfig(0.9, top_p, top_k, seed=top_k)
        assert choose_tokens(logits, positions_for(6), cfg) == ref_choose_tokens(logits, positions_for(6), cfg)


def test_greedy_and_keyed_by_position_only():
    gen = torch.Generator().manual_seed(12)
    logits = make_logits("llm", 5, 3000, gen)
    assert choose_tokens(logits, [1, 2, 3, 4, 5], SamplingConfig()) == logits.argmax(-1).tolist()
    cfg = SamplingConfig(0.8, 0.9, 0, seed=4)
    a = choose_tokens(logits, [9, 10, 9, 11, 10], cfg)
    b = choose_tokens(logits[[2, 4, 0]], [9, 10, 9], cfg)
    assert [a[2], a[4], a[0]] == b


def test_greedy_choice_and_gaps_on_tied_logits():
    """Greedy takes the first of equal best logits, as argmax does, and the top-2 gap is topk's: 0 on a tie
    (logits rounded to a few values, as bf16 logits are, tie often)."""
    gen = torch.Generator().manual_seed(14)
    for vocab in (16, 3000, 49152):
        for logits in (torch.randint(-3, 4, (6, vocab), generator=gen).float(), make_logits("llm", 6, vocab, gen)):
            assert choose_tokens(logits, list(range(6)), SamplingConfig()) == logits.argmax(-1).tolist()
            rows = [0, 3, 5, 3]
            best = logits[rows].topk(2, dim=-1).values
            assert sampling.top2_gaps(logits, rows) == (best[:, 0] - best[:, 1]).tolist()
            kept = logits.clone()
            sampling.top2_gaps(logits, rows)
            assert torch.equal(logits, kept)  # the caller's logits are left as they were


def test_gathered_noise_is_bit_identical():
    """The Gumbel noise at a gathered subset of token ids equals the whole vector's at those ids, for any subset size
    (the log kernel gives the same bits on a short or ragged vector as on a whole one)."""
    vocab = 49152
    full = position_noise(3, 17, vocab)
    assert torch.equal(full, ref_position_noise(3, 17, vocab))
    u = sampling.position_uniforms(3, 17, vocab)
    gen = torch.Generator().manual_seed(13)
    for size in (1, 3, 7, 63, 64, 65, 1000, 40000, vocab):
        ids = torch.randperm(vocab, generator=gen)[:size]
        assert torch.equal(sampling.gumbel(u[ids]), full[ids]), size


def test_margin_bounds_the_reference_rounding():
    """The float32 cumulative masses the reference computes stay within _top_p_margin of the exact ones."""
    gen = torch.Generator().manual_seed(14)
    for kind, temperature in itertools.product(KINDS, [0.5, 1.0, 2.0]):
        x = make_logits(kind, 4, 49152, gen) / temperature
        probs = x.softmax(-1)
        margin = sampling_fast._top_p_margin(probs, probs.sum(-1).double())
        ordered = torch.sort(x, descending=True).values
        p = ordered.softmax(-1)
        before32 = (p.cumsum(-1) - p).double()
        e = (ordered.double() - ordered[:, :1].double()).exp()
        exact = (e.cumsum(-1) - e) / e.sum(-1, keepdim=True)
        assert ((before32 - exact).abs() <= margin[:, None]).all(), kind


def test_sampled_frequencies_follow_the_filtered_distribution():
    """Over many (seed, position) keys the chosen tokens follow softmax(filtered logits / T) (chi-square, p ~ 1e-4
    bound).  The keys are fixed, so the outcome is deterministic, and a biased sampler (noise shared across tokens or
    positions, a kept set off by one) fails it by a wide margin."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])
    per_seed, seeds = 1000, 3
    n = per_seed * seeds
    for cfg in (SamplingConfig(1.0, 0.9, 0), SamplingConfig(0.7, 1.0, 5), SamplingConfig(1.3, 0.8, 6),
                SamplingConfig(1.0, 1.0, 0)):
        probs = filter_logits(logits, cfg)[0].softmax(-1)
        support = probs.nonzero().flatten().tolist()
        chosen = []
        for seed in range(seeds):  # one row per position: each row draws its own position's noise
            keyed = SamplingConfig(cfg.temperature, cfg.top_p, cfg.top_k, seed)
            chosen += choose_tokens(logits.expand(per_seed, -1), list(range(per_seed)), keyed)
        counts = torch.bincount(torch.tensor(chosen), minlength=logits.shape[-1]).double()
        assert counts.sum() == counts[support].sum()  # nothing outside the kept set
        expected = n * probs[support]
        chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
        df = len(support) - 1
        assert chi2 < df + 6 * math.sqrt(2 * df), (cfg, chi2, counts, probs)
