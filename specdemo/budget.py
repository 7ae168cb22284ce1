"""How many draft nodes a verification forward can afford: measured, once per loaded model and device.

On a GPU a forward over 64 tokens costs about what one token costs (memory bound), so tree drafters use the paper's
64 nodes there.  On a CPU the cost grows with the tree (on the 2-core dev machine, with the packed linears of
cpu_linear.py, 2-5 nodes cost about one 1-token step, 10 nodes ~1.15x, 16 nodes ~1.4x), so a drafter must pick its
tree size from the measured curve, or it ends up slower than AR.

    verify_cost_curve(target, sizes)  -> {draft nodes: seconds of one verification, forward + LM head}  (0 = AR)
    relative_cost(curve)              -> the same, divided by the AR step
    pick_budget(target, expected_tau_by_size) -> the node budget with the best expected tokens per unit of cost
    cost_at(rel, n)                   -> relative cost of an n-node tree, interpolated
    best_size(probs, rel)             -> how many nodes of a best-first order pay for their verification
    size_and_rate(probs, rel, ...)    -> the same n and its expected tokens per unit of cost
    cut_to_cost(tree, rel)            -> a scored tree cut to that many nodes (EAGLE-2-style dynamic size, per step)
    TREE_SIZES, default_sizing(target, method, dynamic, budget) -> every tree drafter's default size per device
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from specdemo.calibration import available as calibration_available
from specdemo.calibration import load as load_calibration
from specdemo.verify import prefilled_cache, trial_forward
from specdemo.tree import DraftTree

GPU_BUDGET = 64  # REST's paper budget; on a GPU a 64-node verification costs about a 1-token step
DEFAULT_SIZES = (0, 1, 2, 4, 8, 16, 32)  # larger trees: extrapolated (cost_at); never worth it on CPU
CURVE_SIZES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # the curve per-step tree sizing reads (cut_to_cost)
INT4_CURVE_SIZES = tuple(range(17)) + (24, 32)  # the same at int4: every size a CPU tree takes (curve_sizes)


@dataclass(frozen=True)
class TreeSize:
    """A drafter's default tree size on one kind of device.  Each field is the default of the `make` option that
    the drafter leaves unset (None: the drafter has no such option)."""

    budget: int | None = None  # nodes per step of a fixed-size tree (per-step sizing off, or no calibration)
    dynamic_cap: int | None = None  # the budget when each step sizes its own tree: only a cap (cut_to_cost decides)
    shape: dict = field(default_factory=dict)  # further `make` defaults that set the tree's size (SDSAT: k, chains...)


# The one table of tree-size defaults, by drafter and device ("cpu", or "gpu" for any accelerator).
#   REST, CPU: a fixed 16-node tree costs ~1.4x an AR step on the 2-core dev machine; sized per step, 24 is the cap.
#   S4C, CPU: 11 -- a verification of 12 rows (root + 11) sits in a cheap spot of the measured cost curve (row counts
#     3, 7, 11, 15 are slow kernel cases), and 11 nodes keep most of the tau of 15 at less cost (docs/s4c.md,
#     docs/benchmarks.md); sized per step, the cap of 16 holds the whole s4c tree.  GPU: 15, extra nodes almost free.
#   SDSAT, CPU: one adaptive token (k=1): 2 candidates at depth 1 and one probe row, under the root only, beside
#     prompt lookup's graft.  On the Spec-Bench tune half (24 prompts, 64 tokens, docs/sdsat.md) k=1 beat k=2 (whose
#     depth-2 draft is right a third of the time, and whose probe rows every step pays) at every precision, and this
#     shape beat 4 candidates with a second probe row under the top-1: fp32 1.38x -> 1.40x, bf16 1.20/1.23x ->
#     1.26x, int4 0.84x -> 0.88x (a tree row costs more at bf16 and int4).  GPU: nodes are nearly free, k chains
#     everywhere.  prompt_lookup (NOT in the paper): prompt lookup's continuation of up to 6
#     tokens grafted next to the probes' drafts; on 10 ShareGPT tuning prompts (docs/sdsat.md) it lifted tau
#     1.54 -> 1.67 and 1.20x -> 1.32x; 4 and 10 tokens did the same within noise.  skip_probe: a step leaves the
#     root's probe out where its row costs more than its drafts bring the next step (int4: 0.82-0.85x -> 0.88-0.90x
#     AR on the tune half; fp32 and bf16, where a row is cheap, unchanged).
TREE_SIZES: dict[str, dict[str, TreeSize]] = {
    "rest": {"cpu": TreeSize(budget=16, dynamic_cap=24), "gpu": TreeSize(budget=GPU_BUDGET, dynamic_cap=GPU_BUDGET)},
    "s4c": {"cpu": TreeSize(budget=11, dynamic_cap=16), "gpu": TreeSize(budget=15, dynamic_cap=15)},
    "sdsat": {"cpu": TreeSize(shape={"k": 1, "chains": 0, "branching": "2,1", "shape": "main", "prompt_lookup": 6,
                                     "skip_probe": True}),
              "gpu": TreeSize(shape={"k": 4, "chains": -1, "branching": None, "shape": "uniform", "prompt_lookup": 6,
                                     "skip_probe": False})},
}


def device_kind(target) -> str:
    """The tree-size table's device key: "cpu", or "gpu" for any accelerator."""
    return "cpu" if target.device.type == "cpu" else "gpu"


