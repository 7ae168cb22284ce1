"""SDSAT drafter: adaptive-token probes read by the ORIGINAL model plus a probe-only adapter; lossless by construction.

loop="fused" (default): every step's tree = the draft (from the previous step's probes) + a chain of k adaptive probe
    tokens hung under the root and under each node of the draft's main (top-1) path.  The engine verifies the draft
    with the original model's logits (the adapter touches probe rows only) and, in the same forward, the probe chain
    under the accepted node drafts the next k tokens.  When the accepted node has no chain (a side branch), the
    deepest accepted ancestor's chain is used, shifted.  One target forward per step.
loop="paper": the paper's two-forward loop (§2.1.1): a probe-only step ([root, a x k]: the root's logits give the next
    token exactly, the probes draft the k after it), then a draft-only verification step, alternating.

Drafts are trees built from the probes' ranked top-k (the paper's nucleus trees, §2.1.2): `branching` gives how many
candidates each depth keeps (e.g. "2,1,1,1"; every node at depth d gets the same top-b_d children, as in the
reference code).  The engine's position-keyed sampling verifies any tree exactly, so greedy and sampling are both
lossless.

prompt_lookup (NOT in the paper; formerly `lookup`): prompt lookup's continuation grafted next to the probes' drafts
(source "prompt"), scored by its matched n-gram's length and cut with the rest by the calibrated cost.  Device
defaults of the tree's shape: budget.TREE_SIZES.
"""
from __future__ import annotations

import json
import math
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from specdemo.budget import (calibrated_cost, curve_sizes, default_sizing, size_and_rate, tree_size,
                             verify_cost_curve)
from specdemo.drafters.contract import PROMPT, DrafterUnavailable, DraftSource, Knob, Option
from specdemo.drafters.pld import lookup_with_ngram_length
from specdemo.drafters.sdsat.adapter import (
    CONFIG_FILE,
    AdapterError,
    default_artifact_dir,
    load_adapter,
    mismatch,
    train_command,
)
from specdemo.drafters.sdsat.probe_cost import ProbePricing
from specdemo.engine import DecodeState, Drafter, Verified
from specdemo.sampling import SamplingConfig, draft_candidates
from specdemo.tree import DepthTally, DraftTree, TreeBuffers

ADAPTIVE = DraftSource("adaptive", "adaptive token", "#fed7aa", "#7c2d12")  # drafted by a probe of the last step
PROBE = DraftSource("probe", "probe", "#ddd6fe", "#4c1d95")  # an adaptive-token probe itself: never accepted
SOURCES = (ADAPTIVE, PROBE, PROMPT)


