"""The decoding loop: draft a tree, verify it with ONE target forward, accept the longest matching path, keep only
that path's KV entries, emit a StepEvent.  AR decoding is the same loop with an empty tree.

Invariant between steps: the KV cache holds every committed token except the newest one (the *root*), whose logits
are still to be computed.  A step feeds [root] + tree, so the root's logits choose the first new token and each
node's logits choose the token after it.

`generate` reads as its verbs: prefill, then per step propose (the drafter's tree, pruned to what the length budget
can use), verify (one forward, one target choice per node, the accepted path, the cache compacted to it), stop (EOS,
stop strings and length cut the new tokens), commit (they join the sequence) and, unless a stop rule ended the run,
observe (the drafter learns from the verification).

Timing: a StepEvent's draft_s covers propose and observe (and, on the first step, the drafter's `begin`), its
verify_s covers verify (and, on the first step, the prefill).  Propose, verify and the prefill end with
`target.sync()`, so on a GPU their clocks time the work and not only its launch.
"""
from __future__ import annotations

import itertools
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Iterator

import torch

from specdemo import cuda_graphs
from specdemo.kvcache import KVCache
from specdemo.sampling import SamplingConfig, choose_tokens, top2_gaps
from specdemo.static_step import StaticSteps, acquire_steps, configured_buckets, release_steps, wanted
from specdemo.target import Target, UnsupportedForTree, decoder_features
from specdemo.tree import DraftTree, TreeBuffers
from specdemo.verify import check_tree_support, tree_forward


@dataclass
class DecodeState:
    """What a drafter may read: the committed sequence and the settings of this request."""

    tokens: list[int]  # prompt + generated so far; tokens[-1] is the root of the next tree
    prompt_len: int
    max_new_tokens: int
    sampling: SamplingConfig
    target: Target

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - (len(self.tokens) - self.prompt_len)


@dataclass
class Verified:
    """What one verification forward found; handed to the drafter's `observe`."""

    tree: DraftTree
    buffers: TreeBuffers
    accepted_nodes: list[int]  # tree node indices (0-based, root excluded) on the accepted path
    tokens: list[int]  # committed this step: accepted draft tokens + the target's own token
    hidden: torch.Tensor  # (1 + len(accepted_nodes), d): target features of the root and the accepted nodes (wider
    # with the drafter's feature_layers)
    probe_hidden: dict[int, torch.Tensor]  # node index -> feature, for probe nodes
    logits: torch.Tensor | None = None  # (1 + len(tree), vocab): the target's logits of the root (row 0) and every node


class Drafter:
    """Proposes draft trees.  Subclasses override `propose` and, if they learn from the target, `begin`/`observe`.

    needs_hidden -- the engine passes the target's last hidden states of the prompt (to `begin`) and of every
                    accepted token (to `observe`), as S4C-style draft heads need.
    feature_layers -- decoder layers (hidden-state indices: 1 = after the first layer) whose states the drafter also
                    wants: what it is handed is then those layers' states and the last ones side by side,
                    (rows, (len + 1) * d), the last hidden states last (target.decoder_features).
    verify_context -- a context manager wrapped around the verification forward (SDSAT uses it to switch its
                    adapter on at probe positions only).
    graph_key -- what its verification forward is, for CUDA graphs (a graph replays the kernels of its capture,
                    hooks included): "" the plain forward (graphs shared with every plain drafter), another value a
                    forward of its own (graphs of its own), None a forward that changes per step (no graphs).
    """

    name = "none"
    needs_hidden = False
    feature_layers: tuple[int, ...] = ()
    graph_key: object = ""

    def begin(self, state: DecodeState, prompt_hidden: torch.Tensor | None) -> None:
        pass

    def propose(self, state: DecodeState) -> DraftTree:
        return DraftTree.empty()

    def observe(self, state: DecodeState, verified: Verified) -> None:
        pass

    def verify_context(self, tree: DraftTree, buffers: TreeBuffers) -> AbstractContextManager:
        return nullcontext()


