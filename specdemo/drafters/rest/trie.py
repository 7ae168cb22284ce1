"""The weighted prefix trie of a REST step's retrieved continuations, its node scores and its best-first subtree.

A node is a prefix shared by some continuations; its weight is theirs summed (store rows weigh 1, request rows the
request's weight).  The arrays hold one entry per node, level by level, parents first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD = -1  # pads a retrieved row after its end


@dataclass
class Trie:
    """All prefixes of a set of weighted continuations (arrays, one entry per node)."""

    tokens: np.ndarray
    parents: np.ndarray  # index into these arrays, -1 = child of the root
    depth: np.ndarray  # 1 = child of the root
    order: np.ndarray  # rank of the node's path in lexicographic order (deterministic tie-break)
    weight: np.ndarray
    context_weight: np.ndarray
    total: float

    def __len__(self) -> int:
        return len(self.tokens)


def build_trie(rows: np.ndarray, weights: np.ndarray, context_rows: np.ndarray | None = None,
               keep: int = 0, scoring: Scoring | None = None) -> Trie:
    """The weighted prefix trie of `rows` ((R, L), padded with -1 after the end); context_rows marks rows from the
    request (their weight is also summed separately, for the node's source label).

    keep > 0 (with `scoring`): leave out every node that cannot be among the `keep` best by score, with its subtree.
    A node never scores above its parent, so once `keep` nodes score at least s, a node scoring below s and all its
    descendants rank after them: the best-first subtree of at most `keep` nodes (`select_subtree`) is the same, and a
    store match of thousands of continuations (tens of thousands of nodes) builds the few hundred that can count."""
    R, L = rows.shape if rows.ndim == 2 else (0, 0)
    empty = np.zeros(0, dtype=np.int64)
    if R == 0:
        return Trie(empty, empty, empty, empty, np.zeros(0), np.zeros(0), 0.0)
    w = np.asarray(weights, dtype=np.float64)
    wc = w * np.asarray(context_rows, dtype=bool) if context_rows is not None else np.zeros(R)
    order = lexicographic_order(rows)
    rows, w, wc = rows[order], w[order], wc[order]
    lcp = np.zeros(R, dtype=np.int64)
    if R > 1:
        lcp[1:] = np.cumprod(rows[1:] == rows[:-1], axis=1).sum(1)
    cw = np.concatenate([[0.0], np.cumsum(w)])
    cwc = np.concatenate([[0.0], np.cumsum(wc)])
    total = float(cw[-1])
    prune = keep > 0 and scoring is not None
    alive = np.ones(R, dtype=bool)  # rows not under a left-out node
    best = np.zeros(0)  # the `keep` best scores so far
    levels = []
    prev = None  # the previous level's groups: (starts, node ids, weights, scores), -1 / 0 where no node
    for d in range(1, L + 1):
        starts = np.flatnonzero(lcp < d)
        ends = np.append(starts[1:], R)
        tok = rows[starts, d - 1]
        ok = (tok != PAD) & alive[starts]
        if not ok.any():
            break
        s_ok, e_ok = starts[ok], ends[ok]
        wt, cwt = cw[e_ok] - cw[s_ok], cwc[e_ok] - cwc[s_ok]
        if prev is None:
            par, par_w, par_s = np.full(len(s_ok), -1, dtype=np.int64), total, 1.0
        else:
            g = np.searchsorted(prev[0], s_ok, "right") - 1
            par, par_w, par_s = prev[1][g], prev[2][g], prev[3][g]
        score = scoring.level(wt, cwt, par_w, par_s, total) if prune else np.zeros(len(s_ok))
        if prune:
            best = np.concatenate([best, score])
            if len(best) > keep:
                best = np.partition(best, len(best) - keep)[len(best) - keep:]
            if len(best) == keep and (out := score < best.min()).any():
                edges = np.zeros(R + 1, dtype=np.int64)
                np.add.at(edges, s_ok[out], 1)
                np.add.at(edges, e_ok[out], -1)
                alive &= np.cumsum(edges[:-1]) == 0
                ok[np.flatnonzero(ok)[out]] = False
                s_ok, wt, cwt, par, score = s_ok[~out], wt[~out], cwt[~out], par[~out], score[~out]
        n_before = sum(len(lv[0]) for lv in levels)
        ids = np.full(len(starts), -1, dtype=np.int64)
        ids[ok] = n_before + np.arange(len(s_ok))
        group_w, group_s = np.zeros(len(starts)), np.zeros(len(starts))
        group_w[ok], group_s[ok] = wt, score
        levels.append((tok[ok], par, np.full(len(s_ok), d), s_ok, wt, cwt))
        prev = (starts, ids, group_w, group_s)
    toks, pars, deps, ords, wts, cwts = (np.concatenate(x) for x in zip(*levels))
    return Trie(toks, pars, deps, ords, wts, cwts, total)


def lexicographic_order(rows: np.ndarray) -> np.ndarray:
    """`np.lexsort(rows.T[::-1])` (stable, PAD first) in one sort of byte strings: each row written big-endian as
    token + 1, so PAD is 0 and byte order is token order.  A store match gives thousands of distinct rows; sorting them
    as strings costs a third of ten sorts of a column each (~0.45 against 1.6 ms for 5,000 rows of 10 on the 2-core dev
    CPU)."""
    if not rows.size:
        return np.arange(len(rows))
    width = ">u2" if int(rows.max()) + 1 < 2**16 else ">u4"
    keys = np.ascontiguousarray((rows + 1).astype(width)).view(f"S{rows.shape[1] * np.dtype(width).itemsize}")
    return np.argsort(keys.ravel(), kind="stable")


@dataclass(frozen=True)
class Scoring:
    """How a node is ranked (`RestDrafter.scoring`): "acceptance", the estimate of `acceptance_scores`, or "count",
    REST's raw prefix share."""

    kind: str = "acceptance"
    confidence: float = 0.95
    prior: float = 1.6
    context_prior: float = 5.0

    def level(self, weight: np.ndarray, context_weight: np.ndarray, parent_weight, parent_score,
              total: float) -> np.ndarray:
        """The scores of nodes of one depth from their weights and their parents' weights and scores (the root: the
        total weight, score 1)."""
        if self.kind == "count":
            return weight / total
        k = np.where(context_weight * 2 > weight, self.context_prior, self.prior)
        return np.minimum(self.confidence * weight / (parent_weight + k), 1.0) * parent_score

    def __call__(self, trie: Trie) -> np.ndarray:
        """Every node's score."""
        score = np.zeros(len(trie))
        for d in range(1, int(trie.depth.max(initial=0)) + 1):  # nodes are stored level by level, parents first
            idx = np.flatnonzero(trie.depth == d)
            par = trie.parents[idx]
            parent = np.maximum(par, 0)
            score[idx] = self.level(trie.weight[idx], trie.context_weight[idx],
                                    np.where(par >= 0, trie.weight[parent], trie.total),
                                    np.where(par >= 0, score[parent], 1.0), trie.total)
        return score


def acceptance_scores(trie: Trie, confidence: float = 0.95, prior: float = 1.6,
                      context_prior: float = 5.0) -> np.ndarray:
    """Estimated probability that each node ends up on the accepted path: the product, from the root down, of
    confidence * weight(node) / (weight(parent) + prior), the root's weight being the total.  The prior shrinks
    prefixes seen in few continuations (a single retrieved continuation is right ~45% of the time per token on the
    embedded model, not 100%); request-dominated nodes use `context_prior` (their rows weigh `context_weight`).
    Fitted by maximum likelihood on HumanEval + chat replays (`specdemo acceptance`); never above the parent's score."""
    return Scoring("acceptance", confidence, prior, context_prior)(trie)


def select_subtree(trie: Trie, budget: int, min_share: float = 0.0, score: np.ndarray | None = None) -> list[int]:
    """Best-first: node indices by score (default: weight share, as REST's prefix counts; ties: shallower, then
    lexicographic), each only after its parent, at most `budget`, none scoring below `min_share`.  Every prefix of
    the result is a subtree."""
    if budget <= 0 or not len(trie):
        return []
    score = trie.weight / trie.total if score is None else score
    keep = np.flatnonzero(score >= min_share - 1e-12) if min_share > 0 else np.arange(len(trie))
    if not len(keep):
        return []
    rank = keep[np.lexsort((trie.order[keep], trie.depth[keep], -score[keep]))]
    chosen: list[int] = []
    taken = set()
    parents = trie.parents
    for i in rank.tolist():
        p = int(parents[i])
        if p < 0 or p in taken:
            chosen.append(i)
            taken.add(i)
            if len(chosen) >= budget:
                break
    return chosen
