"""The decoding loop: draft a tree, verify it with ONE target forward, accept the longest matching path, keep only
that path's KV entries, emit a StepEvent.  AR decoding is the same loop with an empty tree.

Invariant between steps: the KV cache holds every committed token except the newest one (the *root*), whose logits
are still to be computed.  A step feeds [root] + tree, so the root's logits choose the first new token and each
node's logits choose the token after it.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Iterator

import torch

from specdemo.kvcache import KVCache
from specdemo.sampling import SamplingConfig, choose_tokens
from specdemo.target import Target, UnsupportedForTree
from specdemo.tree import DraftTree, TreeBuffers


def tree_forward(target: Target, cache: KVCache, ids: list[int], buf: TreeBuffers) -> torch.Tensor:
    """One target forward over [root] + tree nodes; returns the final normed hidden states (n, d) of those positions."""
    past = cache.get_seq_length()
    mask = buf.attention_mask(past, target.dtype) if buf.n > 1 else None
    out = target.decoder(
        input_ids=torch.tensor([ids], device=target.device),
        attention_mask=mask,
        position_ids=buf.positions.unsqueeze(0),
        past_key_values=cache,
        use_cache=True,
    )
    return out.last_hidden_state[0]


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
    hidden: torch.Tensor  # (1 + len(accepted_nodes), d): target features of the root and the accepted nodes
    probe_hidden: dict[int, torch.Tensor]  # node index -> feature, for probe nodes
    logits: torch.Tensor | None = None  # (1 + len(tree), vocab): the target's logits of the root (row 0) and every node


class Drafter:
    """Proposes draft trees.  Subclasses override `propose` and, if they learn from the target, `begin`/`observe`.

    needs_hidden -- the engine passes the target's last hidden states of the prompt (to `begin`) and of every
                    accepted token (to `observe`), as S4C-style draft heads need.
    verify_context -- a context manager wrapped around the verification forward (SDSAT uses it to switch its
                    adapter on at probe positions only).
    """

    name = "none"
    needs_hidden = False

    def begin(self, state: DecodeState, prompt_hidden: torch.Tensor | None) -> None:
        pass

    def propose(self, state: DecodeState) -> DraftTree:
        return DraftTree.empty()

    def observe(self, state: DecodeState, verified: Verified) -> None:
        pass

    def verify_context(self, tree: DraftTree, buffers: TreeBuffers):
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
    max_tree_nodes: int = 64  # hard cap on what any drafter may send through one forward


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


@torch.no_grad()
def generate(target: Target, prompt_ids: list[int], drafter: Drafter | None = None,
             cfg: GenerationConfig | None = None) -> Iterator[StepEvent]:
    """Decode `prompt_ids` with `drafter` (None = AR), yielding one StepEvent per target forward.

    The caller may stop iterating after any step.  Output is token-identical to AR for greedy and, for sampling,
    identical for the same seed (see sampling.py).
    """
    cfg = cfg or GenerationConfig()
    validate_request(target, prompt_ids, cfg)
    drafter = drafter or Drafter()
    if drafter.name != "none":
        check_tree_support(target)
    state = DecodeState(list(prompt_ids), len(prompt_ids), cfg.max_new_tokens, cfg.sampling, target)
    cache = KVCache(capacity=len(prompt_ids) + cfg.max_new_tokens + cfg.max_tree_nodes + 2)

    with target.lock:
        # Prefill everything but the root; the drafter may want the prompt's features.
        t0 = time.perf_counter()
        prompt_hidden = None
        if len(prompt_ids) > 1:
            out = target.decoder(input_ids=torch.tensor([prompt_ids[:-1]], device=target.device),
                                 past_key_values=cache, use_cache=True)
            prompt_hidden = out.last_hidden_state[0]
        target.sync()
        prefill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        drafter.begin(state, prompt_hidden if drafter.needs_hidden else None)
        begin_s = time.perf_counter() - t0

    step = 0
    text_len = 0
    while True:
        with target.lock:
            t0 = time.perf_counter()
            tree = drafter.propose(state) if state.remaining > 1 else DraftTree.empty()
            # never verify drafts the length budget could not use: depth <= remaining - 1 (the target adds one)
            tree = tree.prune(max_depth=state.remaining - 1, max_nodes=cfg.max_tree_nodes)
            target.sync()
            draft_s = time.perf_counter() - t0 + (begin_s if step == 0 else 0.0)

            t0 = time.perf_counter()
            root_pos = len(state.tokens) - 1
            past = cache.get_seq_length()
            buf = TreeBuffers.build(tree, root_pos, target.device)
            with drafter.verify_context(tree, buf):
                hidden = tree_forward(target, cache, state.tokens[-1:] + tree.tokens, buf)
            logits = target.lm_head(hidden)
            # one target choice per tree position; position of the chosen token = position of the node + 1
            choice = choose_tokens(logits, [root_pos + 1 + d for d in buf.depth.tolist()], cfg.sampling)
            path, node = [], 0
            while (nxt := buf.children[node].get(choice[node])) is not None:
                path.append(nxt)
                node = nxt
            new = [tree.tokens[i - 1] for i in path] + [choice[node]]
            cache.keep(past + 1, [past + i for i in path])  # root stays at `past`; accepted nodes follow it
            target.sync()
            verify_s = time.perf_counter() - t0 + (prefill_s if step == 0 else 0.0)

        from_draft = [True] * len(path) + [False]
        sources = [tree.sources[i - 1] if tree.sources else "draft" for i in path] + [None]
        # EOS, stop strings and length: the same truncation in every mode
        finish = None
        for k, tok in enumerate(new):
            n_gen = len(state.tokens) - state.prompt_len + k + 1
            if tok in target.eos_ids:
                finish = "eos"
            elif cfg.stop_strings:
                text = target.decode(state.generated + new[: k + 1])
                if any(s in text[max(0, text_len - max(map(len, cfg.stop_strings))):] for s in cfg.stop_strings):
                    finish = "stop"
            if finish is None and n_gen >= cfg.max_new_tokens:
                finish = "length"
            if finish:
                new, from_draft, sources = new[: k + 1], from_draft[: k + 1], sources[: k + 1]
                break
        if cfg.stop_strings and finish is None:
            text_len = len(target.decode(state.generated + new))
        accepted_nodes = [i - 1 for i in path[: len(new)]]
        position = len(state.tokens)
        state.tokens.extend(new)
        if finish is None:
            t0 = time.perf_counter()
            probes = {i: hidden[i + 1] for i in range(len(tree)) if tree.is_probe(i)}
            drafter.observe(state, Verified(tree, buf, accepted_nodes, new, hidden[[0] + path], probes, logits))
            draft_s += time.perf_counter() - t0
        yield StepEvent(step, new, from_draft, sources, tree, accepted_nodes, draft_s, verify_s, position,
                        len(state.tokens) - state.prompt_len, finish)
        if finish:
            return
        step += 1


def run_to_end(target: Target, prompt_ids: list[int], drafter: Drafter | None = None,
               cfg: GenerationConfig | None = None) -> tuple[list[int], list[StepEvent]]:
    """Convenience: all generated tokens and all events."""
    events = list(generate(target, prompt_ids, drafter, cfg))
    return [t for e in events for t in e.tokens], events


def prefilled_cache(target: Target, ids: list[int], room: int) -> KVCache:
    """A fresh KV cache holding `ids` (the committed tokens before a root), with `room` more positions."""
    cache = KVCache(capacity=len(ids) + room)
    target.decoder(input_ids=torch.tensor([ids], device=target.device), past_key_values=cache, use_cache=True)
    return cache


def trial_forward(target: Target, cache: KVCache, root: int, tree: DraftTree) -> tuple[torch.Tensor, float]:
    """One verification over [root] + `tree` that leaves `cache` as it found it: the logits (1 + len(tree), vocab) and
    the seconds of what a step pays for them, the forward and the LM head over every row (synchronised).  The harness
    of cost measurements and model checks."""
    past = cache.get_seq_length()
    buf = TreeBuffers.build(tree, past, target.device)
    target.sync()
    t0 = time.perf_counter()
    logits = target.lm_head(tree_forward(target, cache, [root] + tree.tokens, buf))
    target.sync()
    seconds = time.perf_counter() - t0
    cache.keep(past, [])  # drop what this forward appended
    return logits, seconds


def check_tree_support(target: Target) -> None:
    """Prove on this model that a tree forward (4D mask + position ids) gives the logits of plain sequential forwards.

    Runs once per loaded model (a few ms on small models); raises UnsupportedForTree otherwise.
    """
    if target.tree_ok:
        return
    g = torch.Generator().manual_seed(0)
    vocab = min(target.model.config.vocab_size, 1000)
    ctx = torch.randint(10, vocab, (12,), generator=g).tolist()
    # root + two branches: [a, b] and [c]; each node must see only its ancestors
    tree = DraftTree(tokens=[ctx[5], ctx[6], ctx[7]], parents=[-1, 0, -1])
    try:
        with torch.no_grad():
            logits, _ = trial_forward(target, prefilled_cache(target, ctx[:-1], 8), ctx[-1], tree)
            got = logits.float()
            ref = []
            for seq in (ctx + [ctx[5], ctx[6]], ctx + [ctx[7]]):
                ref.append(target.model(input_ids=torch.tensor([seq], device=target.device)).logits[0].float())
            want = torch.stack([ref[0][-3], ref[0][-2], ref[0][-1], ref[1][-1]])
        err = (got - want).abs().max().item() / (want.abs().max().item() + 1e-6)
    except Exception as exc:
        raise UnsupportedForTree(
            f"Model '{target.name}' is unsupported for tree verification: its forward rejected a custom 4D attention "
            f"mask with explicit position ids ({type(exc).__name__}: {str(exc)[:200]}). Use plain AR decoding."
        ) from exc
    tol = 1e-3 if target.dtype == torch.float32 else 3e-2
    if err > tol:
        raise UnsupportedForTree(
            f"Model '{target.name}' is unsupported for tree verification: with a custom 4D attention mask its logits "
            f"differ from sequential decoding (relative error {err:.2e}). Use plain AR decoding."
        )
    target.tree_ok = True