@dataclass
class StepEvent:
    """One verification step, as the UI and the benchmark see it."""

    step: int
    tokens: list[int]  # committed this step (after EOS / stop / length truncation)
    from_draft: list[bool]  # per committed token: True = an accepted draft token, False = the target's own
    sources: list[str | None]  # per committed token: where its draft came from (None for the target's own)
    tree: DraftTree  # what was proposed (pruned to the remaining budget)
    accepted_nodes: list[int]  # node indices of the accepted path
    draft_s: float
    verify_s: float
    position: int  # absolute position of tokens[0]
    new_tokens: int  # total generated so far, after this step
    finish_reason: str | None = None  # "eos" | "stop" | "length" | None
    # per committed token: the target's top-2 logit gap where it chose it (how near a tie that choice was)
    margins: list[float] = field(default_factory=list)
    prefill_s: float = 0.0  # the part of verify_s that is the prompt's prefill (the first step only)

    @property
    def accepted(self) -> int:
        return len(self.accepted_nodes)

    @property
    def tree_size(self) -> int:
        return len(self.tree)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop_strings: list[str] = field(default_factory=list)
    # The engine's own ceiling on the nodes of one verification forward, whatever a drafter proposes; it also sizes
    # the KV cache's headroom for a step's uncommitted nodes.  Drafters choose their trees far below it on a CPU.
    max_tree_nodes: int = 64
    # Static shapes, what CUDA graphs need (static_step.py); None: SPECDEMO_STATIC_SHAPES, else on for CUDA only.
    static_shapes: bool | None = None
    static_buckets: tuple[int, ...] = field(default_factory=configured_buckets)  # without 0: AR steps padded too
    # With static shapes on CUDA: replay each bucket's forward as a CUDA graph (cuda_graphs.py); None:
    # SPECDEMO_CUDA_GRAPHS when set, else on (off under ZeroGPU).
    cuda_graphs: bool | None = None


def validate_request(target: Target, prompt_ids: list[int], cfg: GenerationConfig) -> None:
    if not prompt_ids:
        raise ValueError("The prompt is empty: type something to continue.")
    if cfg.max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive (got {cfg.max_new_tokens}).")
    limit = target.max_positions
    if len(prompt_ids) + cfg.max_new_tokens + 1 > limit:
        raise ValueError(
            f"The prompt is {len(prompt_ids)} tokens and {cfg.max_new_tokens} new tokens were asked for: together "
            f"more than the model's context of {limit} tokens. Shorten the prompt or lower max new tokens."
        )
    cfg.sampling.validate()


@torch.inference_mode()
def generate(target: Target, prompt_ids: list[int], drafter: Drafter | None = None,
             cfg: GenerationConfig | None = None) -> Iterator[StepEvent]:
    """Decode `prompt_ids` with `drafter` (None = AR), yielding one StepEvent per target forward.

    The caller may stop iterating after any step.  Output is token-identical to AR for greedy and, for sampling,
    identical for the same seed (see sampling.py).

    Inference mode, not only no-grad: a decoding step is hundreds of small operations, and without version counters
    and autograd bookkeeping each dispatches faster (docs/architecture.md, "Inference mode").  Tensors made here are
    inference tensors: what outlives a request and is changed in place later (pooled static steps, packed weights)
    is made or changed in inference mode too.
    """
    cfg = cfg or GenerationConfig()
    validate_request(target, prompt_ids, cfg)
    drafter = drafter or Drafter()
    run = _prefill(target, prompt_ids, drafter, cfg, _static_shapes(target, drafter, cfg))
    try:
        yield from _decode(target, drafter, cfg, run)
    finally:  # also when the caller stops early: the steps go back to their pool
        if run.static is not None:
            release_steps(target, run.static)


def _decode(target: Target, drafter: Drafter, cfg: GenerationConfig, run: "_Run") -> Iterator[StepEvent]:
    """generate's loop: propose, verify, commit, observe, until a stop rule ends the run."""
    stop = _StopRules(target, cfg)
    for step in itertools.count():
        with target.lock:
            tree, draft_s = _propose(target, drafter, run.state, cfg)
            found, verify_s = _verify(target, drafter, run, tree)
        prefill_s = 0.0
        if step == 0:  # the first step carries the one-off work: the drafter's begin and the prefill
            prefill_s = run.prefill_s
            draft_s, verify_s = draft_s + run.begin_s, verify_s + prefill_s
        keep, finish = stop.cut(run.state, found.tokens)
        event = _commit(run.state, found, keep, finish, step, draft_s, verify_s, prefill_s)
        if not event.finished:
            event.draft_s += _observe(drafter, run.state, found)
        yield event
        if event.finished:
            return


