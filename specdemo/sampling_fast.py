"""The fast exact path of sampling.choose_tokens: the same tokens as the rule (sampling.reference_tokens), without
sorting each row or taking the noise's logs over the whole vocabulary wherever a few top candidates settle the filter.

The token of a row is the argmax, over the tokens filter_logits keeps finite, of filtered logit + Gumbel noise.  So
only two things are needed per row: the kept set (`_kept_tokens`) and the noise at the kept ids (gathered from the
position's uniforms; the noise is elementwise, so a gathered subset has exactly the whole vector's values).

The kept set: top-k keeps every token >= the k-th largest value.  For top-p, most rows are decided from their top
candidates in float64 (`_top_p_from_candidates`), where the cut is farther than the reference's float32 rounding
error from every cumulative-mass boundary (`_top_p_margin`); a row whose cut the float64 masses cannot place with
certainty is sorted (values only) and cut with the reference's own float32 arithmetic (`_sorted_cut`); a row whose cut
splits tokens of equal value -- where the kept ones depend on the sort's order among equals -- goes through
filter_logits itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdemo.sampling import SamplingConfig, filter_logits, gumbel, position_uniforms

# float32 unit roundoff: the top-p cut is decided from float64 masses only when it is farther than the reference's
# float32 rounding error from every cumulative-mass boundary (see _top_p_margin)
_ROUNDOFF = 2.0 ** -24
_FIRST_CANDIDATES = 64  # per-row candidates for the top-p cut
_MAX_CANDIDATES = 512  # the second try for wider rows; past it a row is sorted, which costs about as much as a topk

Pairs = tuple[torch.Tensor, torch.Tensor]  # (row, token id) of kept tokens, one entry each


def sampled_tokens(logits: torch.Tensor, positions: list[int], cfg: SamplingConfig) -> list[int]:
    """sampling.reference_tokens' tokens for a sampling `cfg` (temperature > 0).

    The token is argmax over the kept set of filter_logits(logits) + position_noise(seed, positions[i]), exactly as if
    both were computed over the whole vocabulary, but the kept set is found from a few candidates per row and the
    noise's logs are taken only at kept tokens: a tree step's rows cost a topk and a few vectorised passes instead of
    a full sort and two float64 logs per token.
    """
    logits = logits.detach()
    x = logits.float() / cfg.temperature  # the same float32 values filter_logits starts from
    n, vocab = x.shape
    if n == 0:
        return []
    slots: dict[int, int] = {}
    row_slot = [slots.setdefault(pos, len(slots)) for pos in positions]  # nodes at the same depth share noise
    uniforms = [position_uniforms(cfg.seed, pos, vocab) for pos in slots]
    top_k = cfg.top_k if 0 < cfg.top_k < vocab else 0
    if not top_k and cfg.top_p >= 1.0:  # nothing filtered: every token needs its noise
        noise = torch.stack([gumbel(u) for u in uniforms])
        return (x.cpu().double() + noise[row_slot]).argmax(-1).tolist()

    rows, ids = _kept_tokens(logits, x, top_k, cfg)
    slot_of = torch.tensor(row_slot)[rows]
    u = torch.empty(len(ids), dtype=torch.float64)
    for s, full in enumerate(uniforms):
        at = (slot_of == s).nonzero().flatten()
        u[at] = full[ids[at]]
    scores = x[rows.to(x.device), ids.to(x.device)].cpu().double() + gumbel(u)
    best = torch.full((n,), float("-inf"), dtype=torch.float64).scatter_reduce(0, rows, scores, "amax")
    at_best = scores == best[rows]
    # argmax over a whole row returns the lowest id among equal maxima
    choice = torch.full((n,), vocab, dtype=torch.long).scatter_reduce(0, rows[at_best], ids[at_best], "amin")
    return choice.masked_fill(best == float("-inf"), 0).tolist()  # a row with nothing finite: argmax says 0


def _kept_tokens(logits: torch.Tensor, x: torch.Tensor, top_k: int, cfg: SamplingConfig) -> Pairs:
    """(row, token id) pairs, on the CPU, of exactly the tokens filter_logits keeps finite (see the module doc)."""
    n, vocab = x.shape
    first = min(vocab, max(_FIRST_CANDIDATES, top_k))
    vals, idx = torch.topk(x, first, dim=-1)
    masked, n_valid = x, torch.full((n,), vocab, device=x.device)
    if top_k:
        kth = vals[:, top_k - 1: top_k]
        n_valid = (x >= kth).sum(-1)
        if cfg.top_p >= 1.0:
            return _top_k_set(x, idx, kth, n_valid, top_k)
        masked = x.masked_fill(x < kth, float("-inf"))  # what filter_logits hands to top-p
    parts, sort_rows, reference_rows = _top_p_from_candidates(x, masked, vals, idx, n_valid, cfg.top_p)
    if len(sort_rows):
        cut_rows, cut_ids, tied = _sorted_cut(masked[sort_rows], cfg.top_p)
        parts.append((sort_rows[cut_rows], cut_ids))
        reference_rows = torch.cat([reference_rows, sort_rows[tied]])
    if len(reference_rows):
        filtered = filter_logits(logits[reference_rows].float(), cfg)
        r, ids = (filtered > float("-inf")).nonzero(as_tuple=True)
        parts.append((reference_rows[r], ids))
    return _cat_parts(parts)


def _top_k_set(x: torch.Tensor, idx: torch.Tensor, kth: torch.Tensor, n_valid: torch.Tensor, top_k: int) -> Pairs:
    """Top-k alone: a row without ties at the k-th value keeps exactly its topk indices; a tied row keeps every token
    >= the k-th value."""
    exact = n_valid == top_k
    r, c = exact[:, None].expand(-1, top_k).nonzero(as_tuple=True)
    tied = (~exact).nonzero().flatten()
    tied_rows, tied_ids = (x[tied] >= kth[tied]).nonzero(as_tuple=True)
    return _cat_parts([(r, idx[r, c]), (tied[tied_rows], tied_ids)])


@dataclass
class _Rows:
    """What every candidate pass of the top-p cut reads, per row of the step."""

    x: torch.Tensor  # (n, V) logits / T
    n_valid: torch.Tensor  # finite tokens after top-k
    peak: torch.Tensor  # (n, 1) the largest value
    mass: torch.Tensor  # sum(exp(x - peak)) over the row's valid tokens, float64
    margin: torch.Tensor  # the reference's float32 rounding bound on cumulative masses (_top_p_margin)
    top_p32: float  # top_p as filter_logits compares it, in float32


def _top_p_from_candidates(x: torch.Tensor, masked: torch.Tensor, vals: torch.Tensor, idx: torch.Tensor,
                           n_valid: torch.Tensor, top_p: float) -> tuple[list[Pairs], torch.Tensor, torch.Tensor]:
    """Top-p from the rows' top candidates (vals, idx: the first topk), widened once for rows whose cut lies past
    them.  Returns the kept pairs of the rows it settled, the rows to sort and the rows only filter_logits settles."""
    n, vocab = x.shape
    probs = masked.softmax(-1)
    total = probs.sum(-1).double()
    # probs = exp(x - peak) times the kernel's 1 / sum, which is probs at the peak (whose exp is exactly 1); so this is
    # sum(exp(x - peak)) to a few roundoffs, without another full-row exp
    mass = total / probs.gather(-1, idx[:, :1]).squeeze(-1).double()
    rows = _Rows(x, n_valid, vals[:, :1], mass, _top_p_margin(probs, total),
                 float(torch.tensor(top_p, dtype=torch.float32)))  # filter_logits compares in float32
    parts: list[Pairs] = []
    sort_rows: list[torch.Tensor] = []
    reference_rows: list[torch.Tensor] = []
    pending, first = torch.arange(n, device=x.device), vals.shape[-1]
    width = first
    while len(pending):
        if width > first:
            vals, idx = torch.topk(x[pending], width, dim=-1)
        kept, reference, unsure, widen = _candidate_pass(rows, pending, vals, idx, width)
        parts.append(kept)
        reference_rows.append(reference)
        sort_rows.append(unsure)
        pending, width = pending[widen], min(_MAX_CANDIDATES, vocab)
    return parts, torch.cat(sort_rows), torch.cat(reference_rows)


def _candidate_pass(rows: _Rows, pending: torch.Tensor, vals: torch.Tensor, idx: torch.Tensor, width: int
                    ) -> tuple[Pairs, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass over the rows `pending` with `width` candidates each (vals, idx): the kept pairs of the rows whose cut
    is clear, the rows whose cut splits equal values (or keeps nothing), the rows to sort (cut too close to call, or
    too wide for the candidates), and the mask of pending rows to widen."""
    dev, vocab = rows.x.device, rows.x.shape[-1]
    top_p32, margin, n_valid = rows.top_p32, rows.margin[pending], rows.n_valid[pending]
    valid = torch.arange(width, device=dev) < n_valid[:, None]
    p = torch.exp(vals.double() - rows.peak[pending].double()).masked_fill(~valid, 0.0) / rows.mass[pending, None]
    before = p.cumsum(-1) - p  # mass of the strictly higher ranks: nondecreasing
    kept = ((before < top_p32) & valid).sum(-1)  # how many ranks the exact cut keeps
    at = torch.arange(len(pending), device=dev)
    last, nxt = (kept - 1).clamp_min(0), kept.clamp_max(width - 1)
    cut_inside = kept < n_valid  # some valid rank is dropped: the first one must be a candidate
    widen = cut_inside & (kept >= width)
    clear = (kept > 0) & (before[at, last] < top_p32 - margin) & (
        ~cut_inside | (before[at, nxt] >= top_p32 + margin))
    split_tie = cut_inside & (vals[at, last] == vals[at, nxt])
    done = clear & ~widen & ~split_tie
    r, c = (torch.arange(width, device=dev) < kept[:, None]).nonzero(as_tuple=True)
    keep = done[r]
    reference = pending[(clear & ~widen & split_tie) | (kept == 0)]
    unsure = ~clear & ~widen & (kept > 0)
    # every rank past the candidates holds at most the last candidate's mass: a lower bound on the width needed
    short = (top_p32 - before[:, -1] - p[:, -1]) / p[:, -1].clamp_min(1e-300)
    need = width + 1 + short.clamp(0, vocab).ceil().long()
    too_wide = widen & (need > min(_MAX_CANDIDATES, vocab))
    return (pending[r[keep]], idx[r[keep], c[keep]]), reference, pending[unsure | too_wide], widen & ~too_wide


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


def _cat_parts(parts: list[Pairs]) -> Pairs:
    """(rows, ids) pieces from the different paths as one pair of CPU tensors."""
    return torch.cat([r.cpu() for r, _ in parts]), torch.cat([i.cpu() for _, i in parts])
