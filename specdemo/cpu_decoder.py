"""A decoding step of a Llama-family model on the CPU in few operations: the same weights, attention and cache as the
transformers model, without its per-layer machinery.

Why: on the CPU a decoding step feeds 1-20 rows through 30 layers, so its cost is not only its products.  Measured on
the embedded model at int4, half an AR step (~5 of ~11 ms on the 2-core dev machine) was everything else: ~15 module
calls per layer with their keyword plumbing, three q/k/v products and two gate/up products where one each would do,
rotary tables rebuilt on every forward, RMSNorm in five element-wise steps, the output-capturing wrappers.  Here a
layer is one q/k/v product, one rotary multiply over a table built once per model, the model's own attention function
(so the CPU attention of cpu_attention.py, row-exact at bf16 and int4, is unchanged), one gate/up product, torch's
fused `rms_norm`; the rest of the model (its prefill, training, hub-model checks) still runs through transformers.

Every decoding step of a request (AR's one row, every tree verification) runs this same forward, so drafted output
stays plain decoding's; `verify.check_tree_support` proves at load that its logits are the transformers model's within
the precision's tolerance.  It covers the Llama/Qwen2/Mistral layer (pre-norm, rotate-half rotary with a fixed table,
grouped KV heads, optional biases, SiLU MLP, no sliding window); other models decode through transformers.
Opt out: SPECDEMO_FUSED_DECODER=0.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from specdemo.cpu_linear import PackedLinear, frozen_linear
from specdemo.precision import Int4Linear

_LAYER_PARTS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_FIXED_ROPE = ("default", "linear", "llama3")  # rotary tables that do not depend on the sequence's length


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why `model` cannot decode through CPUDecoder (None: it can)."""
    if os.environ.get("SPECDEMO_FUSED_DECODER", "1") == "0":
        return "SPECDEMO_FUSED_DECODER=0"
    dec = model.get_decoder()
    cfg = model.config
    layers = getattr(dec, "layers", None)
    if not layers or not all(hasattr(dec, a) for a in ("embed_tokens", "norm", "rotary_emb")):
        return "not a Llama-style decoder"
    names = {n for n, _ in layers[0].named_modules()}
    attn = layers[0].self_attn
    if not set(_LAYER_PARTS) <= names or hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        return "a decoder layer of another form"
    if type(getattr(layers[0].mlp, "act_fn", None)).__name__ != "SiLUActivation":
        return "an MLP activation other than SiLU"
    if getattr(dec.rotary_emb, "rope_type", "default") not in _FIXED_ROPE:
        return f"rotary scaling {dec.rotary_emb.rope_type!r}"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "a sliding attention window"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return "layers other than full attention"
    if next(model.parameters()).device.type != "cpu":
        return "not on the CPU"
    return None


def fused_linear(*parts: torch.nn.Module) -> torch.nn.Module:
    """One product for several linear layers side by side (outputs concatenated), at the parts' precision: int4
    parts' packed blocks and scales are concatenated (the CPU int4 layout packs output rows in whole blocks), dense
    parts' weights are packed together (in bf16 where the parts are; the packed copy is what the fusion adds in
    memory: ~0.28 GB for the embedded model in fp32, the parts keep theirs for the prefill).  Each part records where its output went
    (`fused_into`: the product and its first column), so that hooks on a part (SDSAT's adapter) can follow it."""
    if all(isinstance(p, Int4Linear) for p in parts):
        fused = Int4Linear.concat(parts)
    else:
        bias = None if parts[0].bias is None else torch.cat([p.bias.detach() for p in parts])
        weight = torch.cat([p.weight.detach() for p in parts])
        start = 0
        for p in parts:  # the parts' dense weights become views of the fused one: no second dense copy
            p.weight.data = weight[start : start + p.out_features]
            start += p.out_features
        fused = frozen_linear(weight, draft_precision=bool(getattr(parts[0], "bf16", False)), bias=bias)
    start = 0
    for p in parts:
        p.fused_into = (fused, start)
        start += p.out_features
    return fused


def fusable(*parts: torch.nn.Module) -> bool:
    """Whether `fused_linear` computes `parts` at their own precision: all int4 with the output rows before the last
    part in whole packing blocks, or all dense on the same path."""
    if all(isinstance(p, Int4Linear) for p in parts):  # every part but the last fills whole packing blocks
        return all(p.out_features % Int4Linear.ROW_BLOCK == 0 for p in parts[:-1]) and \
            len({(p.in_features, p.bias is None) for p in parts}) == 1
    return all(type(p) in (PackedLinear, torch.nn.Linear) for p in parts) and \
        len({(type(p), bool(getattr(p, "bf16", False)), p.bias is None) for p in parts}) == 1


