"""Token choice that is the same in every decoding mode.

Greedy is argmax.  Sampling uses the Gumbel-max trick with noise drawn from an RNG keyed on (seed, absolute position)
only: the token at position t is argmax(filtered_logits / T + G(seed, t)), an exact sample of the target's
(temperature, top-k, top-p) distribution.  Because the noise does not depend on how many tokens were drafted,
AR and speculative decoding draw the *same* sample for the same seed — and verification can draw one sample per tree
node and walk down the tree, which is exactly lossless.

filter_logits and position_noise define the choice; choose_tokens returns the same tokens without sorting each row or
taking the noise's logs over the whole vocabulary wherever a few top candidates settle the filter (see _kept_tokens).
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 = off)")


def filter_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, top-k and top-p applied to a (n, V) float32 tensor; removed tokens get -inf."""
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= cfg.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


# float32 unit roundoff: the top-p cut is decided from float64 masses only when it is farther than the reference's
# float32 rounding error from every cumulative-mass boundary (see _top_p_margin)
_ROUNDOFF = 2.0 ** -24
_FIRST_CANDIDATES = 64  # per-row candidates for the top-p cut
_MAX_CANDIDATES = 512  # the second try for wider rows; past it a row is sorted, which costs about as much as a topk


@functools.lru_cache(maxsize=32)
def _position_uniforms(seed: int, position: int, vocab: int) -> torch.Tensor:
    """The uniforms behind position_noise: float64, one per token id, from an RNG keyed on (seed, position) only.

    Cached (read-only: callers index or copy it) because a tree step's deeper positions come back in the next step,
    and a side-by-side AR run with the same seed asks for the same positions.
    """
    key = int.from_bytes(hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest(), "little")
    return torch.rand(vocab, generator=torch.Generator().manual_seed(key & 0x7FFF_FFFF_FFFF_FFFF), dtype=torch.float64)


