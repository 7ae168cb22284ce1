"""Verification with static shapes: every tensor of a step has a shape fixed per bucket, the groundwork for replaying
each bucket's forward as a CUDA graph (a graph replays fixed kernels on fixed memory, so nothing inside the captured
forward may depend on a Python value, allocate, or wait for the host).

* Buckets: a tree of n nodes is padded to the smallest bucket >= n (STATIC_BUCKETS counts tree nodes; 0 is the AR
  step, the root alone), so the forward sees bucket + 1 rows.
* Per bucket, one `StepInputs`, allocated on its first use and written in place every step: the input ids, the
  position ids, the additive 4D mask over the whole fixed-length cache, the cache slots the rows' KV entries go to,
  and the index tensors of the compaction that follows.  The forward reads only those and the cache.
* The KV cache has a fixed length (`KVCache(static=True)`): rows write at their slots, attention reads every slot, and
  the mask shows each real row the committed context, its ancestors and itself, nothing else.
* Dummy (padding) rows repeat the root token at the root's position and attend to themselves only, so their outputs
  are finite (a NaN would reach the real rows through a product with weight 0); no real row attends to them; they are
  never a child in the acceptance walk (`TreeBuffers.children` holds real nodes only), and the compaction moves only
  the accepted path, so their KV entries stay beyond the cache's length, masked, until later rows overwrite them.

Exactness.  Padding is bit-exact on the CPU: a real row's logits are the same bits whatever dummy rows follow it.  The
fixed-length attention is not bit-exact against the plain engine's: the CPU attention kernel accumulates over the key
length in blocks split by that length, so reading `capacity` keys (the extra ones at weight exactly 0) instead of
`past + n` reorders float sums.  Real rows' hidden states differ by ~1e-6 relative and the logits keep their argmax:
rounding of the kind plain decoding already lives with between a tree forward and a one-token forward, so the tokens
are exact where plain decoding's are (fp32).  tests/test_static_shapes.py checks both, every drafter's tokens, and
the accept lengths of every step that verified the same tree.  A drafter that drafts from the target's features (S4C, SDSAT) sees that rounding too, so a
near-tie among its candidates may rank differently and a later tree differ: the tokens stay the same.

Buckets: `GenerationConfig.static_buckets`, by default SPECDEMO_STATIC_BUCKETS when set (`configured_buckets`).

Default: `GenerationConfig.static_shapes` None means SPECDEMO_STATIC_SHAPES (1/0) when set, else on for CUDA and off
elsewhere.  A CPU has no graph to gain and pays for the fixed length (all `capacity` keys every step instead of the
committed ones, and the padded rows), so the CPU default stays the plain engine's path.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch

from specdemo.kvcache import KVCache
from specdemo.target import Target, decoder_features
from specdemo.tree import DraftTree, TreeBuffers

STATIC_BUCKETS: tuple[int, ...] = (0, 4, 8, 16, 32, 64)  # tree nodes; the forward sees one row more (the root)
CAPACITY_STEP = 256  # a pooled run's committed length, rounded up to this: requests of similar size share one
POOL_LIMIT = 8  # idle pooled steps kept per target
ENV = "SPECDEMO_STATIC_SHAPES"
BUCKETS_ENV = "SPECDEMO_STATIC_BUCKETS"


def wanted(flag: bool | None, device: torch.device) -> bool:
    """Whether a run asks for static shapes: the config's flag, else SPECDEMO_STATIC_SHAPES, else on CUDA only."""
    if flag is not None:
        return flag
    env = os.environ.get(ENV, "").strip()
    return env not in ("0", "false", "no") if env else device.type == "cuda"


def configured_buckets() -> tuple[int, ...]:
    """The buckets runs use: SPECDEMO_STATIC_BUCKETS (comma-separated node counts) when set, else STATIC_BUCKETS.

    One bucket without 0 (e.g. "16") sends every step, AR's included, through the same padded forward: a row then
    meets the same kernels whether it is an AR step's or a tree's, which makes a chain's rows bit-identical to the AR
    steps that compute the same tokens (docs/precision.md).  A side branch's ancestors are not where AR has them, so
    its rows still round differently.  It is the experiment for reduced precision on a GPU, where such rounding
    flips near-ties."""
    raw = os.environ.get(BUCKETS_ENV, "").strip()
    if not raw:
        return STATIC_BUCKETS
    try:
        buckets = tuple(sorted({int(b) for b in raw.split(",") if b.strip()}))
    except ValueError:
        buckets = ()
    if not buckets or min(buckets) < 0:
        raise ValueError(f"{BUCKETS_ENV} takes comma-separated node counts >= 0, e.g. 16 or 0,4,8,16 (got {raw!r})")
    return buckets


