"""S4C as a mode: its options, its page knobs and `make`, the drafter built from them (drafter.py).

Options:
    heads   -- folder or hub repo id of trained heads (default: the shipped heads for the embedded model)
    tree    -- "s4c" (two top-1 chains, then top-k alternatives; default) | "chain" (one top-1 chain) |
               "eagle" (EAGLE-2 style: expand the topk best nodes per depth, keep the budget best overall)
    budget  -- max tree nodes (default per device: budget.TREE_SIZES; "auto": from this machine's verify cost curve)
    topk    -- alternatives per position (default 3)
    window  -- prompt tokens the heads attend over (default: their training crop, 160): they learnt on answers after
               at most that much prompt, and a long prompt would cost a head pass over every token before a draft
    precision -- "fp16" (default; through fbgemm, where the CPU has it), "bf16" or "fp32": what the heads' products
               multiply with on the CPU (`cpu_linear.draft_weights`: the heads only draft; docs/s4c.md)
    prompt_lookup -- NOT in the paper: graft a prompt-lookup continuation of up to N tokens onto the head tree (source
               "prompt", counted in the budget).  Default 10 through `make`, chosen on HumanEval problems 100-119 and
               ShareGPT tuning prompts (docs/s4c.md); `prompt_lookup=0` is pure S4C.
    couple  -- under sampling, draw the candidates with the target's own noise from the heads' distribution
               sharpened by this factor (`sampling.draft_candidates`); 0: their most probable tokens, as when greedy.
    price_calls -- with per-step sizing, call the deeper heads only when the nodes they are expected to add pay for
               the calls as well as for their rows (head_calls.py; default on)
"""
from __future__ import annotations

from pathlib import Path

from specdemo.budget import GPU_BUDGET, default_sizing, pick_budget
from specdemo.cpu_linear import WEIGHTS
from specdemo.drafters.contract import DrafterUnavailable, Knob, Option
from specdemo.drafters.s4c.drafter import S4CDrafter
from specdemo.drafters.s4c.heads import TRAINED_PROMPT, S4CArtifactError, cached_heads, default_heads, missing_heads
from specdemo.target import Target

OPTIONS = (
    Option("heads", "path", help="trained draft heads: a folder or a hub id (default: the model's shipped heads)"),
    Option("tree", "choice", choices=("s4c", "chain", "eagle"), help="tree shape (s4c = the paper's)"),
    Option("budget", "int", 1, 256, special=("auto",), help="most draft nodes per step; 'auto' = from the cost curve"),
    Option("topk", "int", 1, 16, help="candidates each head contributes"),
    Option("window", "int", 0, 4096, help="prompt tokens the heads attend over (0 = all; default: their training crop)"),
    Option("precision", "choice", choices=WEIGHTS, help="the heads' weights on the CPU (fp16, the default: fbgemm's "
           "product, the fastest for a head call's few rows)"),
    Option("prompt_lookup", "int", 0, 64, help="graft a prompt-lookup chain of up to this many tokens (0 = off)",
           aliases=("context",)),
    Option("dynamic", "bool", help="send per step the part of the tree that pays for its verification"),
    Option("calibration", "path", special=("none",), help="a calibration file, or 'none' for raw scores"),
    Option("couple", "float", 0, 8, help="sampling: draw with the target's noise, log-probs x this (0 = off)"),
    Option("price_calls", "bool", help="call the deeper heads only where their expected nodes pay for the calls"),
)


def make(target: Target, heads: str | None = None, tree: str = "s4c", budget: int | str | None = None, topk: int = 3,
         prompt_lookup: int = 10, dynamic: bool | None = None, calibration: str | None = None,
         window: int | None = None, precision: str = "fp16", couple: float = 1.0, price_calls: bool = True
         ) -> S4CDrafter:
    """An S4C drafter for `target` (see the module docstring for the options); tree sizes left unset come from
    budget.TREE_SIZES."""
    dynamic, budget = default_sizing(target, "s4c", dynamic, budget)
    source = heads or default_heads(target)
    if source is None or (isinstance(source, Path) and not (source / "model.safetensors").exists()):
        raise DrafterUnavailable(missing_heads(target))
    try:
        loaded = cached_heads(target, str(source), weights=str(precision))
    except S4CArtifactError as exc:
        raise DrafterUnavailable(str(exc)) from exc
    if budget == "auto":
        budget = _auto_budget(target)
        topk = max(int(topk), -(-budget // (2 * loaded.n_heads - 1)))  # an s4c tree holds (2H - 1) * topk nodes
    if window is None:
        window = loaded.config.get("training", {}).get("max_prompt", TRAINED_PROMPT)
    return S4CDrafter(target, loaded, tree=str(tree), budget=int(budget), topk=int(topk),
                      prompt_lookup=int(prompt_lookup), dynamic=dynamic,
                      calibration=Path(calibration) if calibration else None, window=int(window), couple=float(couple),
                      price_calls=bool(price_calls))


# tau of the s4c tree by node budget on the embedded model with the shipped heads (`specdemo acceptance`, greedy)
EXPECTED_TAU = {1: 1.45, 3: 1.75, 6: 2.0, 9: 2.15, 12: 2.25, 15: 2.3}


def _auto_budget(target: Target) -> int:
    """The node budget from this machine's measured verification cost curve (specdemo.budget); 64 on GPUs."""
    if target.device.type != "cpu":
        return GPU_BUDGET
    return max(3, int(pick_budget(target, EXPECTED_TAU, sizes=(0, 1, 2, 4, 8, 12, 16))))


KNOBS = (
    Knob("s4c", "budget", "Tree budget", 0, 64, 0, "draft nodes per step · 0 = device default (CPU: up to 16, "
         "sized per step; GPU: 15)", zero_keeps_default=True),
    Knob("s4c", "topk", "Top-k per head", 1, 8, 3, "candidates each head contributes"),
)
