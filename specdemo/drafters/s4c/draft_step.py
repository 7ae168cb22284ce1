"""The heads' forward for drafting: `S4CHeads.head`'s computation in a few large operations instead of many small ones.

Why: a head call drafts 1-10 rows, so on the CPU its cost is mostly the decoder layer's ~100 small operations and
module calls (three q/k/v products, two MLP products, rotary tables rebuilt per call, RMSNorm in five steps, casts
around each bf16 product), not its products.  Here q, k and v are one packed product, gate and up another, q and k
turn by one rotary multiply over a table built once per request, and the norms are torch's fused `rms_norm`.  The
weights are the heads' own (bf16-packed where `cached_heads` packs the heads so), so the outputs
equal `S4CHeads.head`'s up to float rounding (a test checks); drafts only propose, the target verifies every one.

It covers the Llama/Qwen2 decoder layer (pre-norm, rotate-half rotary, grouped KV heads, optional q/k/v bias); heads
over another layer class draft through `S4CHeads.head`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdemo.cpu_linear import frozen_linear
from specdemo.drafters.s4c.heads import S4CHeads
from specdemo.kvcache import KVCache

_LAYER_PARTS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def supported(heads: S4CHeads) -> bool:
    """Whether the heads' layers have the Llama/Qwen2 form this module computes (and nothing it would skip)."""
    layer = heads.layers[0]
    names = {n for n, _ in layer.named_modules()}
    attn = layer.self_attn
    return (set(_LAYER_PARTS) <= names and not hasattr(attn, "q_norm") and not hasattr(attn, "k_norm")
            and type(getattr(layer.mlp, "act_fn", None)).__name__ == "SiLUActivation")


def _linear(*parts: torch.nn.Linear) -> torch.nn.Module:
    """One frozen product of several linear layers side by side (their outputs concatenated), packed in bf16 where
    the heads' own layers are (`cached_heads`)."""
    weight = torch.cat([p.weight.detach() for p in parts])
    bias = None if parts[0].bias is None else torch.cat([p.bias.detach() for p in parts])
    return frozen_linear(weight, draft_precision=bool(getattr(parts[0], "bf16", False)), bias=bias)


class DraftStep:
    """Every head's layer as fused products, the rotary table for positions < `max_positions`."""

    def __init__(self, heads: S4CHeads, max_positions: int):
        self.heads = heads
        cfg = heads.layers[0].self_attn.config
        self.n_q, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = heads.layers[0].self_attn.head_dim
        self.scaling = heads.layers[0].self_attn.scaling
        self.eps = cfg.rms_norm_eps
        self.fc = [_linear(fc) for fc in heads.fc]
        self.qkv, self.o, self.gate_up, self.down, self.norms = [], [], [], [], []
        for layer, norm in zip(heads.layers, heads.norms):
            a, m = layer.self_attn, layer.mlp
            self.qkv.append(_linear(a.q_proj, a.k_proj, a.v_proj))
            self.o.append(_linear(a.o_proj))
            self.gate_up.append(_linear(m.gate_proj, m.up_proj))
            self.down.append(_linear(m.down_proj))
            self.norms.append(tuple(n.weight.detach() for n in (layer.input_layernorm,
                                                                  layer.post_attention_layernorm, norm)))
        weight = heads.fc[0].weight
        positions = torch.arange(max_positions, device=weight.device).unsqueeze(0)
        cos, sin = heads.rotary(weight.new_zeros(1, dtype=torch.float32), positions)
        self.cos, self.sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # (positions, 1, head_dim)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    @torch.no_grad()
    def head(self, h: int, emb: torch.Tensor, feat: torch.Tensor, positions: torch.Tensor,
             mask: torch.Tensor | None, cache: KVCache) -> torch.Tensor:
        """`S4CHeads.head(h, emb, feat, positions, mask, cache)` for one sequence (batch 1)."""
        if h == 0 and self.heads.fuse is not None:
            feat = self.heads.fuse(feat)
        x = self.fc[h](torch.cat([emb, feat], dim=-1))  # (1, T, d)
        T, hd = x.shape[1], self.head_dim
        w_in, w_post, w_out = self.norms[h]
        qkv = self.qkv[h](self._norm(x, w_in)).view(T, self.n_q + 2 * self.n_kv, hd)
        turned = qkv[:, : self.n_q + self.n_kv]  # q and k heads turn together
        pos = positions[0]
        cos, sin = self.cos[pos], self.sin[pos]
        half = hd // 2
        turned = turned * cos + torch.cat([-turned[..., half:], turned[..., :half]], -1) * sin
        q = turned[:, : self.n_q].transpose(0, 1).unsqueeze(0)
        k = turned[:, self.n_q :].transpose(0, 1).unsqueeze(0)
        v = qkv[:, self.n_q + self.n_kv :].transpose(0, 1).unsqueeze(0)
        k, v = cache.update(k, v, 0)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling,
                                              enable_gqa=self.n_q != self.n_kv)
        x = x + self.o[h](attn.transpose(1, 2).reshape(1, T, self.n_q * hd))
        gate, up = self.gate_up[h](self._norm(x, w_post)).chunk(2, dim=-1)
        x = x + self.down[h](F.silu(gate) * up)
        return self._norm(x, w_out)


def draft_step(target, heads: S4CHeads) -> DraftStep | None:
    """The heads' DraftStep, built once per model and heads and kept on the model (Target.artifacts); None where the
    heads' layers are not of the form it computes."""
    key = ("s4c-draft-step", id(heads))
    if key not in target.artifacts:
        target.artifacts[key] = DraftStep(heads, target.max_positions + 64) if supported(heads) else None
    return target.artifacts[key]
