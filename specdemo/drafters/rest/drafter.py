"""REST (He et al., 2024): draft trees retrieved from a datastore, merged with matches in the request itself.

Every step:
1. Datastore: the longest suffix of prompt + output so far (16 down to 2 tokens) that occurs in the datastore; up to
   5000 of its occurrences, sampled evenly across the suffix-array range; the 10 tokens after each (never past a
   document boundary).  See datastore.py beside this file.
2. Request (SuffixDecoding-style): the same longest-suffix search over prompt + output so far, all occurrences.
   REST alone cannot copy a variable name it has only seen in the prompt; this can.  (The options call the request
   "context": use_context, context_weight, ...; nodes it mostly supports carry the source "prompt", as every
   drafter's copies from the request do.)
3. One weighted trie over both sets of continuations (trie.py beside this file): a node's weight is the (weighted)
   number of continuations that start with its prefix (store rows weigh 1, request rows `context_weight`).
4. Each node gets an estimated acceptance probability (`trie.Scoring`): the product down its path of
   0.95 * weight(node) / (weight(parent) + prior), which shrinks prefixes seen only a few times (REST's raw count
   share trusts a lone continuation completely; on the embedded model it is right ~45% per token).  The draft is the
   best-first subtree by that score under the node budget (a node only after its parent; ties: shallower, then token
   order), so it is deterministic.  `scoring="count"` selects by REST's raw prefix counts instead.
5. With `dynamic=true` (the default on CPU where the model has a calibration) each node's score is mapped to the
   probability that it is accepted, fitted on training prompts, and the step sends the best-first prefix that
   maximises expected tokens per unit of verification cost (budget.cut_to_cost): when the retrieved continuations
   disagree the step sends a small tree or none.  The node budget is then only a cap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specdemo.budget import calibrated_cost, cut_to_cost, default_sizing
from specdemo.calibration import Calibrator
from specdemo.drafters.contract import PROMPT, DrafterUnavailable, DraftSource, Knob, Option
from specdemo.drafters.rest.datastore import (
    Datastore,
    DatastoreError,
    build_command,
    default_dir,
)
from specdemo.drafters.rest.trie import PAD, Scoring, Trie, build_trie, select_subtree
from specdemo.engine import DecodeState, Drafter
from specdemo.target import EMBEDDED, Target
from specdemo.tree import DraftTree

DATASTORE = DraftSource("datastore", "datastore", "#bbf7d0", "#14532d")
SOURCES = (PROMPT, DATASTORE)  # PROMPT: nodes whose weight comes mostly from the request itself


def open_store(path: str | Path, target: Target) -> Datastore:
    """A datastore opened once per model and kept on it (Target.artifacts), shared by all its drafters: opening
    checks the arrays' hashes, too slow per request, and the store goes when the model goes.  A store rebuilt in
    place (a newer manifest) is opened afresh and replaces the old one."""
    path = Path(path).expanduser()
    try:
        stamp = (path / "manifest.json").stat().st_mtime_ns
    except OSError:
        stamp = 0
    key = ("rest-store", str(path.resolve()))
    held = target.artifacts.get(key)
    if held is None or held[0] != stamp:
        target.artifacts[key] = (stamp, Datastore(path, target=target))
    return target.artifacts[key][1]


# ---------------------------------------------------------------------------------------------------------------------
# Retrieval from the request itself
# ---------------------------------------------------------------------------------------------------------------------
def context_matches(tokens, max_len: int = 16, min_len: int = 2, length: int = 10,
                    max_matches: int = 64) -> tuple[int, np.ndarray]:
    """(match length, continuations (k, length) padded with -1) of the longest suffix of `tokens` (2..16 tokens) that
    also occurs earlier in `tokens`; the most recent `max_matches` occurrences."""
    seq = np.asarray(tokens, dtype=np.int64)
    n = len(seq)
    if n < 2 or min(max_len, n - 1) < max(min_len, 1):
        return 0, np.zeros((0, length), dtype=np.int64)
    cand = np.flatnonzero(seq[:-1] == seq[-1])  # end positions j < n-1 of earlier occurrences of the last token
    m = 1
    for k in range(1, min(max_len, n - 1)):
        if not len(cand):
            break
        c = cand[cand >= k]
        c = c[seq[c - k] == seq[-1 - k]]
        if not len(c):
            break
        cand, m = c, k + 1
    if m < min_len or not len(cand):
        return 0, np.zeros((0, length), dtype=np.int64)
    cand = cand[-max_matches:]
    pos = cand[:, None] + 1 + np.arange(length)
    rows = np.where(pos < n, seq[np.minimum(pos, n - 1)], PAD)
    return m, rows


def to_draft_tree(trie: Trie, chosen: list[int]) -> DraftTree:
    """The chosen nodes as a DraftTree in BFS order (depth, then lexicographic), with per-node sources and scores."""
    if not chosen:
        return DraftTree.empty()
    idx = sorted(chosen, key=lambda i: (int(trie.depth[i]), int(trie.order[i])))
    pos = {i: k for k, i in enumerate(idx)}
    return DraftTree(
        tokens=[int(trie.tokens[i]) for i in idx],
        parents=[pos[int(trie.parents[i])] if trie.parents[i] >= 0 else -1 for i in idx],
        sources=[PROMPT.name if trie.context_weight[i] * 2 > trie.weight[i] else DATASTORE.name for i in idx],
        scores=[float(trie.score[i]) for i in idx],
    )


# ---------------------------------------------------------------------------------------------------------------------
# The drafter
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class RestDrafter(Drafter):
    store: Datastore | None = None
    budget: int = 16
    max_suffix: int = 16
    min_suffix: int = 2
    max_matches: int = 5000
    length: int = 10  # continuation length
    use_context: bool = True
    context_weight: float = 20.0  # weight of one request continuation relative to one datastore continuation
    context_max_matches: int = 64
    min_share: float = 0.0
    scoring: str = "acceptance"  # "acceptance" or "count" (REST's raw prefix counts): trie.Scoring
    confidence: float = 0.95  # see trie.Scoring
    prior: float = 1.6
    context_prior: float = 5.0
    # SuffixDecoding's sizing: at most ceil(spec_factor x the longest match's length) nodes (0: off), since a long
    # match predicts its continuation better than a short one
    spec_factor: float = 0.0
    dynamic: bool = False  # size each tree by its calibrated value against the verification cost (module doc, 5.)
    calibration: Path | None = None  # a calibration file other than the model's shipped one
    name: str = "rest"
    calibrator: Calibrator | None = field(default=None, repr=False)
    rel_cost: dict[int, float] | None = field(default=None, repr=False)

    def begin(self, state: DecodeState, prompt_hidden) -> None:
        self.calibrator, self.rel_cost = calibrated_cost(state.target, "rest", state, self.dynamic, self.calibration)

    def propose(self, state: DecodeState) -> DraftTree:
        tokens = state.tokens
        parts, weights, is_ctx = [], [], []
        m_store = m_ctx = 0
        if self.store is not None:
            m_store, rows = self.store.retrieve(tokens, self.max_suffix, self.min_suffix, self.max_matches,
                                                self.length)
            if len(rows):
                rows[rows == self.store.sep] = PAD
                parts.append(rows)
                weights.append(np.ones(len(rows)))
                is_ctx.append(np.zeros(len(rows), dtype=bool))
        if self.use_context:
            m_ctx, rows = context_matches(tokens, self.max_suffix, self.min_suffix, self.length,
                                          self.context_max_matches)
            if len(rows):
                parts.append(rows)
                weights.append(np.full(len(rows), float(self.context_weight)))
                is_ctx.append(np.ones(len(rows), dtype=bool))
        if not parts:
            return DraftTree.empty()
        budget = self.budget
        if self.spec_factor > 0:
            budget = min(budget, math.ceil(self.spec_factor * max(m_store, m_ctx)))
        scoring = Scoring(self.scoring, self.confidence, self.prior, self.context_prior)
        trie = build_trie(np.concatenate(parts), np.concatenate(weights), np.concatenate(is_ctx), budget, scoring)
        tree = to_draft_tree(trie, select_subtree(trie, budget, self.min_share))
        if self.calibrator is not None:
            tree = self.calibrator.apply(tree)
        return cut_to_cost(tree, self.rel_cost)


def _store_path(target: Target, datastore) -> Path | None:
    if datastore in (None, "", "default"):
        return None
    return Path(datastore).expanduser()


def unavailable_reason(target: Target) -> str | None:
    if (default_dir(target.identity) / "manifest.json").exists():
        return None
    if target.name == EMBEDDED:  # `make setup` and the app's start build it
        return ("REST's default datastore for the embedded model is not built yet: run `python -m specdemo datastore "
                "default` (about a minute).")
    return (f"REST needs a datastore for {target.name}: build one from text in its domain with "
            f"`{build_command(target.name)}` (it is saved where REST looks for it).")


OPTIONS = (
    Option("datastore", "path", special=("default", "none"),
           help="a datastore folder, 'default' (the model's) or 'none' (the request only)"),
    Option("budget", "int", 1, 256,
           help="most draft nodes per step (default on CPU: 24 sized per step, 16 without a calibration; 64 on GPU)"),
    Option("max_suffix", "int", 1, 64, help="longest context suffix looked up"),
    Option("min_suffix", "int", 1, 64, help="shortest context suffix looked up"),
    Option("max_matches", "int", 1, 100_000, help="datastore occurrences read per step"),
    Option("length", "int", 1, 64, help="tokens read after each occurrence"),
    Option("use_context", "bool", help="also retrieve from the request itself"),
    Option("context_weight", "float", 0, 1000, help="weight of a request continuation against a datastore one"),
    Option("context_max_matches", "int", 1, 10_000, help="request occurrences read per step"),
    Option("min_share", "float", 0, 1, help="drop nodes below this share of their parent's weight"),
    Option("scoring", "choice", choices=("acceptance", "count"),
           help="node ranking: the acceptance estimate or REST's raw counts"),
    Option("confidence", "float", 0, 1, help="acceptance scores: the per-token ceiling"),
    Option("prior", "float", 0, 1000, help="acceptance scores: shrinkage of datastore counts"),
    Option("context_prior", "float", 0, 1000, help="acceptance scores: shrinkage of request counts"),
    Option("spec_factor", "float", 0, 64,
           help="SuffixDecoding's sizing: at most this many nodes per matched token (0: off)"),
    Option("dynamic", "bool", help="size each step's tree by its calibrated value against the verify cost"),
    Option("calibration", "path", special=("none",), help="a calibration file, or 'none' for raw scores"),
)


def make(target: Target, datastore: str | None = None, budget: int | None = None, max_suffix: int = 16,
         min_suffix: int = 2, dynamic: bool | None = None, calibration: str | None = None,
         **options) -> RestDrafter:
    """A REST drafter for `target`.  datastore: a folder, "default" (the model's default store, built by the set-up
    for the embedded model) or "none" (request-only retrieval).  budget: max draft nodes per step (default: 64 on a
    GPU; on CPU 24 with dynamic sizing, else 16).  dynamic: size each step's tree by its calibrated value against the
    measured verification cost (default: on for CPU when the model has a calibration)."""
    if max_suffix < 1 or min_suffix < 1 or min_suffix > max_suffix:
        raise ValueError(f"need 1 <= min_suffix <= max_suffix (got {min_suffix}, {max_suffix})")
    store = None
    if not (isinstance(datastore, str) and datastore.lower() == "none"):
        path = _store_path(target, datastore)
        try:
            if path is None:
                if (reason := unavailable_reason(target)) is not None:
                    raise DrafterUnavailable(reason)
                path = default_dir(target.identity)
            store = open_store(path, target)
        except DatastoreError as exc:
            raise DrafterUnavailable(str(exc)) from exc
    dynamic, budget = default_sizing(target, "rest", dynamic, budget)  # budget.TREE_SIZES
    return RestDrafter(store=store, budget=int(budget), max_suffix=int(max_suffix), min_suffix=int(min_suffix),
                       dynamic=dynamic, calibration=Path(calibration) if calibration else None, **options)


KNOBS = (
    Knob("rest", "budget", "Tree budget", 0, 64, 0,
         "most draft nodes per step · 0 = device default (CPU: at most 24, sized per step; 16 without a calibration; "
         "GPU: 64)", zero_keeps_default=True),
    Knob("rest", "max_suffix", "Longest suffix looked up", 1, 32, 16, "tokens matched in the datastore"),
)