class SDSATDrafter(Drafter):
    name = "sdsat"

    def __init__(self, target, adapter, k: int = 4, loop: str = "fused", branching=None, chains: int = -1,
                 prompt_lookup: int = 0, shape: str = "uniform", dynamic: bool = False,
                 calibration: Path | None = None, couple: float = 1.0, skip_probe: bool = False):
        if loop not in ("fused", "paper"):
            raise ValueError(f"loop must be 'fused' or 'paper', got {loop!r}")
        if shape not in ("uniform", "main", "fan"):
            raise ValueError(f"shape must be 'uniform', 'main' or 'fan', got {shape!r}")
        # uniform: every depth-d node gets the top-b_d children; main: only the top-1 path does; fan: like main, and
        # a probe chain also hangs under every depth-1 candidate, so whichever is accepted drafts the next step
        self.shape = shape
        self.target, self.adapter, self.k, self.loop = target, adapter, int(k), loop
        if isinstance(branching, int):
            branching = [branching]
        if isinstance(branching, str):
            branching = [int(x) for x in branching.replace("x", ",").split(",") if x.strip()]
        self.branching = list(branching) if branching else [1] * self.k
        self.branching = (self.branching + [1] * self.k)[: self.k]
        self.prompt_lookup = int(prompt_lookup)  # > 0: also merge a prompt-lookup chain of this many tokens (make(): 6)
        self.chains = chains  # probe chains under at most this many main-path draft nodes (-1 = all)
        # dynamic: send, per step, the draft nodes that pay for their verification by their calibrated acceptance
        # probability (budget.best_size); a probe chain rides along with the node it hangs under
        self.dynamic, self.calibration_path = bool(dynamic), calibration
        self.calibrator, self.rel_cost = None, None
        # under sampling, the probes' candidates are drawn with the noise the target's tokens will be drawn with, from
        # their distribution sharpened by `couple` (sampling.draft_candidates); 0: their most probable tokens
        self.couple = float(couple)
        # skip_probe: a step may leave out the root's probe when it costs more than its drafts bring the next step,
        # both measured in the request (probe_cost.py); with dynamic sizing only
        self.skip_probe = bool(skip_probe)
        self.probe_pricing: ProbePricing | None = None
        self.masked_rows = target.device.type == "cuda"  # the graph-safe hooks (every row, probe rows from masks)
        self.reset_stats()
        self._pending: list[list[int]] | None = None
        self._pending_p: list[list[float]] | None = None  # the probes' probabilities of those candidates

    def reset_stats(self) -> None:
        self.stats = {"steps": 0, "forwards_with_draft": 0, "tree_nodes": 0}
        self.tally = DepthTally(self.k)  # over the steps that sent drafts

    # ------------------------------------------------------------------ engine interface
    def begin(self, state: DecodeState, prompt_hidden) -> None:
        self._pending = self._pending_p = None
        self.calibrator, self.rel_cost = calibrated_cost(state.target, "sdsat", state, self.dynamic,
                                                         self.calibration_path)
        t = state.target
        self.probe_pricing = ProbePricing(self.rel_cost, verify_cost_curve(t, curve_sizes(t))[0]) \
            if self.skip_probe and self.rel_cost is not None else None

    def propose(self, state: DecodeState) -> DraftTree:
        ranked = self._pending or []
        probs = self._pending_p or [[1.0] * len(c) for c in ranked]
        tokens, parents, sources, probe, raw = [], [], [], [], []
        main_path: list[int] = []  # node index of the top-1 path at each depth
        frontier = [-1]
        for d, cands in enumerate(ranked):
            b = self.branching[d] if d < len(self.branching) else 1
            nxt = []
            if self.shape in ("main", "fan") and d > 0:  # deeper candidates only under the top-1 path
                frontier = main_path[-1:] if len(main_path) == d else []
            for parent in frontier:
                for rank, tok in enumerate(cands[:b]):
                    tokens.append(tok)
                    parents.append(parent)
                    sources.append(ADAPTIVE.name)
                    probe.append(False)
                    raw.append(probs[d][rank] * (raw[parent] if parent >= 0 else 1.0))
                    if rank == 0 and (parent == -1 or (main_path and parent == main_path[-1])):
                        main_path.append(len(tokens) - 1)
                    nxt.append(len(tokens) - 1)
            frontier = nxt
        if self.prompt_lookup and (self.loop == "fused" or ranked):  # prompt lookup's chain as a trie branch
            ngram_length, chain = lookup_with_ngram_length(state.tokens, self.prompt_lookup)
            # raw score: the matched n-gram's length, which the calibration maps per depth to how often such a node
            # is right (a 3-gram match is right far more often than a 1-gram one)
            merged = DraftTree(tokens, parents, sources, probe, raw).graft(chain, PROMPT.name,
                                                                          score=float(ngram_length))
            tokens, parents, sources, probe, raw = merged.tokens, merged.parents, merged.sources, merged.probe, merged.scores
        if self.loop == "fused" or not ranked:
            origins = [-1] + (main_path if self.loop == "fused" else [])
            if self.chains >= 0:
                origins = origins[: self.chains + 1]
            if self.shape == "fan" and self.loop == "fused":
                origins += [i for i, p in enumerate(parents) if p == -1 and not probe[i] and i not in origins]
            for o in origins:
                parent = o
                for _ in range(self.k):
                    tokens.append(self.adapter.token_id)
                    parents.append(parent)
                    sources.append(PROBE.name)
                    probe.append(True)
                    raw.append(0.0)
                    parent = len(tokens) - 1
        self._pending = self._pending_p = None
        tree = DraftTree(tokens, parents, sources, probe, raw)
        if self.calibrator is not None:
            tree = self.calibrator.apply(tree)
        return self._cut(tree) if self.rel_cost is not None else tree

    def _cut(self, tree: DraftTree) -> DraftTree:
        """Keep the best-first draft nodes that pay for their verification; a probe chain stays with its origin (the
        root's chain too: it drafts the next step, unless `skip_probe` finds its rows cost more than that brings)."""
        chains = _chains(tree)
        order = tree.best_first()
        extra, kept = [], set()
        for n in range(len(order) + 1):
            if n:
                kept.add(order[n - 1])
            extra.append(sum(len(c) for o, c in chains.items() if o == -1 or o in kept))
        probs = [tree.scores[i] for i in order]
        root = len(chains.get(-1, ()))
        pricing = self.probe_pricing if root > 0 else None  # weigh this step with and without the root's probe
        n, rate = size_and_rate(probs, self.rel_cost, lambda m: extra[m], pricing.net_yield if pricing else 0.0,
                                pricing.overhead if pricing else 0.0)
        with_root = root > 0
        if pricing:
            n_alone, rate_alone = size_and_rate(probs, self.rel_cost, lambda m: extra[m] - root)
            if rate_alone > rate:
                n, with_root = n_alone, False
        keep = set(order[:n])
        keep |= {i for o, c in chains.items() if (o == -1 and with_root) or o in keep for i in c}
        if self.probe_pricing is not None:
            self.probe_pricing.sent(len(keep), with_root)
        return tree.subtree(sorted(keep))

    @property
    def graph_key(self) -> tuple | None:
        """On CUDA the adapter's hooks read the probe rows from static masks (`SDSATAdapter.active_at`), so the
        steps replay as CUDA graphs of their own (the adapter is in them); on a CPU the hooks touch only the probe
        rows, which change every step: no graph."""
        return ("sdsat", id(self.adapter)) if self.masked_rows else None

    @contextmanager
    def verify_context(self, tree: DraftTree, buffers: TreeBuffers):
        rows = [i + 1 for i in range(len(tree)) if tree.is_probe(i)]
        if self.masked_rows:
            with self.adapter.active_at(rows):
                yield
            return
        if not rows:
            yield
            return
        with self.adapter.active(torch.tensor(rows, dtype=torch.long)):
            yield

    def observe(self, state: DecodeState, verified: Verified) -> None:
        tree = verified.tree
        st = self.stats
        st["steps"] += 1
        st["tree_nodes"] += len(tree)
        depth = tree.depths()
        n_draft = sum(1 for i in range(len(tree)) if not tree.is_probe(i))
        acc = verified.accepted_nodes
        if self.probe_pricing is not None:
            drafted = [i for i in range(len(tree)) if tree.sources and tree.sources[i] == ADAPTIVE.name]
            self.probe_pricing.verified(len(verified.tokens), len(drafted), sum(i in acc for i in drafted))
        if n_draft:
            st["forwards_with_draft"] += 1
            self.tally.add(max(depth[i] for i in range(len(tree)) if not tree.is_probe(i)), len(acc))
        chains = _chains(tree)  # from the (possibly pruned) tree the engine verified
        if not chains:
            self._pending = self._pending_p = None
            return
        # the deepest accepted node (or the root) that carries a chain
        origin = -1
        for node in acc:
            if node in chains:
                origin = node
        if origin not in chains:
            self._pending = self._pending_p = None
            return
        a = len(acc)  # accepted drafts; the new root sits at depth a + 1
        o_depth = 0 if origin == -1 else depth[origin]
        idx = chains[origin]
        # probe j (1-based) of a chain at depth o_depth drafts depth o_depth + j + 1; keep those after the new root
        skip = a - o_depth
        use = idx[skip:]
        if not use:
            self._pending = self._pending_p = None
            return
        logits = self._probe_logits(verified, use)
        # candidate d guesses the token at depth d + 1 under the new root, i.e. at position len(tokens) + d
        sampling = state.sampling if self.couple > 0 else SamplingConfig()
        tokens, log_scores = draft_candidates(logits.float().log_softmax(-1), None,
                                              [len(state.tokens) + d for d in range(len(use))], sampling,
                                              logits.shape[-1], max(self.branching), sharpen=self.couple)
        self._pending, self._pending_p = tokens, [[math.exp(x) for x in row] for row in log_scores]

    def _probe_logits(self, verified: Verified, nodes: list[int]) -> torch.Tensor:
        """The probe rows' logits: the engine already computed them (row i + 1 = node i) in the same forward."""
        if verified.logits is not None:
            return verified.logits[[n + 1 for n in nodes]]
        return self.target.lm_head(torch.stack([verified.probe_hidden[n] for n in nodes]))