def _gumbel(u: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) from uniforms; elementwise, so a gathered subset of a position's uniforms gives exactly the values
    the whole vector would at those ids (tests/test_sampling_fast.py checks the log kernel agrees bit for bit)."""
    return -torch.log(-torch.log(u.clamp_min(1e-300)))


def position_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    """Gumbel noise for one absolute position, from an RNG keyed on (seed, position) only (CPU, device-independent)."""
    return _gumbel(_position_uniforms(seed, position, vocab))


def choose_tokens(logits: torch.Tensor, positions: list[int], cfg: SamplingConfig) -> list[int]:
    """The target's token for each row of logits (n, V); row i is the distribution of absolute position positions[i].

    The token is argmax over the kept set of filter_logits(logits) / T + position_noise(seed, positions[i]), exactly
    as if both were computed over the whole vocabulary, but the kept set is found from a few candidates per row and the
    noise's logs are taken only at kept tokens: a tree step's rows cost a topk and a few vectorised passes instead of
    a full sort and two float64 logs per token.
    """
    if cfg.greedy:
        return logits.argmax(-1).tolist()
    logits = logits.detach()
    x = logits.float() / cfg.temperature  # the same float32 values filter_logits starts from
    n, vocab = x.shape
    if n == 0:
        return []
    slots: dict[int, int] = {}
    row_slot = [slots.setdefault(pos, len(slots)) for pos in positions]  # nodes at the same depth share noise
    uniforms = [_position_uniforms(cfg.seed, pos, vocab) for pos in slots]
    top_k = cfg.top_k if 0 < cfg.top_k < vocab else 0
    if not top_k and cfg.top_p >= 1.0:  # nothing filtered: every token needs its noise
        noise = torch.stack([_gumbel(u) for u in uniforms])
        return (x.cpu().double() + noise[row_slot]).argmax(-1).tolist()

    rows, ids = _kept_tokens(logits, x, top_k, cfg)
    slot_of = torch.tensor(row_slot)[rows]
    u = torch.empty(len(ids), dtype=torch.float64)
    for s, full in enumerate(uniforms):
        at = (slot_of == s).nonzero().flatten()
        u[at] = full[ids[at]]
    scores = x[rows.to(x.device), ids.to(x.device)].cpu().double() + _gumbel(u)
    best = torch.full((n,), float("-inf"), dtype=torch.float64).scatter_reduce(0, rows, scores, "amax")
    at_best = scores == best[rows]
    # argmax over a whole row returns the lowest id among equal maxima
    choice = torch.full((n,), vocab, dtype=torch.long).scatter_reduce(0, rows[at_best], ids[at_best], "amin")
    return choice.masked_fill(best == float("-inf"), 0).tolist()  # a row with nothing finite: argmax says 0


def _kept_tokens(logits: torch.Tensor, x: torch.Tensor, top_k: int, cfg: SamplingConfig
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token id) pairs, on the CPU, of exactly the tokens filter_logits keeps finite.

    Top-k keeps every token >= the k-th largest value.  For top-p, most rows are decided from their top candidates;
    a row whose cut the float64 masses cannot place with certainty is sorted (values only) and cut with the reference's
    own float32 arithmetic, and a row whose cut splits tokens of equal value -- where the kept ones depend on the
    sort's order among equals -- goes through filter_logits itself.
    """
    n, vocab = x.shape
    first = min(vocab, max(_FIRST_CANDIDATES, top_k))
    vals, idx = torch.topk(x, first, dim=-1)
    masked, n_valid = x, torch.full((n,), vocab, device=x.device)
    if top_k:
        kth = vals[:, top_k - 1: top_k]
        n_valid = (x >= kth).sum(-1)
        if cfg.top_p >= 1.0:
            exact = n_valid == top_k  # no ties at the k-th value: the topk indices are the whole kept set
            r, c = exact[:, None].expand(-1, top_k).nonzero(as_tuple=True)
            tied = (~exact).nonzero().flatten()
            tied_rows, tied_ids = (x[tied] >= kth[tied]).nonzero(as_tuple=True)
            return _cat_parts([(r, idx[r, c]), (tied[tied_rows], tied_ids)])
        masked = x.masked_fill(x < kth, float("-inf"))  # what filter_logits hands to top-p
    parts: list[tuple[torch.Tensor, torch.Tensor]] = []
    top_p32 = float(torch.tensor(cfg.top_p, dtype=torch.float32))  # filter_logits compares in float32
    peak = vals[:, :1]
    probs = masked.softmax(-1)
    total = probs.sum(-1).double()
    # probs = exp(x - peak) times the kernel's 1 / sum, which is probs at the peak (whose exp is exactly 1); so this is
    # sum(exp(x - peak)) to a few roundoffs, without another full-row exp
    mass = total / probs.gather(-1, idx[:, :1]).squeeze(-1).double()
    margin = _top_p_margin(probs, total)
    pending, width = torch.arange(n, device=x.device), first
    sort_rows: list[torch.Tensor] = []
    reference_rows: list[torch.Tensor] = []
    while len(pending):
        if width > first:
            vals, idx = torch.topk(x[pending], width, dim=-1)
        valid = torch.arange(width, device=x.device) < n_valid[pending, None]
        p = torch.exp(vals.double() - peak[pending].double()).masked_fill(~valid, 0.0) / mass[pending, None]
        before = p.cumsum(-1) - p  # mass of the strictly higher ranks: nondecreasing
        kept = ((before < top_p32) & valid).sum(-1)  # how many ranks the exact cut keeps
        at = torch.arange(len(pending), device=x.device)
        last, nxt = (kept - 1).clamp_min(0), kept.clamp_max(width - 1)
        cut_inside = kept < n_valid[pending]  # some valid rank is dropped: the first one must be a candidate
        widen = cut_inside & (kept >= width)
        clear = (kept > 0) & (before[at, last] < top_p32 - margin[pending]) & (
            ~cut_inside | (before[at, nxt] >= top_p32 + margin[pending]))
        split_tie = cut_inside & (vals[at, last] == vals[at, nxt])
        done = clear & ~widen & ~split_tie
        r, c = (torch.arange(width, device=x.device) < kept[:, None]).nonzero(as_tuple=True)
        keep = done[r]
        parts.append((pending[r[keep]], idx[r[keep], c[keep]]))
        reference_rows.append(pending[(clear & ~widen & split_tie) | (kept == 0)])
        unsure = ~clear & ~widen & (kept > 0)
        # every rank past the candidates holds at most the last candidate's mass: a lower bound on the width needed
        short = (top_p32 - before[:, -1] - p[:, -1]) / p[:, -1].clamp_min(1e-300)
        need = width + 1 + short.clamp(0, vocab).ceil().long()
        too_wide = widen & (need > min(_MAX_CANDIDATES, vocab))
        sort_rows.append(pending[unsure | too_wide])
        widen &= ~too_wide
        pending, width = pending[widen], min(_MAX_CANDIDATES, vocab)

    sort_rows_t = torch.cat(sort_rows)
    if len(sort_rows_t):
        cut_rows, cut_ids, tied = _sorted_cut(masked[sort_rows_t], cfg.top_p)
        parts.append((sort_rows_t[cut_rows], cut_ids))
        reference_rows.append(sort_rows_t[tied])
    reference_rows_t = torch.cat(reference_rows)
    if len(reference_rows_t):
        filtered = filter_logits(logits[reference_rows_t].float(), cfg)
        r, ids = (filtered > float("-inf")).nonzero(as_tuple=True)
        parts.append((reference_rows_t[r], ids))
    return _cat_parts(parts)