def buckets_for(max_nodes: int, buckets: Sequence[int] = STATIC_BUCKETS) -> tuple[int, ...]:
    """The buckets of a run whose trees have at most `max_nodes` nodes: those of `buckets` below max_nodes and
    max_nodes itself, so that every tree the engine lets through has a bucket.  Without 0 (the AR step alone) among
    `buckets`, a step with no draft is padded to the smallest bucket like any tree."""
    return tuple(sorted({max_nodes} | {b for b in buckets if b < max_nodes}))


@dataclass
class StepInputs:
    """One bucket's static tensors, allocated once and written in place every step: what a captured graph reads."""

    rows: int  # the root + the bucket's nodes
    ids: torch.Tensor  # (1, rows) input ids; dummies repeat the root
    positions: torch.Tensor  # (1, rows) position ids; dummies take the root's
    mask: torch.Tensor  # (1, 1, rows, capacity) additive, in the model's dtype
    slots: torch.Tensor  # (rows,) the cache slots the rows' KV entries are written to: past, past + 1, ...
    keep_src: torch.Tensor  # (rows,) compaction: the slots copied ...
    keep_dst: torch.Tensor  # (rows,) ... to these (distinct) slots
    allow: torch.Tensor  # (rows, rows) bool scratch: the padded tree mask
    base: torch.Tensor  # (rows,) 0, 1, ..., rows - 1

    @classmethod
    def allocate(cls, rows: int, capacity: int, dtype: torch.dtype, device: torch.device) -> "StepInputs":
        kw = dict(dtype=torch.long, device=device)
        return cls(rows, torch.zeros(1, rows, **kw), torch.zeros(1, rows, **kw),
                   torch.zeros(1, 1, rows, capacity, dtype=dtype, device=device), torch.zeros(rows, **kw),
                   torch.zeros(rows, **kw), torch.zeros(rows, **kw),
                   torch.zeros(rows, rows, dtype=torch.bool, device=device), torch.arange(rows, **kw))

    def fill(self, ids: list[int], tree: TreeBuffers, past: int) -> None:
        """Write one step's inputs: [root] + tree (`ids`, `tree` from TreeBuffers.build) after `past` committed
        entries (the root's position), padded with dummy rows.  Device ops and host-to-device copies only."""
        n = tree.n
        self.ids[0, :n].copy_(torch.tensor(ids, dtype=torch.long), non_blocking=True)
        self.ids[0, n:].fill_(ids[0])
        self.positions[0, :n].copy_(tree.positions)
        self.positions[0, n:].fill_(past)
        self.allow.zero_()
        self.allow.diagonal().fill_(True)  # a dummy sees itself only
        self.allow[:n, :n] = tree.mask
        grid = self.mask[0, 0]
        grid.fill_(torch.finfo(grid.dtype).min)
        grid[:n, :past] = 0  # real rows see the committed context
        grid[:, past : past + self.rows].masked_fill_(self.allow, 0)
        torch.add(self.base, past, out=self.slots)

    def compaction(self, start: int, src: list[int]) -> None:
        """Index tensors of the bucket's size moving slots `src` to start, start + 1, ...; the other destinations
        copy onto themselves (stale slots beyond the new length)."""
        torch.add(self.base, start, out=self.keep_dst)
        self.keep_src.copy_(self.keep_dst)
        if src:
            self.keep_src[: len(src)].copy_(torch.tensor(src, dtype=torch.long), non_blocking=True)


class StaticSteps:
    """One run's static-shape verification: its fixed-length KV cache and one StepInputs per bucket.

    committed_max -- the most entries the cache ever commits (prompt + max new tokens); the capacity adds the largest
    bucket's rows and the compaction's shift by one, every slot a step can touch.
    """

    def __init__(self, target: Target, committed_max: int, max_nodes: int,
                 buckets: Sequence[int] = STATIC_BUCKETS, layers: tuple[int, ...] = ()) -> None:
        self.target, self.layers = target, tuple(layers)  # layers: the drafter's declared features
        self.buckets = buckets_for(max_nodes, buckets)
        self.cache = KVCache(committed_max + self.buckets[-1] + 2, static=True, layers=target.n_layers)
        self.inputs: dict[int, StepInputs] = {}
        self._last: StepInputs | None = None
        self.pool_key: tuple = ()  # set by acquire_steps

    def reset(self) -> None:
        """Ready for a new request: an empty cache that appends (the prefill) until the first step's slots."""
        self.cache.write_to(None)
        self.cache.set_length(0)

    def step_inputs(self, nodes: int) -> StepInputs:
        """The buffers of the smallest bucket that holds `nodes` tree nodes, allocated on its first use."""
        bucket = next(b for b in self.buckets if b >= nodes)
        if bucket not in self.inputs:
            self.inputs[bucket] = StepInputs.allocate(bucket + 1, self.cache.capacity, self.target.dtype,
                                                      self.target.device)
        return self.inputs[bucket]

    def forward(self, ids: list[int], tree: TreeBuffers, past: int) -> torch.Tensor:
        """One verification forward over [root] + tree padded to its bucket: the final normed hidden states
        (rows, d), whose first tree.n rows are the real ones."""
        return self.run(self.prepare(ids, tree, past))

    def prepare(self, ids: list[int], tree: TreeBuffers, past: int) -> StepInputs:
        """Write a step's inputs into its bucket's buffers and point the cache at the rows' slots."""
        step = self._last = self.step_inputs(tree.n - 1)
        step.fill(ids, tree, past)
        self.cache.write_to(step.slots)
        return step

    def run(self, step: StepInputs) -> torch.Tensor:
        """The decoder over a prepared bucket: it reads only the bucket's buffers and the cache, so it is what a CUDA
        graph captures (cuda_graphs.py)."""
        out = self.target.step(input_ids=step.ids, attention_mask=step.mask, position_ids=step.positions,
                               past_key_values=self.cache, use_cache=True, output_hidden_states=bool(self.layers))
        return decoder_features(out, self.layers)

    def keep(self, start: int, src: list[int]) -> None:
        """After the last forward: keep the entries at slots `src` (increasing), moved to start..; drop the rest.
        Entries already in place (an AR step's; a chain accepted from its first node) move nothing: the copy would
        be two gathers and two scatters per layer, ~120 kernel launches on a GPU, for nothing."""
        if src == list(range(start, start + len(src))):
            self.cache.set_length(start + len(src))
            return
        step = self._last
        step.compaction(start, src)
        self.cache.move(step.keep_dst, step.keep_src, start + len(src))


