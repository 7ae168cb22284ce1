"""The heads' forward for drafting: `S4CHeads.head`'s computation in a few large operations instead of many small ones;
and the scores of the draft vocabulary (`DraftScores`).

Why: a head call drafts 1-10 rows, so on the CPU its cost is mostly the decoder layer's ~100 small operations and
module calls, not its products.  Each head's layer runs as the target's CPU decoding step runs its layers
(`step_decoder.FusedLayer`: one q/k/v and one gate/up product, one rotary multiply over a table built once, fused
norms), on the heads' own weights (packed as `cached_heads` packs them), so the outputs equal
`S4CHeads.head`'s up to float rounding (a test checks); drafts only propose, the target verifies every one.  Heads over
a layer of another form draft through `S4CHeads.head`.
"""
from __future__ import annotations

import torch

from specdemo.cpu_attention import grouped_kv_sdpa
from specdemo.step_decoder import FusedLayer, RMSNorm, RotaryTable, layer_supported
from specdemo.cpu_linear import PackedLinear, frozen_linear, usable_weights
from specdemo.drafters.s4c.heads import S4CHeads
from specdemo.kvcache import KVCache


def supported(heads: S4CHeads) -> bool:
    """Whether the heads' layers have the form FusedLayer computes."""
    return layer_supported(heads.layers[0])


class DraftStep:
    """Every head as an input product, a FusedLayer and its output norm."""

    def __init__(self, heads: S4CHeads, max_positions: int = 4096):
        self.heads = heads
        eps = heads.layers[0].self_attn.config.rms_norm_eps
        self.fc = [_packed(fc, heads.draft_weights) for fc in heads.fc]
        self.layers = [FusedLayer(layer, eps) for layer in heads.layers]
        self.norms = [RMSNorm(norm.weight, eps) for norm in heads.norms]
        self.rotary = RotaryTable.for_model(heads.rotary, heads.fc[0].weight, max_positions)

    @torch.no_grad()
    def head(self, h: int, emb: torch.Tensor, feat: torch.Tensor, positions: torch.Tensor,
             mask: torch.Tensor | None, cache: KVCache) -> torch.Tensor:
        """`S4CHeads.head(h, emb, feat, positions, mask, cache)` for one sequence (batch 1)."""
        if h == 0 and self.heads.fuse is not None:
            feat = self.heads.fuse(feat)
        x = self.fc[h](torch.cat([emb, feat], dim=-1))
        layer = self.layers[h]
        x = layer(x, self.rotary(positions[0]), cache, 0, grouped_kv_sdpa, mask)
        return self.norms[h](x)


def _packed(fc: torch.nn.Module, weights: str) -> torch.nn.Module:
    """The head's input product on the packed path: `cached_heads` has packed it already where the target's linears
    are packed; where they are not (the memory cap), the heads' few MB are packed here all the same."""
    if isinstance(fc, PackedLinear) and fc.weights == usable_weights(weights):
        return fc
    return frozen_linear(fc.weight, weights=weights, bias=fc.bias)


def draft_step(target, heads: S4CHeads) -> DraftStep | None:
    """The heads' DraftStep, built once per model and heads and kept on the model (Target.artifacts); None where the
    heads' layers are not of the form it computes."""
    key = ("s4c-draft-step", id(heads))
    if key not in target.artifacts:
        target.artifacts[key] = DraftStep(heads, target.max_positions + 64) if supported(heads) else None
    return target.artifacts[key]


class DraftScores:
    """The frozen LM head's rows for a request's draft vocabulary: the heads' own (`S4CHeads.draft_vocab`), packed once
    per model and heads and kept on the model, then the request's prompt tokens outside it, packed per request.
    Packing all of them per request (a gather of ~8,000 of the head's rows and oneDNN's reorder) cost ~3 ms of every
    S4C request's start on the 2-core dev machine (docs/s4c.md); the prompt's few extra rows cost a second small
    product per call."""

    def __init__(self, target, heads: S4CHeads, prompt: list[int]):
        key = ("s4c-draft-scores", id(heads))
        if key not in target.artifacts:  # cpu_linear.draft_weights says at what precision, and why
            target.artifacts[key] = frozen_linear(heads.lm_weight(), weights=heads.draft_weights)
        self.fixed = target.artifacts[key]
        own = heads.draft_vocab.to(target.device)
        asked = torch.tensor(prompt, device=target.device, dtype=torch.long).unique()
        extra = asked[~torch.isin(asked, own)]
        self.extra = frozen_linear(heads.lm_weight(extra), weights=heads.draft_weights) if len(extra) else None
        self.vocab = torch.cat([own, extra])  # the token id of each column of a call's output

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        fixed = self.fixed(rows)
        return fixed if self.extra is None else torch.cat([fixed, self.extra(rows)], -1)


def varying_shape_attention():
    """The attention kernels for the heads' eager steps, whose shapes change every call: any but cuDNN's, which
    plans and caches an execution graph per new shape (bf16 on an H200: 4.5 ms of CPU per call, 120 ms per draft
    step); flash and memory-efficient attention launch at once, and a CPU's choice is among those left."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