class _Layer:
    """One decoder layer's weights as the step uses them."""

    def __init__(self, layer: torch.nn.Module):
        a, m = layer.self_attn, layer.mlp
        self.attn = a  # the attention function's `module` argument (its head counts, its scaling)
        qkv = (a.q_proj, a.k_proj, a.v_proj)
        self.qkv = fused_linear(*qkv) if fusable(*qkv) else _Side(qkv)
        self.o = a.o_proj
        self.gate_up = fused_linear(m.gate_proj, m.up_proj) if fusable(m.gate_proj, m.up_proj) else \
            _Side((m.gate_proj, m.up_proj))
        self.down = m.down_proj
        # each product with the width of its input rows (scripts/step_breakdown.py times them on their own)
        self.products = [(self.qkv, a.q_proj.in_features), (self.o, a.o_proj.in_features),
                         (self.gate_up, m.gate_proj.in_features), (self.down, m.down_proj.in_features)]
        self.norm_in = layer.input_layernorm.weight.detach()
        self.norm_post = layer.post_attention_layernorm.weight.detach()


class _Side:
    """Layers that cannot share one product: called one by one, outputs concatenated."""

    def __init__(self, parts):
        self.parts = parts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


class CPUDecoder:
    """The decoding step of a loaded CPU model (`forward` takes what the engine passes the transformers decoder)."""

    def __init__(self, model: torch.nn.Module, max_positions: int = 4096):
        dec = model.get_decoder()
        cfg = model.config
        self.decoder = dec
        self.embed = dec.embed_tokens
        self.layers = [_Layer(layer) for layer in dec.layers]
        self.norm = dec.norm.weight.detach()
        self.eps = cfg.rms_norm_eps
        attn = dec.layers[0].self_attn
        self.n_q, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.config = cfg
        self.rotary = dec.rotary_emb
        self.cos = self.sin = self.norm.new_zeros(0, self.head_dim)
        self._rotary_table(min(max_positions, 4096))

    def _rotary_table(self, length: int) -> None:
        """cos and sin (positions, head_dim) of positions < `length`, the model's rotary embedding's own values."""
        positions = torch.arange(length).unsqueeze(0)
        cos, sin = self.rotary(self.norm.new_zeros(1, dtype=torch.float32), positions)
        self.cos, self.sin = cos[0], sin[0]

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, past_key_values,
                 attention_mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                 **_: object) -> BaseModelOutputWithPast:
        """One sequence (batch 1): `input_ids` (1, n) at `position_ids` (1, n), appended to `past_key_values`;
        `attention_mask` the engine's 4D additive tree mask (None for one row).  Several rows without a mask (a
        prefill's causal rows) go to the transformers decoder, which builds that mask."""
        if attention_mask is None and input_ids.shape[1] > 1:
            return self.decoder(input_ids=input_ids, position_ids=position_ids, past_key_values=past_key_values,
                                use_cache=True, output_hidden_states=output_hidden_states)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, sdpa_attention_forward)
        x = self.embed(input_ids)
        n, hd, n_q, n_kv = x.shape[1], self.head_dim, self.n_q, self.n_kv
        pos = position_ids[0]
        if int(pos.max()) >= len(self.cos):  # a context longer than the table: grow it (doubling)
            self._rotary_table(max(2 * len(self.cos), int(pos.max()) + 1))
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)  # (n, 1, hd): every head turns alike
        half = hd // 2
        states = [x] if output_hidden_states else None
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(self._rms_norm(x, layer.norm_in)).view(n, n_q + 2 * n_kv, hd)
            qk = qkv[:, : n_q + n_kv]  # q and k heads turn together
            qk = qk * cos + torch.cat([-qk[..., half:], qk[..., :half]], -1) * sin
            q = qk[:, :n_q].transpose(0, 1).unsqueeze(0)
            k = qk[:, n_q:].transpose(0, 1).unsqueeze(0)
            v = qkv[:, n_q + n_kv :].transpose(0, 1).unsqueeze(0)
            k, v = past_key_values.update(k, v, i)
            out, _ = attention(layer.attn, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling)
            x = x + layer.o(out.reshape(1, n, n_q * hd))
            gate, up = layer.gate_up(self._rms_norm(x, layer.norm_post)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
            if states is not None:
                states.append(x)
        x = self._rms_norm(x, self.norm)
        if states is not None:  # as transformers gives them: the embeddings, each layer's output, the last one normed
            states[-1] = x
        return BaseModelOutputWithPast(last_hidden_state=x, hidden_states=tuple(states) if states else None)