@dataclass
class _Run:
    """One request's decoding: the committed sequence, its KV cache and the one-off seconds its first step reports."""

    state: DecodeState
    cache: KVCache
    prefill_s: float
    begin_s: float
    static: StaticSteps | cuda_graphs.GraphedSteps | None = None  # static-shape verification, None: plain path


@dataclass
class _Found:
    """What one verification found, before the stop rules: the accepted path and the committed tokens."""

    tree: DraftTree
    buffers: TreeBuffers
    path: list[int]  # buffer rows (1-based tree nodes) of the accepted path
    tokens: list[int]  # the accepted draft tokens + the target's own token
    margins: list[float]  # per token of `tokens`: the target's top-2 logit gap at the row that chose it
    hidden: torch.Tensor  # (1 + len(tree), d): the target's features of the root and every node
    logits: torch.Tensor  # (1 + len(tree), vocab)


def _static_shapes(target: Target, drafter: Drafter, cfg: GenerationConfig) -> bool:
    """Whether this run verifies with static shapes, after the self-checks it needs (AR's too: it then reads the cache
    through the mask); a model failing the padded check falls back to the plain path unless the config asks for it."""
    static = wanted(cfg.static_shapes, target.device)
    try:
        if static or drafter.name != "none":
            check_tree_support(target, static)
        return static
    except UnsupportedForTree:
        if cfg.static_shapes is not None or not static:
            raise
    return _static_shapes(target, drafter, replace(cfg, static_shapes=False))


def _prefill(target: Target, prompt_ids: list[int], drafter: Drafter, cfg: GenerationConfig, static: bool) -> _Run:
    """Prefill everything but the root (the invariant), then let the drafter begin; it may want the prompt's
    features."""
    state = DecodeState(list(prompt_ids), len(prompt_ids), cfg.max_new_tokens, cfg.sampling, target)
    layers = tuple(drafter.feature_layers)
    graphs = drafter.graph_key if cuda_graphs.wanted(cfg.cuda_graphs, target.device) else None
    steps = acquire_steps(target, len(prompt_ids) + cfg.max_new_tokens, cfg.max_tree_nodes, cfg.static_buckets,
                          layers, graphs) if static else None
    cache = steps.cache if steps else KVCache(capacity=len(prompt_ids) + cfg.max_new_tokens + cfg.max_tree_nodes + 2,
                                              layers=target.n_layers)
    with target.lock:
        t0 = time.perf_counter()
        prompt_hidden = None
        if len(prompt_ids) > 1:
            out = target.prefill(torch.tensor([prompt_ids[:-1]], device=target.device), cache, bool(layers))
            prompt_hidden = decoder_features(out, layers)
        target.sync()
        prefill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        drafter.begin(state, prompt_hidden if drafter.needs_hidden else None)
        begin_s = time.perf_counter() - t0
    return _Run(state, cache, prefill_s, begin_s, steps)


def _propose(target: Target, drafter: Drafter, state: DecodeState, cfg: GenerationConfig) -> tuple[DraftTree, float]:
    """The drafter's tree for this step and the seconds it took.  A tree is never deeper than the length budget can
    use (depth <= remaining - 1: the target adds one token of its own) nor larger than `cfg.max_tree_nodes` or than
    the target's linears verify row for row (`Target.tree_rows`)."""
    t0 = time.perf_counter()
    tree = drafter.propose(state) if state.remaining > 1 else DraftTree.empty()
    max_nodes = cfg.max_tree_nodes if target.tree_rows is None else min(cfg.max_tree_nodes, target.tree_rows - 1)
    tree = tree.prune(max_depth=state.remaining - 1, max_nodes=max_nodes)
    target.sync()
    return tree, time.perf_counter() - t0


