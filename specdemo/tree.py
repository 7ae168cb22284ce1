"""Draft trees and the plain-tensor buffers one verification forward needs (Medusa/REST style, built once per tree).

A draft tree hangs off the *root*: the newest committed token, whose logits the target has not computed yet.  Nodes
are stored in topological order (a parent before its children); `parents[i] == -1` means "child of the root".
Probe nodes (SDSAT's adaptive tokens) are fed through the target like any node but can never be accepted: the
drafter reads their outputs to draft the next step.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    tokens: list[int]
    parents: list[int]
    sources: list[str] | None = None  # per node, where the draft came from (shown in the UI)
    probe: list[bool] | None = None  # per node, True = probe (never accepted, output goes back to the drafter)
    scores: list[float] | None = None  # per node, the drafter's estimate that it ends up accepted (see calibration.py)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents differ in length")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i} has parent {p}: parents must come first (topological order)")
            if self.probe and p >= 0 and self.probe[p] and not self.probe[i]:
                raise ValueError(f"draft node {i} hangs off probe node {p}")

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def empty(cls) -> "DraftTree":
        return cls([], [])

    @classmethod
    def chain(cls, tokens: list[int], source: str | None = None) -> "DraftTree":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), [source] * len(tokens) if source else None)

    def is_probe(self, i: int) -> bool:
        return bool(self.probe and self.probe[i])

    def depths(self) -> list[int]:
        """Depth of each node; the root has depth 0, its children depth 1."""
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node`."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def prune(self, max_depth: int, max_nodes: int | None = None) -> "DraftTree":
        """Drop nodes deeper than max_depth (and past max_nodes, in order); keeps the tree topological."""
        depth = self.depths()
        keep: list[int] = []
        remap: dict[int, int] = {-1: -1}
        for i, p in enumerate(self.parents):
            if depth[i] <= max_depth and p in remap and (max_nodes is None or len(keep) < max_nodes):
                remap[i] = len(keep)
                keep.append(i)
        if len(keep) == len(self):
            return self
        return self.subtree(keep)

    def subtree(self, keep: list[int]) -> "DraftTree":
        """The nodes `keep` (increasing indices, each node's parent kept too), re-indexed, in the same order."""
        remap = {-1: -1, **{i: k for k, i in enumerate(keep)}}
        pick = lambda xs: [xs[i] for i in keep] if xs is not None else None  # noqa: E731
        return DraftTree([self.tokens[i] for i in keep], [remap[self.parents[i]] for i in keep],
                         pick(self.sources), pick(self.probe), pick(self.scores))

    def best_first(self) -> list[int]:
        """Non-probe nodes in best-first order: repeatedly the highest-scoring node whose parent is already taken
        (ties: shallower, then earlier).  Every prefix of this order is a subtree, so cutting it anywhere keeps the
        tree connected.  Needs `scores`."""
        depth = self.depths()
        children: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            if not self.is_probe(i):
                children.setdefault(p, []).append(i)
        key = lambda i: (-self.scores[i], depth[i], i)  # noqa: E731
        heap = [key(i) for i in children.get(-1, [])]
        heapq.heapify(heap)
        out = []
        while heap:
            i = heapq.heappop(heap)[2]
            out.append(i)
            for c in children.get(i, []):
                heapq.heappush(heap, key(c))
        return out


@dataclass
class TreeBuffers:
    """Everything a verification forward needs for one tree; row/column 0 is the root.

    mask[i, j]  -- True where tree position i may attend to tree position j (ancestors and itself).
    positions   -- absolute position ids: committed length + depth.
    paths       -- one row per leaf: tree positions from the root to that leaf, padded with -1
                   (Medusa's "retrieve indices"), for visualisation and tests.
    children    -- per tree position, {token: tree position} of its draft (non-probe) children, for the walk.
    """

    n: int
    depth: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    paths: torch.Tensor
    children: list[dict[int, int]] = field(repr=False)

    @classmethod
    def build(cls, tree: DraftTree, root_pos: int, device: torch.device | str = "cpu") -> "TreeBuffers":
        n = len(tree) + 1
        parent = [-1] + [p + 1 for p in tree.parents]  # in tree positions (root = 0)
        depth = [0] * n
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[0, 0] = True
        children: list[dict[int, int]] = [{} for _ in range(n)]
        is_leaf = [True] * n
        for i in range(1, n):
            p = parent[i]
            depth[i] = depth[p] + 1
            mask[i] = mask[p]
            mask[i, i] = True
            is_leaf[p] = False
            if not tree.is_probe(i - 1):
                children[p].setdefault(tree.tokens[i - 1], i)  # first of duplicate siblings wins
        leaves = [i for i in range(n) if is_leaf[i]]
        max_d = max(depth) + 1
        paths = torch.full((len(leaves), max_d), -1, dtype=torch.long)
        for r, leaf in enumerate(leaves):
            chain = mask[leaf].nonzero().flatten()  # ancestors are in topological order
            paths[r, : len(chain)] = chain
        depth_t = torch.tensor(depth, dtype=torch.long)
        return cls(n, depth_t.to(device), mask.to(device), (depth_t + root_pos).to(device), paths, children)

    def attention_mask(self, past: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive 4D mask (1, 1, n, past + n): the whole committed context plus ancestors-and-self in the tree."""
        full = torch.zeros(1, 1, self.n, past + self.n, dtype=dtype, device=self.mask.device)
        full[0, 0, :, past:].masked_fill_(~self.mask, torch.finfo(dtype).min)
        return full