def tree_size(target, method: str) -> TreeSize:
    """`method`'s default tree size on `target`'s device."""
    return TREE_SIZES[method][device_kind(target)]


def default_sizing(target, method: str, dynamic: bool | None, budget=None) -> tuple[bool, object]:
    """(dynamic, budget) with what the caller left unset (None) filled in.  Per-step sizing is on where
    verification cost grows with the tree (CPU) and the model ships a calibration for `method` (raw scores are not
    probabilities to weigh against the cost); the budget is then the table's cap, else its fixed size."""
    if dynamic is None:
        dynamic = device_kind(target) == "cpu" and calibration_available(target, method)
    if budget is None:
        size = tree_size(target, method)
        budget = size.dynamic_cap if dynamic else size.budget
    return dynamic, budget


_lock = threading.Lock()
CURVES = "verify_cost_curves"  # the key of {sizes: curve} in Target.artifacts


@torch.inference_mode()  # the mode generate runs in: the curve prices its steps
def verify_cost_curve(target, sizes=DEFAULT_SIZES, repeats: int = 5, context: int = 256) -> dict[int, float]:
    """Fastest of `repeats` timings of one verification (`verify.trial_forward`: the forward over root + a chain of n
    draft nodes and the LM head over all of those rows, whose cost grows with n as well) for each n in `sizes`, after
    `context` committed tokens.  Measured once per loaded model and kept on it (or pinned
    by `pin_cost_curves`); sizes are interleaved across repeats and the minimum is kept, so a busy spell (which only
    ever adds time) does not distort the curve."""
    sizes = tuple(sorted(set(int(s) for s in sizes) | {0}))
    curves = target.artifacts.setdefault(CURVES, {})
    with _lock:
        if sizes in curves:
            return dict(curves[sizes])
        for have, curve in curves.items():  # a curve measured over more sizes serves any part of it
            if set(sizes) <= set(have):
                return {s: curve[s] for s in sizes}
        g = torch.Generator().manual_seed(0)
        vocab = min(int(target.model.config.vocab_size), 30000)
        ids = torch.randint(100, vocab, (context + max(sizes) + 1,), generator=g).tolist()
        times: dict[int, list[float]] = {s: [] for s in sizes}
        with target.lock, trial_cache(target, ids[: context - 1], max(sizes)) as (cache, steps):
            for rep in range(repeats + 1):  # the first pass warms up kernels and is not counted
                for s in sizes:
                    tree = DraftTree.chain(ids[context : context + s])
                    _, seconds = trial_forward(target, cache, ids[context - 1], tree, steps)
                    if rep:
                        times[s].append(seconds)
        curve = {s: min(v) for s, v in times.items()}
        curves[sizes] = curve
        return dict(curve)


