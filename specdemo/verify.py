"""The target's verification forward over [root] + a draft tree, and the self-checks that prove a loaded model
honours it: a tree forward (a custom 4D mask, explicit position ids) must give the logits of plain sequential
forwards, or the engine refuses the model for drafting (`check_tree_support`, once per model).  `trial_forward` is
also the harness of the cost measurements (budget.py, scripts/)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from specdemo.kvcache import KVCache
from specdemo.precision import invariant_rows
from specdemo.static_step import StaticSteps, static_trial
from specdemo.target import Target, UnsupportedForTree, decoder_features
from specdemo.tree import DraftTree, TreeBuffers

if TYPE_CHECKING:
    from specdemo.cuda_graphs import GraphedSteps


def tree_forward(target: Target, cache: KVCache, ids: list[int], buf: TreeBuffers,
                 layers: tuple[int, ...] = ()) -> torch.Tensor:
    """One target forward over [root] + tree nodes; returns the `decoder_features` of those positions."""
    past = cache.get_seq_length()
    mask = buf.attention_mask(past, target.dtype) if buf.n > 1 else None
    out = target.step(
        input_ids=torch.tensor([ids], device=target.device),
        attention_mask=mask,
        position_ids=buf.positions.unsqueeze(0),
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=bool(layers),
    )
    return decoder_features(out, layers)


def prefilled_cache(target: Target, ids: list[int], room: int) -> KVCache:
    """A fresh KV cache holding `ids` (the committed tokens before a root), with `room` more positions."""
    cache = KVCache(capacity=len(ids) + room, layers=target.n_layers)
    target.decoder(input_ids=torch.tensor([ids], device=target.device), past_key_values=cache, use_cache=True)
    return cache


def trial_forward(target: Target, cache: KVCache, root: int, tree: DraftTree,
                  steps: "StaticSteps | GraphedSteps | None" = None) -> tuple[torch.Tensor, float]:
    """One verification over [root] + `tree` that leaves `cache` as it found it: the logits (1 + len(tree), vocab) and
    the seconds of what a step pays for them, the forward and the LM head over every row (synchronised).  The harness
    of cost measurements and model checks.  `steps`: verify through these static steps (static_step.py, CUDA graphs
    where they replay), whose cache `cache` is, as runs that take them do."""
    past = cache.get_seq_length()
    buf = TreeBuffers.build(tree, past, target.device)
    ids = [root] + tree.tokens
    target.sync()
    t0 = time.perf_counter()
    hidden = steps.forward(ids, buf, past)[: buf.n] if steps is not None else tree_forward(target, cache, ids, buf)
    logits = target.lm_head(hidden)
    target.sync()
    seconds = time.perf_counter() - t0
    cache.keep(past, [])  # drop what this forward appended
    return logits, seconds


def check_tree_support(target: Target, static: bool = False) -> None:
    """Prove on this model that a tree forward (4D mask + position ids) gives the logits of plain sequential forwards,
    and with `static` that the padded static-shape forward does too (`static_step.static_trial`: a dummy row, stale
    entries in every free slot of the fixed-length cache).  Once per loaded model; raises UnsupportedForTree."""
    if target.tree_ok and (target.static_ok or not static):
        return
    g = torch.Generator().manual_seed(0)
    vocab = min(target.model.config.vocab_size, 1000)
    ctx = torch.randint(10, vocab, (12,), generator=g).tolist()
    # root + two branches: [a, b] and [c]; each node must see only its ancestors
    tree = DraftTree(tokens=[ctx[5], ctx[6], ctx[7]], parents=[-1, 0, -1])
    try:
        with torch.no_grad():
            trials = {"a custom 4D attention mask": trial_forward(target, prefilled_cache(target, ctx[:-1], 8),
                                                                   ctx[-1], tree)[0],
                      **({"a padded static-shape mask": static_trial(target, ctx, tree)} if static else {})}
            ref = [target.model(input_ids=torch.tensor([seq], device=target.device)).logits[0].float()
                   for seq in (ctx + [ctx[5], ctx[6]], ctx + [ctx[7]])]
            want = torch.stack([ref[0][-3], ref[0][-2], ref[0][-1], ref[1][-1]])
        errs = {k: ((v.float() - want).abs().max() / (want.abs().max() + 1e-6)).item() for k, v in trials.items()}
    except Exception as exc:
        raise UnsupportedForTree(f"Model '{target.name}' is unsupported for tree verification: its forward rejected a "
                                 f"custom 4D attention mask with explicit position ids ({type(exc).__name__}: "
                                 f"{str(exc)[:200]}). Use plain AR decoding.") from exc
    tol = 1e-3 if target.dtype == torch.float32 and target.precision == "fp32" else 3e-2  # bf16 linear inputs: 2^-8
    if target.precision != "fp32":
        fused = tuple(p for p, _ in getattr(target.step_decoder, "products", ()))
        rows = invariant_rows(target.model, also=fused)
        if rows < 2:
            raise UnsupportedForTree(f"Model '{target.name}' at {target.precision}: a linear layer's row differs alone "
                                     "and among rows, so a tree would change the output. Use precision fp32.")
        target.tree_rows = rows
    for what, err in errs.items():
        if err > tol:
            raise UnsupportedForTree(f"Model '{target.name}' is unsupported for tree verification: with {what} its "
                                     f"logits differ from sequential decoding (relative error {err:.2e}). Use plain AR "
                                     "decoding.")
    target.tree_ok = True
    target.static_ok = target.static_ok or static