def _top_p_margin(probs: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """Per row, a bound on |filter_logits' float32 cumulative mass - the exact one|, at any rank.  Overwrites probs.

    filter_logits' softmax sums the rows' float32 exps in float32.  Each addition of a term t to a partial sum s errs
    by at most min(t, roundoff * (s + t)) <= min(t, roundoff * sum): terms below the partial sum's half-ulp are lost
    outright, which on a long flat tail is the dominant error, so relative to the sum the error is at most
    sum(min(prob, roundoff)) (taken with 25% to spare).  The constant covers the rest for any float32 softmax/cumsum
    kernel: each exp's error (a few ulp, plus roundoff * (max - logit), whose mean under the row's distribution is at
    most log V), the reciprocal and the scaling, a reduction tree's log2(V) levels, the cumsum, the final subtraction,
    and the few roundoffs in this side's own normaliser.
    """
    lost = torch.minimum(probs, (_ROUNDOFF * total).float()[:, None], out=probs).sum(-1).double()
    return 1.25 * lost / total + 256 * _ROUNDOFF


def _sorted_cut(masked: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-p on rows of top-k-masked logits with filter_logits' own float32 arithmetic on the sorted values.

    Which ranks the reference drops depends only on the sorted values, not on which token holds which rank, so a
    values-only sort reproduces its decisions bit for bit.  Returns (row, token id) of the kept tokens and the rows
    whose cut splits equal values (or, in float32, keeps a non-prefix), which only filter_logits itself can settle.
    """
    if masked.device.type == "cpu":  # numpy's SIMD sort is several times faster than torch.sort with indices
        ordered = torch.from_numpy(np.ascontiguousarray(np.sort(masked.numpy(), axis=-1)[:, ::-1]))
    else:
        ordered = torch.sort(masked, descending=True, dim=-1).values
    p = ordered.softmax(-1)
    drop = p.cumsum(-1) - p >= top_p
    n, vocab = ordered.shape
    kept = (~drop).sum(-1)
    first_drop = torch.where(drop.any(-1), drop.int().argmax(-1), vocab)
    ranks = torch.arange(n, device=ordered.device)
    cut = ordered[ranks, kept - 1]
    after = ordered[ranks, kept.clamp_max(vocab - 1)]
    tied = (kept == 0) | (first_drop != kept) | ((kept < vocab) & (after == cut) & (cut > float("-inf")))
    # a cut at -inf (top-p keeping tokens top-k removed, when top_p rounds up to the whole mass): every finite token
    r, ids = (masked >= cut.clamp_min(torch.finfo(torch.float32).min)[:, None]).nonzero(as_tuple=True)
    keep = ~tied[r]
    return r[keep].cpu(), ids[keep].cpu(), tied.cpu()


def _cat_parts(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, ids) pieces from the different paths as one pair of CPU tensors."""
    return torch.cat([r.cpu() for r, _ in parts]), torch.cat([i.cpu() for _, i in parts])