def _chains(tree: DraftTree) -> dict[int, list[int]]:
    """origin node (-1 = root) -> the probe chain hanging under it (node indices, shallow first)."""
    out: dict[int, list[int]] = {}
    probe_child: dict[int, int] = {}
    for i, p in enumerate(tree.parents):
        if tree.is_probe(i):
            if p >= 0 and tree.is_probe(p):
                probe_child.setdefault(p, i)
            else:
                out.setdefault(p, [i])
    for o, chain in out.items():
        while chain[-1] in probe_child:
            chain.append(probe_child[chain[-1]])
    return out


# The paper's published full fine-tunes and the adaptive token id their scripts repeat (ainergy-ml/SDSAT,
# start_greedy.sh: 32011).  They draft AND verify with themselves, so their output is the fine-tuned model's, not the
# original CodeLlama's: the race is still exact, but against the fine-tuned model's own AR decoding.
PUBLISHED = {"ainergy/CodeLlama-SDSAT_L5_7B": 32011, "ainergy/CodeLlama-SDSAT_L7_13B": 32011}
SELF_VERIFY_NOTE = ("This model was fine-tuned with adaptive tokens and verifies its own drafts: both panes show the "
                    "fine-tuned model's output, which differs from the original model's.")


class SelfAdapter:
    """No adapter: the target itself was fine-tuned with adaptive tokens (the paper's setting), so probe rows are
    plain forward rows of the adaptive token id."""

    def __init__(self, token_id: int):
        self.token_id = int(token_id)

    def active(self, rows=None):
        return nullcontext()

    def active_at(self, rows: list[int]):
        return nullcontext()


