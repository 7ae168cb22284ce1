"""Draft trees and the plain-tensor buffers one verification forward needs (Medusa/REST style, built once per tree).

A draft tree hangs off the *root*: the newest committed token, whose logits the target has not computed yet.  Nodes
are stored in topological order (a parent before its children); `parents[i] == -1` means "child of the root".
Probe nodes (SDSAT's adaptive tokens) are fed through the target like any node but can never be accepted: the
drafter reads their outputs to draft the next step.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Sequence

import torch


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """Node indices from the root's child down to `node`, in a parent list where -1 is the root."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """(n, n) bool: row i is True at i and at each of its ancestors (`parents[i] < i`; -1 = none).

    Every tree-shaped attention in the project is this matrix: the verification tree, a draft head's branches
    hung after its committed rows, SDSAT's probe chains."""
    n = len(parents)
    allow = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            allow[i] = allow[p]
        allow[i, i] = True
    return allow


def additive_mask(allow: torch.Tensor, past: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask (1, 1, n, past + m) for a forward over n new rows: all `past` cached positions visible, then
    the (n, m) bool `allow` over the new rows; blocked entries get the dtype's minimum (what transformers expects)."""
    n, m = allow.shape
    full = torch.zeros(1, 1, n, past + m, dtype=dtype, device=allow.device)
    full[0, 0, :, past:].masked_fill_(~allow, torch.finfo(dtype).min)
    return full


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
        return path_to(self.parents, node)

    def graft(self, chain: Sequence[int], source: str, score: float = 1.0) -> "DraftTree":
        """This tree with `chain` merged in as a trie branch under the root: follow the nodes that already spell its
        start, then hang the rest off the deepest of them (a lookup continuation next to a model's drafts)."""
        node, i = -1, 0
        while i < len(chain):
            nxt = next((j for j, (t, p) in enumerate(zip(self.tokens, self.parents))
                        if p == node and t == chain[i] and not self.is_probe(j)), None)
            if nxt is None:
                break
            node, i = nxt, i + 1
        tail = list(chain[i:])
        if not tail:
            return self
        n = len(self)
        extend = lambda xs, v: xs + [v] * len(tail) if xs is not None else None  # noqa: E731
        return DraftTree(self.tokens + tail, self.parents + [node] + list(range(n, n + len(tail) - 1)),
                         extend(self.sources, source), extend(self.probe, False), extend(self.scores, score))

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
        """The nodes `keep`, re-indexed in the order given: any order in which each node comes after its parent
        (increasing indices always qualify), each node's parent kept too."""
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
    children    -- per tree position, {token: tree position} of its draft (non-probe) children, for the walk.
    """

    n: int
    depth: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    children: list[dict[int, int]] = field(repr=False)
    probes_from: int | None = None  # the first tree position of the probes when they are the last rows; else None

    @classmethod
    def build(cls, tree: DraftTree, root_pos: int, device: torch.device | str = "cpu") -> "TreeBuffers":
        n = len(tree) + 1
        parent = [-1] + [p + 1 for p in tree.parents]  # in tree positions (root = 0)
        depth = [0] * n
        children: list[dict[int, int]] = [{} for _ in range(n)]
        for i in range(1, n):
            p = parent[i]
            depth[i] = depth[p] + 1
            if not tree.is_probe(i - 1):
                children[p].setdefault(tree.tokens[i - 1], i)  # first of duplicate siblings wins
        depth_t = torch.tensor(depth, dtype=torch.long)
        probes = [i + 1 for i in range(len(tree)) if tree.is_probe(i)]
        probes_from = probes[0] if probes and probes == list(range(probes[0], n)) else None
        return cls(n, depth_t.to(device), ancestor_mask(parent).to(device), (depth_t + root_pos).to(device), children,
                   probes_from)

    def attention_mask(self, past: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive 4D mask (1, 1, n, past + n): the whole committed context plus ancestors-and-self in the tree.
        Where the probes are the last rows, the mask says from which row (`probes_from`): their outputs only draft,
        so the CPU's row-exact attention computes them in one call (cpu_attention.row_exact_sdpa)."""
        mask = additive_mask(self.mask, past, dtype)
        mask.probes_from = self.probes_from
        return mask


@dataclass
class DepthTally:
    """Acceptance by draft depth d = 1..depth over the steps of a run (or of many runs, with `+`): how many steps
    sent a tree reaching d, and how many of them accepted at least d drafted tokens."""

    depth: int
    steps: int = 0
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reached = self.reached or [0] * self.depth
        self.accepted = self.accepted or [0] * self.depth

    def add(self, tree_depth: int, n_accepted: int) -> None:
        self.steps += 1
        for d in range(min(tree_depth, self.depth)):
            self.reached[d] += 1
            self.accepted[d] += n_accepted > d

    def __add__(self, other: "DepthTally") -> "DepthTally":
        return DepthTally(self.depth, self.steps + other.steps, [a + b for a, b in zip(self.reached, other.reached)],
                          [a + b for a, b in zip(self.accepted, other.accepted)])

    def share(self) -> list[float]:
        """Share of all steps that accepted >= d drafts (what the acceptance-by-depth plots show)."""
        return [a / self.steps if self.steps else 0.0 for a in self.accepted]

    def given_reached(self) -> list[float | None]:
        """P(accepted >= d | the tree reached depth d)."""
        return [a / r if r else None for a, r in zip(self.accepted, self.reached)]

    def conditional(self) -> list[float]:
        """P(accepted >= d | accepted >= d-1): how the chain of acceptances decays with depth."""
        prev = [self.steps] + self.accepted[:-1]
        return [a / p if p else 0.0 for a, p in zip(self.accepted, prev)]
