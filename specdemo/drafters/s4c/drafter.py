"""S4C drafter: three autoregressive draft heads over the target's features + the continuous verification tree.

See `heads.py` beside this file for the model and our reading of the paper, `mode.py` for the options.

KV caches: each head keeps its own cache (the engine's preallocated KVCache) of committed positions, fed from the
target features that `observe` receives; draft rows are appended for one layer call and cut off again (recomputing
a window would cost ~W x the work per step on CPU; the per-head lag, head h needs x_{t+h}, makes it incremental).

Stats: `drafter.tally` (tree.DepthTally) counts, per depth, the steps whose head tree reached it and that accepted it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from specdemo.budget import best_size, calibrated_cost, cost_at, curve_sizes, cut_to_cost, verify_cost_curve
from specdemo.drafters.contract import PROMPT, DraftSource
from specdemo.drafters.pld import lookup_with_ngram_length
from specdemo.drafters.s4c.draft_step import DraftScores, draft_step, varying_shape_attention
from specdemo.drafters.s4c.head_calls import HeadCallPricing
from specdemo.drafters.s4c.heads import S4CHeads, unavailable_reason  # noqa: F401  (the contract's, from heads.py)
from specdemo.engine import DecodeState, Drafter, Verified
from specdemo.kvcache import KVCache
from specdemo.sampling import SamplingConfig, draft_candidates
from specdemo.target import Target
from specdemo.tree import DepthTally, DraftTree, additive_mask, ancestor_mask, path_to

TREES = ("s4c", "chain", "eagle")
# a node drafted by head d carries the source "head{d}"; heads past the fourth are rare and shown as the fourth
SOURCES = (
    DraftSource("head1", "head 1", "#dbeafe", "#1e3a8a"),
    DraftSource("head2", "head 2", "#bfdbfe", "#1e40af"),
    DraftSource("head3", "head 3", "#93c5fd", "#1d4ed8"),
    DraftSource("head4", "head 4+", "#60a5fa", "#2563eb"),
    PROMPT,
)


SHOWN_HEADS = sum(s.name.startswith("head") for s in SOURCES)


def _source(depth: int) -> str:
    """The source name of a node drafted at `depth` (the head that drafted it), the fourth and deeper heads sharing
    one (their calibration shares one table too: calibration.MAX_DEPTH)."""
    return f"head{min(depth, SHOWN_HEADS)}"


@dataclass
class _Node:
    token: int
    parent: int  # index into the node list, -1 = root
    depth: int
    logp: float  # cumulative draft log-probability
    outs: list = field(default_factory=list)  # this head's draft outputs at positions n-depth+1 .. n-1 (for its child head)


class S4CDrafter(Drafter):
    name = "s4c"
    needs_hidden = True

    def __init__(self, target: Target, heads: S4CHeads, tree: str = "s4c", budget: int = 15, topk: int = 3,
                 prompt_lookup: int = 0, dynamic: bool = False, calibration: Path | None = None, window: int = 0,
                 couple: float = 1.0, price_calls: bool = True):
        if tree not in TREES:
            raise ValueError(f"s4c tree must be one of {', '.join(TREES)} (got {tree!r})")
        self.target, self.heads, self.tree_kind = target, heads, tree
        self.budget, self.topk = int(budget), max(1, int(topk))
        self.window = int(window)  # >0: heads start at the last `window` prompt tokens
        self.couple = float(couple)
        self.prompt_lookup = int(prompt_lookup)  # >0: also graft a prompt-lookup chain of up to this many tokens
        self.n_heads = heads.n_heads
        self.feature_layers = heads.feature_layers  # the engine hands these layers' states too (fused heads)
        # dynamic: score every node with its calibrated acceptance probability and send, per step, the best-first
        # prefix that pays for its verification (budget.cut_to_cost); `budget` is then only a cap
        self.dynamic, self.calibration_path = bool(dynamic), calibration
        self.calibrator, self.rel_cost = None, None
        self.price_calls, self.pricing = bool(price_calls), None
        self.tally = DepthTally(self.n_heads)
        self._last_depths: list[int] = []
        self._graft: tuple[int, list[int]] = (0, [])

    # ------------------------------------------------------------------ state
    def begin(self, state: DecodeState, prompt_hidden: torch.Tensor | None) -> None:
        t, d = self.target, self.heads.d
        self.calibrator, self.rel_cost = calibrated_cost(self.target, "s4c", state, self.dynamic, self.calibration_path)
        self.pricing = None if self.rel_cost is None or not self.price_calls else \
            HeadCallPricing(self.n_heads, verify_cost_curve(t, curve_sizes(t))[0])
        cap = len(state.tokens) + state.max_new_tokens + 8
        width = (len(self.feature_layers) + 1) * d  # the declared layers' states and the last one, side by side
        self.features = torch.zeros(cap, width, dtype=t.dtype, device=t.device)  # the target's feature f_t by position
        # per head, its committed outputs by position (head h + 1's input features)
        self.head_outputs = [torch.zeros(cap, d, dtype=t.dtype, device=t.device) for _ in range(self.n_heads)]
        self.n_features = 0  # positions whose target feature has arrived
        if prompt_hidden is not None:
            self.features[: len(prompt_hidden)] = prompt_hidden
            self.n_features = len(prompt_hidden)
        # per head, the first position not yet in its cache: none is yet, and those before the window never enter it
        start = max(0, state.prompt_len - self.window) if self.window > 0 else 0
        self.cached_until = [start] * self.n_heads
        self.caches = [KVCache(capacity=cap + 64) for _ in range(self.n_heads)]
        self._masks: dict[tuple[int, ...], torch.Tensor] = {}
        # the frozen LM head's rows for the draft vocabulary and the prompt's tokens (draft_step.DraftScores)
        self.score = DraftScores(t, self.heads, state.tokens)
        self.vocab = self.score.vocab
        self.target_vocab = t.lm_head.weight.shape[0]  # the width of the target's logits: the noise's length
        step = draft_step(self.target, self.heads)
        self.head_forward = step.head if step is not None else self.heads.head

    def observe(self, state: DecodeState, verified: Verified) -> None:
        h = verified.hidden
        self.features[self.n_features : self.n_features + len(h)] = h
        self.n_features += len(h)
        if self.pricing is not None:
            self.pricing.verified()
        self.tally.add(max(self._last_depths, default=0), len(verified.accepted_nodes))

    # ------------------------------------------------------------------ one head call
    def _run_head(self, h: int, n: int, tokens: list[int], branches: list[tuple[list[int], list[torch.Tensor]]]):
        """Head h (0-based): add committed positions cached_until[h] .. n-h-1 to its cache, then run draft rows for each
        branch (tokens for positions n-h .. n-1 and their input features) in the same call; return the committed
        outputs' last row (for h = 0) and, per branch, its draft outputs."""
        k = h + 1
        heads, t = self.heads, self.target
        lo, hi = self.cached_until[h], n - k  # committed positions lo .. hi (inclusive)
        c = max(0, hi - lo + 1)
        # the committed rows are slices (token at p + k, feature at p); each branch's rows follow them
        rows_tok = list(tokens[lo + k : hi + k + 1])
        rows_feat = [(self.features if h == 0 else self.head_outputs[h - 1])[lo : lo + c]]
        rows_pos = list(range(lo, lo + c))
        spans = []
        for btoks, bfeats in branches:
            start = len(rows_tok)
            rows_tok += btoks
            rows_feat.append(torch.stack(bfeats))
            rows_pos += range(n - k + 1, n - k + 1 + len(btoks))
            spans.append((start, len(rows_tok)))
        if not rows_tok:
            return [], [[] for _ in branches]
        cache = self.caches[h]
        past = cache.get_seq_length()
        # committed rows are a chain; each branch hangs off the last committed row (it sees them all, then itself)
        parents = list(range(-1, c - 1))
        for s_, e in spans:
            parents += [c - 1] + list(range(s_, e - 1))
        mask = self._mask(parents, past)
        ids = torch.tensor([rows_tok], device=t.device)
        emb = heads.embed(ids).to(t.dtype)
        feat = torch.cat(rows_feat).unsqueeze(0)
        pos = torch.tensor([rows_pos], device=t.device)
        out = self.head_forward(h, emb, feat, pos, mask, cache)[0]
        cache.keep(past + c, [])  # drop the draft rows, keep the committed ones
        if c:
            self.head_outputs[h][lo : hi + 1] = out[:c]
            self.cached_until[h] = hi + 1
        return out[:c], [list(out[s:e]) for s, e in spans]

    def _mask(self, parents: list[int], past: int) -> torch.Tensor:
        """additive_mask(ancestor_mask(parents), past): the rows' own block is kept per request (the same few row
        layouts repeat step after step, and building one is a Python loop) and the visible past is padded on in one
        operation."""
        key = tuple(parents)
        if key not in self._masks:
            self._masks[key] = additive_mask(ancestor_mask(parents).to(self.target.device), 0, self.target.dtype)
        return F.pad(self._masks[key], (past, 0))

    def _dist(self, state: DecodeState, rows: torch.Tensor, positions: list[int], k: int):
        """Per row (guessing the target's token at positions[i]): k candidate tokens and their log-scores."""
        logp = self.score(rows).float().log_softmax(-1)
        sampling = state.sampling if self.couple > 0 else SamplingConfig()
        return draft_candidates(logp, self.vocab, positions, sampling, self.target_vocab, k, sharpen=self.couple)

    # ------------------------------------------------------------------ drafting
    @torch.no_grad()
    def propose(self, state: DecodeState) -> DraftTree:
        self._last_depths, self._started = [], time.perf_counter()
        n = len(state.tokens) - 1  # root position
        if self.n_features != n or n < 1:
            return DraftTree.empty()
        grow = {"s4c": self._grow_s4c, "chain": self._grow_chain, "eagle": self._grow_eagle}[self.tree_kind]
        # prompt lookup's continuation, looked up once: the deeper heads' check weighs it too
        self._graft = lookup_with_ngram_length(state.tokens, min(self.prompt_lookup, self.budget - 1), max_ngram=3,
                                               min_ngram=1) if self.prompt_lookup > 0 else (0, [])
        with varying_shape_attention():
            nodes, vertical = grow(state, n)
        return self._finish(state, nodes, vertical)

    def _grow_s4c(self, state: DecodeState, n: int) -> tuple[list[_Node], set[int]]:
        """The paper's tree: two vertical top-1 chains from head 1's top 2, each chain node also bearing its head's
        top-k alternatives.  Returns the nodes and the chain nodes (kept first)."""
        return self._grow_chains(state, n, width=2, alternatives=True)

    def _grow_chain(self, state: DecodeState, n: int) -> tuple[list[_Node], set[int]]:
        """One top-1 chain: each head extends it by its best token."""
        return self._grow_chains(state, n, width=1, alternatives=False)

    def _grow_chains(self, state: DecodeState, n: int, width: int, alternatives: bool) -> tuple[list[_Node], set[int]]:
        """`width` vertical top-1 chains from head 1's best tokens; with `alternatives`, every chain node also bears
        its head's top-k other tokens (which are not extended)."""
        nodes = self._depth1(state, n, max(self.topk, width) if alternatives else width)
        vertical = set(range(width))
        frontier = list(range(width))
        for depth in self._deeper_depths(state, n):
            if not frontier or not self._deeper_may_pay(nodes, frontier, depth):
                break
            ranked = self._children(state, n, nodes, frontier, depth)
            next_frontier = []
            for i, (toks, lps) in zip(frontier, ranked):
                kept = zip(toks, lps) if alternatives else [(toks[0], lps[0])]
                for rank, (tok, lp) in enumerate(kept):
                    nodes.append(_Node(tok, i, depth, nodes[i].logp + lp))
                    if rank == 0:
                        next_frontier.append(len(nodes) - 1)
                        vertical.add(len(nodes) - 1)
            frontier = next_frontier
        return nodes, vertical

    def _grow_eagle(self, state: DecodeState, n: int) -> tuple[list[_Node], set[int]]:
        """EAGLE-2 style: every expanded node gets its top-k children, and the k best nodes of each depth by
        cumulative log-prob are expanded next.  No chain is kept first."""
        k = self.topk
        nodes = self._depth1(state, n, k)
        frontier = list(range(len(nodes)))
        for depth in self._deeper_depths(state, n):
            if not frontier or not self._deeper_may_pay(nodes, frontier, depth):
                break
            ranked = self._children(state, n, nodes, frontier, depth)
            for i, (toks, lps) in zip(frontier, ranked):
                for tok, lp in zip(toks, lps):
                    nodes.append(_Node(tok, i, depth, nodes[i].logp + lp))
            this_depth = [j for j in range(len(nodes)) if nodes[j].depth == depth]
            frontier = sorted(this_depth, key=lambda j: -nodes[j].logp)[:k]
        return nodes, set()

    def _depth1(self, state: DecodeState, n: int, width: int) -> list[_Node]:
        """Head 1 over the committed positions up to n-1; its output at n-1 ranks the depth-1 candidates, of which
        the best `width` become nodes."""
        self._run_head(0, n, state.tokens, [])
        toks, lps = self._dist(state, self.head_outputs[0][n - 1 : n], [n + 1], max(self.topk, 2))
        if self.pricing is not None:
            self.pricing.saw(1, lps)
        return [_Node(tok, -1, 1, lp) for tok, lp in zip(toks[0], lps[0])][:width]

    def _deeper_may_pay(self, nodes: list[_Node], frontier: list[int], depth: int) -> bool:
        """Whether a node at `depth` or deeper could survive this step's cut (budget.cut_to_cost).  Such a node's
        calibrated acceptance is at most its head's table at the best frontier path's probability (paths only lose
        probability; the tables are isotonic), so a budget of such nodes beside the tree so far and the graft bounds
        every deeper tree: when even they are cut, the head calls are skipped.  Past the bound, with `price_calls`,
        the calls must also pay for themselves (head_calls.py: the nodes they are expected to add against the calls'
        time).  Fixed trees run every head."""
        if self.rel_cost is None:
            return True
        raw = [math.exp(nd.logp) for nd in nodes]
        scores = self.calibrator([_source(nd.depth) for nd in nodes], [nd.depth for nd in nodes], raw)
        ngram_length, graft = self._graft
        scores += self.calibrator([PROMPT.name] * len(graft), list(range(1, len(graft) + 1)),
                                  [float(ngram_length)] * len(graft))
        bound = self.calibrator([_source(depth)], [depth], [max(raw[i] for i in frontier)])[0]
        above = sorted((x for x in scores if x > bound), reverse=True)[: self.budget]
        if best_size(above + [bound] * (self.budget - len(above)), self.rel_cost) <= len(above):
            return False
        return self.pricing is None or self.pricing.pays(scores, self._expected(raw, frontier, depth), self.rel_cost,
                                                         self.budget, time.perf_counter() - self._started)

    def _expected(self, raw: list[float], frontier: list[int], depth: int) -> list[list[float]]:
        """The calibrated scores that heads depth..depth + j are expected to add, for each j: each frontier node's
        candidates at their heads' mean probabilities, the chains going on from the first (HeadCallPricing)."""
        k = 1 if self.tree_kind == "chain" else self.topk
        probs, more, out = [raw[i] for i in frontier], [], []
        for d in range(depth, self.n_heads + 1):
            top = self.pricing.mean_top(d, k)
            children = [p * t for p in probs for t in top]
            more = more + self.calibrator([_source(d)] * len(children), [d] * len(children), children)
            out.append(more)
            probs = [p * top[0] for p in probs]
        return out

    def _deeper_depths(self, state: DecodeState, n: int):
        """Depths 2..H, while head d - 1 has a committed position before the root and a node at depth d still fits
        in what is left to generate (the target adds one token of its own)."""
        for depth in range(2, self.n_heads + 1):
            if n - (depth - 1) < 0 or depth > state.remaining - 1:
                return
            yield depth

    def _children(self, state: DecodeState, n: int, nodes: list[_Node], frontier: list[int],
                  depth: int) -> list[tuple[list[int], list[float]]]:
        """Run head depth - 1 on the path to every frontier node (one call); per frontier node, its top-k children
        as (tokens, log-probs given the parent).  Each node keeps the head's outputs along its path for its own
        children's head."""
        h = depth - 1
        branches = []
        for i in frontier:
            path = path_to([nd.parent for nd in nodes], i)  # node indices depth 1..depth-1
            btoks = [nodes[j].token for j in path]
            parent_outs = nodes[nodes[i].parent].outs if nodes[i].parent >= 0 else []
            bfeats = [self.head_outputs[h - 1][n - h]] + list(parent_outs)
            branches.append((btoks, bfeats))
        start = time.perf_counter()
        _, outs = self._run_head(h, n, state.tokens, branches)
        for i, o in zip(frontier, outs):
            nodes[i].outs = o
        ctoks, clps = self._dist(state, torch.stack([o[-1] for o in outs]), [n + depth] * len(outs), self.topk)
        if self.pricing is not None:
            self.pricing.timed_call(time.perf_counter() - start)
            self.pricing.saw(depth, clps)
        return list(zip(ctoks, clps))

    def _finish(self, state: DecodeState, nodes: list[_Node], vertical: set[int]) -> DraftTree:
        """The head tree under the budget, prompt lookup's continuation grafted on (option `prompt_lookup`), then
        calibrated and, when sized per step, cut to what pays for its verification."""
        ngram_length, graft = self._graft
        # a fixed tree shares the budget between the heads and the graft; a tree sized per step (below) keeps every
        # head node and lets the cut rank them against the grafted ones, the budget capping what it sends
        tree = self._select(nodes, vertical, self.budget if self.rel_cost is not None else self.budget - len(graft))
        tree = tree.graft(graft, PROMPT.name, score=float(ngram_length)) if graft else tree
        # raw scores: the heads' path probability; grafted prompt nodes the matched n-gram's length (their
        # calibration table maps it, per depth, to how often such a node is right)
        if self.calibrator is not None:
            tree = self.calibrator.apply(tree)
        if self.rel_cost is not None:
            tree = cut_to_cost(tree, self.rel_cost, max_nodes=self.budget)
            self._last_depths = [d for d, s in zip(tree.depths(), tree.sources) if s != PROMPT.name]
        if self.pricing is not None:
            self.pricing.sent(cost_at(self.rel_cost, len(tree)))
        return tree

    def _select(self, nodes: list[_Node], first: set[int], budget: int | None = None) -> DraftTree:
        """Keep `budget` nodes: the vertical chains first (s4c/chain), then the rest by cumulative log-prob; a node
        is only kept with its parent; output in topological order."""
        order = sorted(range(len(nodes)), key=lambda j: (j not in first, -nodes[j].logp if j not in first else j))
        keep: set[int] = set()
        for j in order:
            if len(keep) >= (self.budget if budget is None else budget):
                break
            if nodes[j].parent < 0 or nodes[j].parent in keep:
                keep.add(j)
        kept = sorted(keep, key=lambda j: (nodes[j].depth, j))
        self._last_depths = [nodes[j].depth for j in kept]
        full = DraftTree([nd.token for nd in nodes], [nd.parent for nd in nodes], [_source(nd.depth) for nd in nodes],
                         None, [math.exp(nd.logp) for nd in nodes])
        return full.subtree(kept)