def self_verifying(target) -> bool:
    return target.name in PUBLISHED


OPTIONS = (
    Option("adapter", "path", help="a trained adapter: a folder or a hub id (default: the model's shipped one)"),
    Option("k", "int", 1, 16, help="adaptive tokens per probe chain (default: 1 on CPU, 4 on GPU)"),
    Option("loop", "choice", choices=("fused", "paper"), help="fused: one forward verifies and drafts; paper: two"),
    Option("branching", "counts", 1, 64, help="candidates kept per draft depth, e.g. 4,1"),
    Option("chains", "int", -1, 64, help="probe chains under at most this many draft nodes (-1 = all)"),
    Option("prompt_lookup", "int", 0, 64, help="also merge a prompt-lookup chain of this many tokens (0 = off)",
           aliases=("lookup",)),
    Option("shape", "choice", choices=("uniform", "main", "fan"), help="which draft nodes get children"),
    Option("model_verifies", "bool", help="a published SDSAT fine-tune that verifies its own drafts"),
    Option("token_id", "int", 0, 10_000_000, help="the adaptive token id of such a fine-tune"),
    Option("dynamic", "bool", help="send per step the draft nodes that pay for their verification"),
    Option("calibration", "path", special=("none",), help="a calibration file, or 'none' for raw scores"),
    Option("couple", "float", 0, 8, help="under sampling, draw candidates with the target's own noise from the probes' "
           "distribution sharpened by this factor (0 = off)"),
    Option("skip_probe", "bool", help="leave out the root's probe in a step where its row costs more than its drafts "
           "are expected to bring the next step (per-step sizing only; default: on on CPU)"),
)