@contextmanager
def trial_cache(target, context: list[int], max_nodes: int):
    """(cache, steps) prefilled with `context` for `verify.trial_forward`, verifying the way this device's runs do:
    through pooled static steps (CUDA graphs on a GPU) where runs take them, given back after, else the plain forward
    (steps None).  A launch-bound GPU's eager curve is flat where its graphed one is not."""
    from specdemo import cuda_graphs, static_step

    if not static_step.wanted(None, target.device):
        yield prefilled_cache(target, context, max_nodes + 2), None
        return
    graphs = "" if cuda_graphs.wanted(None, target.device) else None
    steps = static_step.acquire_steps(target, len(context) + max_nodes + 2, max_nodes,
                                      static_step.configured_buckets(), (), graphs)
    try:
        target.decoder(input_ids=torch.tensor([context], device=target.device), past_key_values=steps.cache,
                       use_cache=True)
        yield steps.cache, steps
    finally:
        static_step.release_steps(target, steps)


def curve_sizes(target) -> tuple[int, ...]:
    """The sizes of the curve `target`'s trees are sized by.  At int4 every size up to 16: torch's int4 kernel
    computes rows in blocks of 4, so the cost is a staircase (1-3 drafts cost alike, then 4-7, 8-11) that a line
    between sparse sizes misprices, 7 drafts by ~10%.  Elsewhere the curve is near-linear between the sparse sizes,
    and each extra point brings its own timing noise, which the non-decreasing envelope (`relative_cost`) turns into
    cost for every larger tree (docs/dynamic-trees.md)."""
    return INT4_CURVE_SIZES if getattr(target, "precision", "fp32") == "int4" else CURVE_SIZES


def measure_cost_curves(target) -> None:
    """Measure the one curve every drafter reads a part of (`curve_sizes` holds each size set they ask for), once per
    loaded model, so that no request pays for it: the app calls this when it loads a model, the bench before its
    first run.  A few seconds on the 2-core CPU."""
    verify_cost_curve(target, curve_sizes(target))


def cost_curves(target) -> dict[str, dict[str, float]]:
    """The curves measured (or pinned) on `target` so far, as JSON: {"0,1,2": {"0": seconds, ...}}."""
    return {",".join(map(str, sizes)): {str(s): t for s, t in curve.items()}
            for sizes, curve in target.artifacts.get(CURVES, {}).items()}


def pin_cost_curves(target, saved: dict[str, dict[str, float]]) -> None:
    """Use curves saved by `cost_curves` instead of measuring: the tree sizes drafters pick depend on the curve,
    so replaying a run's curves replays its accept lengths exactly (greedy), whatever the machine's timing noise."""
    wanted = curve_sizes(target)
    if not any(set(wanted) <= {int(s) for s in sizes.split(",")} for sizes in saved):
        raise ValueError(f"the saved cost curves cover the sizes {' and '.join(saved)}; this model's trees are sized "
                         f"by a curve over {','.join(map(str, wanted))}, so they cannot replay that run")
    curves = target.artifacts.setdefault(CURVES, {})
    for sizes, curve in saved.items():
        curves[tuple(int(s) for s in sizes.split(","))] = {int(s): float(t) for s, t in curve.items()}


SHOWN_COSTS = (4, 16)  # the draft counts whose verification cost the page shows after a race


def measured_costs(target, sizes=SHOWN_COSTS) -> dict[int, float]:
    """What verifying n drafts costs in plain steps for n in `sizes`, from the curve already measured on `target`
    (the app measures it at load); {} when there is none: a request never waits for a measurement."""
    curve = target.artifacts.get(CURVES, {}).get(curve_sizes(target))
    return {n: interpolate(relative_cost(curve), n) for n in sizes} if curve else {}


def relative_cost(curve: dict[int, float]) -> dict[int, float]:
    """Costs divided by the AR step (size 0), made non-decreasing (a bigger tree never costs less)."""
    base = curve[0]
    out, top = {}, 0.0
    for s in sorted(curve):
        top = max(top, curve[s] / base)
        out[s] = round(top, 3)
    out[0] = 1.0
    return out


def interpolate(table: dict[int, float], n: int, extrapolate: bool = False) -> float:
    """table[n], linear between the nearest sizes; past the largest size either extended along the last segment
    (`extrapolate`: costs keep growing) or held at the last value (expected tau saturates)."""
    if n in table:
        return table[n]
    keys = sorted(table)
    if n < keys[0]:
        return table[keys[0]]
    if n > keys[-1]:
        if not extrapolate or len(keys) < 2:
            return table[keys[-1]]
        a, b = keys[-2], keys[-1]
    else:
        b = next(k for k in keys if k > n)
        a = max(k for k in keys if k < n)
    return table[a] + (table[b] - table[a]) * (n - a) / (b - a)