def acquire_steps(target: Target, committed_max: int, max_nodes: int, buckets: Sequence[int],
                  layers: tuple[int, ...], graphs: object = None) -> "StaticSteps":
    """A run's static steps from a pool kept on the target, reset; `release_steps` gives them back at the run's end.

    Steps are pooled by their shapes (the committed length rounded up to CAPACITY_STEP, the buckets, the features), so
    a request reuses an earlier one's fixed-length cache and buffers and, unless `graphs` is None, its captured CUDA
    graphs: a capture costs three eager forwards per bucket, which a 128-token answer cannot pay every time.  `graphs`
    is the drafter's graph_key (engine.Drafter): drafters whose forwards differ never share graphs.  Runs interleaved
    by a race each hold their own steps (a pool hands an entry to one run at a time)."""
    from specdemo.cuda_graphs import GraphedSteps  # graphs wrap static steps; the pool serves both

    committed = -(-committed_max // CAPACITY_STEP) * CAPACITY_STEP
    key = (committed, max_nodes, tuple(buckets), tuple(layers), graphs)
    with target.lock:
        idle = idle_steps(target)
        at = next((i for i in range(len(idle) - 1, -1, -1) if idle[i][0] == key), None)
        steps = idle.pop(at)[1] if at is not None else None
    if steps is None:
        steps = StaticSteps(target, committed, max_nodes, buckets, layers)
        steps.pool_key = key
        if graphs is not None:
            steps = GraphedSteps(steps)
    steps.reset()
    return steps


def release_steps(target: Target, steps: "StaticSteps") -> None:
    """Back to the pool, for the next request of the same shapes; beyond POOL_LIMIT idle entries the one released
    longest ago goes (each holds a fixed-length cache: ~46 KB per slot on the embedded model).  Under ZeroGPU
    nothing is kept: a worker attaches the GPU per call, and memory kept from one call may be gone in the next."""
    if os.environ.get("SPACES_ZERO_GPU"):
        return
    with target.lock:
        idle = idle_steps(target)
        idle.append((steps.pool_key, steps))
        del idle[: max(0, len(idle) - POOL_LIMIT)]


def idle_steps(target: Target) -> list[tuple[tuple, "StaticSteps"]]:
    """The target's pool: (shape key, steps) not held by a run, the most recently released last."""
    return target.artifacts.setdefault("static steps", [])


def static_trial(target: Target, ctx: list[int], tree: DraftTree) -> torch.Tensor:
    """Logits (1 + len(tree), vocab) of one static-shape verification of [ctx[-1]] + tree after ctx[:-1], padded by a
    dummy row, with random entries of the cache's own scale in every free slot: `verify.check_tree_support` compares
    them with sequential forwards to prove that the model honours the padded mask (no real row sees a dummy or a
    stale slot)."""
    steps = StaticSteps(target, len(ctx), len(tree) + 1, buckets=())
    past = len(ctx) - 1
    if past:
        target.decoder(input_ids=torch.tensor([ctx[:-1]], device=target.device), past_key_values=steps.cache,
                       use_cache=True)
    g = torch.Generator().manual_seed(1)
    for layer in steps.cache.layers:
        for buf in (layer._k, layer._v):
            free = buf[:, :, past:]
            free.copy_(torch.randn(free.shape, generator=g) * buf[:, :, :past].float().std().item())
    buf = TreeBuffers.build(tree, past, target.device)
    return target.lm_head(steps.forward([ctx[-1]] + tree.tokens, buf, past)[: buf.n])