def make(target, adapter=None, k: int | None = None, loop: str = "fused", branching=None, chains: int | None = None,
         prompt_lookup: int | None = None, shape: str | None = None, model_verifies: bool | None = None,
         token_id: int | None = None, dynamic: bool | None = None, calibration: str | None = None,
         couple: float = 1.0, skip_probe: bool | None = None) -> SDSATDrafter:
    """An SDSAT drafter for `target`; each tree-shape option left out takes the device default (budget.TREE_SIZES:
    k, chains, branching, shape, prompt_lookup, skip_probe)."""
    model_verifies = self_verifying(target) if model_verifies is None else bool(model_verifies)
    if model_verifies:
        token_id = PUBLISHED.get(target.name) if token_id is None else token_id
        if token_id is None or not 0 <= int(token_id) < int(target.lm_head.weight.shape[0]):
            raise ValueError(f"model_verifies=true needs token_id=<the adaptive token id the model was fine-tuned "
                             f"with> within its vocabulary (got {token_id}).")
        adapter = SelfAdapter(int(token_id))
    dflt = tree_size(target, "sdsat").shape
    k = int(dflt["k"] if k is None else k)
    branching = dflt["branching"] if branching is None else branching
    chains = int(dflt["chains"] if chains is None else chains)
    prompt_lookup = int(dflt["prompt_lookup"] if prompt_lookup is None else prompt_lookup)
    shape = shape or dflt["shape"]
    skip_probe = bool(dflt["skip_probe"] if skip_probe is None else skip_probe)
    spec = adapter or default_artifact_dir(target)
    if isinstance(spec, (str, Path)):
        try:
            key = ("sdsat-adapter", str(spec))  # loaded once per model and kept on it
            if key not in target.artifacts:
                target.artifacts[key] = load_adapter(spec, target)[0]
            ad = target.artifacts[key]
        except AdapterError as exc:
            if adapter is None and not default_artifact_dir(target).exists():
                raise DrafterUnavailable(f"No SDSAT adapter for {target.name}: create it with `{train_command(target)}`.")\
                    from exc
            raise DrafterUnavailable(f"{exc} Create one with `{train_command(target)}`.") from exc
    else:
        ad = spec  # an SDSATAdapter object (tests)
    dynamic, _ = default_sizing(target, "sdsat", dynamic)
    return SDSATDrafter(target, ad, k=k, loop=loop, branching=branching, chains=chains, prompt_lookup=prompt_lookup,
                        shape=shape, dynamic=dynamic, calibration=Path(calibration) if calibration else None,
                        couple=float(couple), skip_probe=bool(skip_probe))


def unavailable_reason(target) -> str | None:
    """Cheap: reads the default artifact's config only (no weights)."""
    if self_verifying(target):
        return None
    path = default_artifact_dir(target) / CONFIG_FILE
    if not path.exists():
        return f"No SDSAT adapter for {target.name}: create it with `{train_command(target)}`."
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"The SDSAT adapter config {path} is unreadable: rebuild it with `{train_command(target)}`."
    return mismatch(cfg, target, path.parent)


KNOBS = (
    Knob("sdsat", "k", "Adaptive tokens", 0, 8, 0, "adaptive tokens per probe chain · 0 = device default (1 on CPU, 4 "
         "on GPU)", zero_keeps_default=True),
)


def note(target) -> str | None:
    """A published SDSAT fine-tune verifies itself: say whose output the panes show."""
    return SELF_VERIFY_NOTE if self_verifying(target) else None