def cost_at(rel: dict[int, float], n: int) -> float:
    """Relative cost of an n-node tree, interpolated from the measured sizes (and extrapolated past the largest)."""
    return interpolate(rel, n, extrapolate=True)


STEP_WEIGHT = 0.2  # each timed verification's share in a drafter's running AR step (the step drifts with the context)


def running_step_seconds(step_seconds: float, seconds: float, price: float) -> float:
    """A drafter's running estimate of an AR step's seconds in place, after a verification priced at `price` AR steps
    by the cost curve took `seconds`: the curve's fastest timing at one context is where it starts, and a request's
    steps drift from it with the context and the machine."""
    return step_seconds + STEP_WEIGHT * (seconds / price - step_seconds)


def pick_budget(target, expected_tau_by_size: dict[int, float], sizes=DEFAULT_SIZES) -> int:
    """The node budget that maximises expected tokens per unit of cost: 64 on GPUs (as in REST); on CPU the argmax
    over measured sizes of expected_tau(n) / relative_cost(n).  Ties go to the smaller tree."""
    if target.device.type != "cpu":
        return GPU_BUDGET
    rel = relative_cost(verify_cost_curve(target, sizes))
    best, best_rate = 0, 1.0  # size 0 = AR: one token per unit of cost
    for s in sorted(rel):
        if s == 0:
            continue
        rate = interpolate(expected_tau_by_size, s) / rel[s]
        if rate > best_rate * 1.01:
            best, best_rate = s, rate
    return best


def best_size(probs: Sequence[float], rel: dict[int, float], extra_nodes: Callable[[int], int] | None = None) -> int:
    """How many nodes of a best-first order to verify: the n that maximises expected tokens per unit of cost,
    (1 + p_1 + ... + p_n) / cost(n + extra(n)).  For a tree, the expected accepted length is exactly the sum over its
    nodes of P(node on the accepted path), so with calibrated p this is the step's expected speed relative to AR.
    `extra_nodes(n)`: nodes that ride along with the first n (SDSAT's probes).  0 = a plain step wins."""
    return size_and_rate(probs, rel, extra_nodes)[0]


def size_and_rate(probs: Sequence[float], rel: dict[int, float], extra_nodes: Callable[[int], int] | None = None,
                  bonus: float = 0.0, overhead: float = 0.0) -> tuple[int, float]:
    """`best_size`'s n and its rate, with `bonus` expected tokens that the riders bring beyond this step (SDSAT's
    probe drafts the next one) added to every n's, and `overhead` AR steps of other work (drafting) in every n's
    cost."""
    extra = extra_nodes or (lambda n: 0)
    best, gain = 0, 1.0 + bonus
    best_rate = gain / (cost_at(rel, extra(0)) + overhead)  # no draft node: a plain step (cost 1) or the riders alone
    for n, p in enumerate(probs, start=1):
        gain += p
        rate = gain / (cost_at(rel, n + extra(n)) + overhead)
        if rate > best_rate + 1e-9:
            best, best_rate = n, rate
    return best, best_rate


def calibrated_cost(target, method: str, state, dynamic: bool, path=None):
    """(calibrator, relative cost curve) for a drafter that sizes its trees per step; (calibrator or None, None) when
    it should not: dynamic off, or no calibration for this model, method and decoding mode (raw confidences are not
    probabilities, so weighing them against the cost would cut wrongly).  path: another calibration file, or "none"
    for raw scores."""
    if path is not None and str(path) == "none":  # raw scores asked for (calibrate.py collects them)
        return None, None
    cal = load_calibration(target.name, target.identity, method, not state.sampling.greedy, path)
    if not dynamic or cal is None:
        return cal, None
    return cal, relative_cost(verify_cost_curve(target, curve_sizes(target)))


def cut_to_cost(tree, rel: dict[int, float] | None, max_nodes: int | None = None):
    """The best-first prefix of a scored DraftTree (no probe nodes), at most `max_nodes` long, that pays most for its
    verification; the tree itself when there is no cost curve or no scores."""
    if rel is None or tree.scores is None or not len(tree):
        return tree
    order = tree.best_first()[:max_nodes]
    n = best_size([tree.scores[i] for i in order], rel)
    return tree.subtree(sorted(order[:n]))
