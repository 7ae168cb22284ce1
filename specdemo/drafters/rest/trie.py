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
    """All prefixes of a set of weighted continuations (arrays, one entry per node), with each node's score."""

    tokens: np.ndarray
    parents: np.ndarray  # index into these arrays, -1 = child of the root
    depth: np.ndarray  # 1 = child of the root
    order: np.ndarray  # rank of the node's path in lexicographic order (deterministic tie-break)
    weight: np.ndarray
    context_weight: np.ndarray
    score: np.ndarray  # Scoring's estimate; never above the parent's
    total: float

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Scoring:
    """How a node is ranked.  "acceptance": the estimated probability that the node ends up on the accepted path, the
    product from the root down of confidence * weight(node) / (weight(parent) + prior), the root's weight being the
    total.  The prior shrinks prefixes seen in few continuations (a single retrieved continuation is right ~45% of the
    time per token on the embedded model, not 100%); request-dominated nodes use `context_prior` (their rows weigh the
    request's weight).  Fitted by maximum likelihood on HumanEval + chat replays (`specdemo acceptance`).  "count":
    REST's raw prefix share, weight(node) / total."""

    kind: str = "acceptance"
    confidence: float = 0.95
    prior: float = 1.6
    context_prior: float = 5.0

    def scores(self, weight: np.ndarray, context_weight: np.ndarray, total: float) -> np.ndarray:
        """Scores laid out as the weights: (depth, rows), cell (d, i) the prefix of length d + 1 that row i's
        continuation starts with."""
        if self.kind == "count":  # the running minimum keeps a child at most its parent where sums round apart
            return np.minimum.accumulate(weight / total, axis=0)
        parent = np.concatenate([np.full((1, weight.shape[1]), total), weight[:-1]])
        k = np.where(context_weight * 2 > weight, self.context_prior, self.prior)
        return np.cumprod(np.minimum(self.confidence * weight / (parent + k), 1.0), axis=0)


def build_trie(rows: np.ndarray, weights: np.ndarray, context_rows: np.ndarray | None = None,
               keep: int = 0, scoring: Scoring = Scoring()) -> Trie:
    """The weighted prefix trie of `rows` ((R, L), padded with -1 after the end), scored by `scoring`; context_rows
    marks rows from the request (their weight is also summed separately, for the node's source label).

    The rows are sorted and their distinct ones laid out as an (L, R) grid: cell (d, i) is the prefix of length d + 1
    of row i, and a node where row i is the first row with that prefix.  Every cell's node (its group's first row),
    weight and score come from a few whole-grid operations, not a dozen per depth: a few request rows build in
    ~0.07 ms, a match of 5,000 store continuations in ~2.3 ms (the 2-core dev CPU, docs/rest.md).

    keep > 0: only the nodes scoring at least the keep-th best.  A node never scores above its parent, so they form a
    subtree, and the best-first subtree of at most `keep` nodes (`select_subtree`) is the same as in the whole trie."""
    R, L = rows.shape if rows.ndim == 2 else (0, 0)
    w = np.asarray(weights, dtype=np.float64)
    wc = w * np.asarray(context_rows, dtype=bool) if context_rows is not None else np.zeros(R)
    if R == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Trie(empty, empty, empty, empty, np.zeros(0), np.zeros(0), np.zeros(0), 0.0)
    order = lexicographic_order(rows)
    rows, w, wc = rows[order], w[order], wc[order]
    lcp = np.zeros(R, dtype=np.int64)
    lcp[1:] = np.cumprod(rows[1:] == rows[:-1], axis=1).sum(1)
    distinct = np.flatnonzero(lcp < L)  # a repeated row starts no prefix; its weight counts through the sums
    ends = np.append(distinct, R)
    cw, cwc = (np.concatenate([[0.0], np.cumsum(x)])[ends] for x in (w, wc))
    rows, lcp, n = rows[distinct].T, lcp[distinct], len(distinct)
    starts = lcp <= np.arange(L)[:, None]  # (L, n): row i is the first with its prefix of length d + 1
    index = np.arange(n)
    group = np.maximum.accumulate(np.where(starts, index, 0), axis=1)  # each cell's prefix's first row
    after = np.minimum.accumulate(np.where(starts, index, n)[:, ::-1], axis=1)[:, ::-1]
    group_end = np.concatenate([after[:, 1:], np.full((L, 1), n)], axis=1)  # the next prefix's first row
    weight, context_weight = cw[group_end] - cw[group], cwc[group_end] - cwc[group]
    score = scoring.scores(weight, context_weight, float(cw[-1]))
    node = starts & np.minimum.accumulate(rows != PAD, axis=0)
    if 0 < keep < node.sum():
        node &= score >= np.partition(score[node], -keep)[-keep]
    depth, row = np.nonzero(node)  # level by level, parents first; within a level in row order
    ids = np.full((L, n), -1, dtype=np.int64)
    ids[depth, row] = np.arange(len(row))
    up = np.maximum(depth - 1, 0)
    parents = np.where(depth > 0, ids[up, group[up, row]], -1)
    return Trie(rows[depth, row], parents, depth + 1, row, weight[depth, row], context_weight[depth, row],
                score[depth, row], float(cw[-1]))


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


def select_subtree(trie: Trie, budget: int, min_share: float = 0.0) -> list[int]:
    """Best-first: node indices by score (ties: shallower, then lexicographic), each only after its parent, at most
    `budget`, none scoring below `min_share`.  Every prefix of the result is a subtree."""
    if budget <= 0 or not len(trie):
        return []
    score = trie.score
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