def _verify(target: Target, drafter: Drafter, run: _Run, tree: DraftTree) -> tuple[_Found, float]:
    """One target forward over [root] + tree, the target's choice at every position, the longest path of the tree
    that spells those choices, and the cache compacted to the root and that path; with the seconds it took."""
    state, cache = run.state, run.cache
    t0 = time.perf_counter()
    root_pos = len(state.tokens) - 1
    past = cache.get_seq_length()
    buf = TreeBuffers.build(tree, root_pos, target.device)
    ids = state.tokens[-1:] + tree.tokens
    with drafter.verify_context(tree, buf):
        hidden = run.static.forward(ids, buf, past)[: buf.n] if run.static else \
            tree_forward(target, cache, ids, buf, tuple(drafter.feature_layers))
    logits = target.lm_head(hidden[:, -target.model.config.hidden_size:])  # the last hidden states
    # one target choice per tree position; the position of the chosen token is the node's position + 1
    choice = choose_tokens(logits, [root_pos + 1 + d for d in buf.depth.tolist()], state.sampling)
    path, node = [], 0
    while (nxt := buf.children[node].get(choice[node])) is not None:
        path.append(nxt)
        node = nxt
    new = [tree.tokens[i - 1] for i in path] + [choice[node]]
    margins = top2_gaps(logits, [0] + path)  # token k was chosen at the root (k = 0) or at path node k - 1
    (run.static or cache).keep(past + 1, [past + i for i in path])  # the root stays at `past`; the path follows it
    target.sync()
    return _Found(tree, buf, path, new, margins, hidden, logits), time.perf_counter() - t0


class _StopRules:
    """EOS, stop strings and length: the same truncation in every mode, so a drafted run ends where AR's does."""

    def __init__(self, target: Target, cfg: GenerationConfig) -> None:
        self.target, self.cfg = target, cfg
        self.text_len = 0  # characters of the generated text before this step (stop strings only)

    def cut(self, state: DecodeState, new: list[int]) -> tuple[int, str | None]:
        """How many of this step's `new` tokens to commit, and the finish reason (None: the run goes on).  A stop
        string is looked for only where it could end in this step's text (it may begin in the previous step's)."""
        cfg = self.cfg
        for k, tok in enumerate(new):
            finish = None
            if tok in self.target.eos_ids:
                finish = "eos"
            elif cfg.stop_strings:
                text = self.target.decode(state.generated + new[: k + 1])
                tail = text[max(0, self.text_len - max(map(len, cfg.stop_strings))):]
                if any(s in tail for s in cfg.stop_strings):
                    finish = "stop"
            if finish is None and len(state.tokens) - state.prompt_len + k + 1 >= cfg.max_new_tokens:
                finish = "length"
            if finish:
                return k + 1, finish
        if cfg.stop_strings:
            self.text_len = len(self.target.decode(state.generated + new))
        return len(new), None


def _commit(state: DecodeState, found: _Found, keep: int, finish: str | None, step: int, draft_s: float,
            verify_s: float, prefill_s: float) -> StepEvent:
    """The first `keep` new tokens (what the stop rules let through) join the sequence; the step's event describes
    them."""
    tree, path = found.tree, found.path
    new = found.tokens[:keep]
    from_draft = ([True] * len(path) + [False])[:keep]
    sources = ([tree.sources[i - 1] if tree.sources else "draft" for i in path] + [None])[:keep]
    position = len(state.tokens)
    state.tokens.extend(new)
    return StepEvent(step, new, from_draft, sources, tree, [i - 1 for i in path[:keep]], draft_s, verify_s, position,
                     len(state.tokens) - state.prompt_len, finish, found.margins[:keep], prefill_s)


def _observe(drafter: Drafter, state: DecodeState, found: _Found) -> float:
    """Show the drafter what the verification found (the whole step was committed); returns the seconds it took."""
    t0 = time.perf_counter()
    tree, hidden = found.tree, found.hidden
    probes = {i: hidden[i + 1] for i in range(len(tree)) if tree.is_probe(i)}
    accepted = [i - 1 for i in found.path]
    drafter.observe(state, Verified(tree, found.buffers, accepted, found.tokens, hidden[[0] + found.path], probes,
                                    found.logits))
    return time.perf_counter() - t0


def run_to_end(target: Target, prompt_ids: list[int], drafter: Drafter | None = None,
               cfg: GenerationConfig | None = None) -> tuple[list[int], list[StepEvent]]:
    """Convenience: all generated tokens and all events."""
    events = list(generate(target, prompt_ids, drafter, cfg))
    return [t for e in events for t in e.tokens], events
