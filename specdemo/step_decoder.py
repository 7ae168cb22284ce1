"""A decoding step of a Llama-family model in few operations (on the CPU and on CUDA): the same weights, attention and
cache as the transformers model, without its per-layer machinery.

Why: on the CPU a decoding step feeds 1-20 rows through 30 layers, so its cost is not only its products.  Measured on
the embedded model at int4, half an AR step (~5 of ~11 ms on the 2-core dev machine) was everything else: ~15 module
calls per layer with their keyword plumbing, three q/k/v products and two gate/up products where one each would do,
rotary tables rebuilt on every forward, RMSNorm in five element-wise steps, the output-capturing wrappers.  Here a
layer is one q/k/v product, one rotary multiply over a table built once per model, the model's own attention function
(so the CPU attention of cpu_attention.py, row-exact at bf16 and int4, is unchanged), one gate/up product, each norm
one fused kernel (`RMSNorm`); the rest of the model (its prefill, training, hub-model checks) still runs through
transformers.

Every decoding step of a request (AR's one row, every tree verification) runs this same forward, so drafted output
stays plain decoding's; `verify.check_tree_support` proves at load that its logits are the transformers model's within
the precision's tolerance.  It covers the Llama/Qwen2/Mistral layer (pre-norm, rotate-half rotary with a fixed table,
grouped KV heads, optional biases, SiLU MLP, no sliding window); other models decode through transformers.
Opt out: SPECDEMO_FUSED_DECODER=0.  On CUDA the same step launches fewer kernels than the transformers layer (fused
norms, one q/k/v and one gate/up product) and its static steps replay as CUDA graphs like the transformers decoder's;
on one H200 in fp32 it decodes 1.2-1.3x as fast in every mode, identical to AR (docs/gpu/README.md), so it is the
default there too (not under ZeroGPU, where it is unmeasured).
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


def layer_supported(layer: torch.nn.Module) -> bool:
    """Whether a decoder layer has the form FusedLayer computes: Llama's (pre-norm, q/k/v/o, SiLU gate/up/down), no
    q/k norms."""
    names = {n for n, _ in layer.named_modules()}
    attn = getattr(layer, "self_attn", None)
    return (set(_LAYER_PARTS) <= names and not hasattr(attn, "q_norm") and not hasattr(attn, "k_norm")
            and type(getattr(layer.mlp, "act_fn", None)).__name__ == "SiLUActivation")


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why `model` cannot decode through StepDecoder (None: it can)."""
    env = os.environ.get("SPECDEMO_FUSED_DECODER", "").strip()
    if env == "0":
        return "SPECDEMO_FUSED_DECODER=0"
    dec = model.get_decoder()
    cfg = model.config
    layers = getattr(dec, "layers", None)
    if not layers or not all(hasattr(dec, a) for a in ("embed_tokens", "norm", "rotary_emb")):
        return "not a Llama-style decoder"
    if not layer_supported(layers[0]):
        return "a decoder layer of another form"
    if getattr(dec.rotary_emb, "rope_type", "default") not in _FIXED_ROPE:
        return f"rotary scaling {dec.rotary_emb.rope_type!r}"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "a sliding attention window"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return "layers other than full attention"
    device = next(model.parameters()).device.type
    if device not in ("cpu", "cuda"):
        return f"on {device} (the step is built for the CPU and CUDA)"
    if device == "cuda" and os.environ.get("SPACES_ZERO_GPU") and env != "1":
        # ZeroGPU moves a model's tensors to the GPU per call; the fused products' views of the parts' weights are
        # unmeasured there
        return "under ZeroGPU (SPECDEMO_FUSED_DECODER=1 turns it on)"
    return None


def fused_linear(*parts: torch.nn.Module) -> torch.nn.Module:
    """One product for several linear layers side by side (outputs concatenated), at the parts' precision: int4
    parts' packed blocks and scales are concatenated (the CPU int4 layout packs output rows in whole blocks), dense
    parts' weights are packed together, at the parts' `weights`.  The packed copy is what the fusion adds in memory
    (the embedded model's q/k/v and gate/up weights: ~0.28 GB in fp32); the parts keep theirs for the prefill.  Each
    part records where its output went (`fused_into`: the product and its first column), so that hooks on a part
    (SDSAT's adapter) can follow it."""
    dense = not all(isinstance(p, Int4Linear) for p in parts)
    if dense:
        bias = None if parts[0].bias is None else torch.cat([p.bias.detach() for p in parts])
        weight = torch.cat([p.weight.detach() for p in parts])
        fused = frozen_linear(weight, weights=getattr(parts[0], "weights", "fp32"), bias=bias)
    else:
        fused = Int4Linear.concat(parts)
    start = 0
    for p in parts:
        if dense:  # the parts' dense weights become views of the fused one: no second dense copy
            p.weight.data = weight[start : start + p.out_features]
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
        len({(type(p), getattr(p, "weights", "fp32"), p.bias is None) for p in parts}) == 1


class RotaryTable:
    """A rotary embedding's cos and sin per position, computed once by the embedding itself (so the values are the
    model's own) and grown by doubling when a position passes its end."""

    def __init__(self, rotary: torch.nn.Module, like: torch.Tensor, length: int = 4096, grow: bool = True):
        """grow False: the table covers every position asked for (the model's limit), so a call never reads a
        position back to the host (a CUDA graph captures no host synchronisation)."""
        self.rotary, self.like, self.grow = rotary, like, grow
        self._build(length)

    @classmethod
    def for_model(cls, rotary: torch.nn.Module, like: torch.Tensor, max_positions: int) -> "RotaryTable":
        """A CPU's table grows on demand from 4,096 positions; a GPU's is built whole, so that a step reads no
        position back to the host: steps capture as CUDA graphs, and eager ones never wait for the GPU to drain."""
        on_cpu = like.device.type == "cpu"
        return cls(rotary, like, min(max_positions, 4096) if on_cpu else max_positions, grow=on_cpu)

    def _build(self, length: int) -> None:
        cos, sin = self.rotary(self.like.new_zeros(1, dtype=torch.float32),
                                torch.arange(length, device=self.like.device).unsqueeze(0))
        # (positions, head_dim).  rotate_half(x)·sin = roll(x, half)·(sin with its first half negated): one roll
        # instead of two slices, a negation and a concatenation per layer, the same bits (negating is exact)
        half = sin.shape[-1] // 2
        self.cos = cos[0].to(self.like.dtype)
        self.sin_signed = torch.cat([-sin[0, :, :half], sin[0, :, half:]], -1).to(self.like.dtype)

    def __len__(self) -> int:
        return len(self.cos)

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (`_build`) of `positions` (n,) as (n, 1, head_dim): every head turns alike."""
        if self.grow:
            last = int(positions.max())
            if last >= len(self):
                self._build(max(2 * len(self), last + 1))
        return self.cos[positions].unsqueeze(1), self.sin_signed[positions].unsqueeze(1)


def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., head_dim) turned by a RotaryTable's cos and signed sin: x·cos + roll(x, half)·sin (`_build` says why)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


class RMSNorm:
    """A Llama-form RMSNorm, x / sqrt(mean(x²) + eps) · weight over the last dimension, for decoding steps.

    On the CPU it runs as torch's fused LayerNorm of the row [x, −x]: that row's mean is 0 and its variance mean(x²),
    so the first half of its LayerNorm is the RMSNorm of x.  torch's CPU `rms_norm` is a composite of five element-wise
    operations (~11 µs a 576-wide row on the 2-core dev machine against ~7 µs for the concatenation and LayerNorm), and
    a step of the embedded model makes 61 norms.  The two round differently in the last bits, which moves the int4
    model no further from fp32 than any reordering of the norm's operations does (docs/precision.md).  On CUDA
    `rms_norm` is one fused kernel already."""

    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight, self.eps, self.width = weight.detach(), eps, weight.shape[-1]
        self.doubled = torch.cat([self.weight, self.weight]) if self.weight.device.type == "cpu" else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.doubled is None:
            return F.rms_norm(x, (self.width,), self.weight, self.eps)
        both = torch.layer_norm(torch.cat([x, -x], -1), (2 * self.width,), self.doubled, None, self.eps)
        return both[..., : self.width]


class FusedLayer:
    """A Llama-form decoder layer's computation for one sequence in few operations (its own weights, fused)."""

    def __init__(self, layer: torch.nn.Module, eps: float):
        a, m = layer.self_attn, layer.mlp
        cfg = a.config
        self.attn = a  # the attention function's `module` argument (its head counts)
        self.n_q, self.n_kv, self.head_dim, self.scaling = (cfg.num_attention_heads, cfg.num_key_value_heads,
                                                            a.head_dim, a.scaling)
        qkv = (a.q_proj, a.k_proj, a.v_proj)
        self.qkv = fused_linear(*qkv) if fusable(*qkv) else _Side(qkv)
        self.o = a.o_proj
        self.gate_up = fused_linear(m.gate_proj, m.up_proj) if fusable(m.gate_proj, m.up_proj) else \
            _Side((m.gate_proj, m.up_proj))
        self.down = m.down_proj
        # each product with the width of its input rows (scripts/step_breakdown.py times them on their own)
        self.products = [(self.qkv, a.q_proj.in_features), (self.o, a.o_proj.in_features),
                         (self.gate_up, m.gate_proj.in_features), (self.down, m.down_proj.in_features)]
        self.norm_in = RMSNorm(layer.input_layernorm.weight, eps)
        self.norm_post = RMSNorm(layer.post_attention_layernorm.weight, eps)

    def __call__(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], cache, index: int, attention,
                 mask: torch.Tensor | None) -> torch.Tensor:
        """x (1, n, d) -> (1, n, d); the layer's keys and values go to `cache` layer `index`; `attention` has
        transformers' attention-function signature."""
        n, hd, n_q, n_kv = x.shape[1], self.head_dim, self.n_q, self.n_kv
        cos, sin = rotary
        rows = x.view(n, -1)
        qkv = _product(self.qkv, self.norm_in(rows)).view(n, n_q + 2 * n_kv, hd)
        qk = qkv[:, : n_q + n_kv]  # q and k heads turn together
        qk = rotated(qk, cos, sin)
        q = qk[:, :n_q].transpose(0, 1).unsqueeze(0)
        k = qk[:, n_q:].transpose(0, 1).unsqueeze(0)
        v = qkv[:, n_q + n_kv :].transpose(0, 1).unsqueeze(0)
        k, v = cache.update(k, v, index)
        out, _ = attention(self.attn, q, k, v, mask, dropout=0.0, scaling=self.scaling)
        rows = rows + _product(self.o, out.reshape(n, n_q * hd))
        gate, up = _product(self.gate_up, self.norm_post(rows)).chunk(2, dim=-1)
        return (rows + _product(self.down, F.silu(gate) * up)).view(1, n, -1)


def _product(linear, rows: torch.Tensor) -> torch.Tensor:
    """`linear` on `rows` (n, d) -> (n, out).  An int4 product that nothing hooks into runs torch's kernel directly: a
    step makes four per layer, and the module call's plumbing (hook checks, reshapes) is a measurable share of a 1-row
    int4 step.  Hooked products (SDSAT's adapter) get the module call with the rows as (1, n, d), as hooks expect."""
    if type(linear) is Int4Linear and not linear._forward_hooks and not linear.prefilling:
        return linear.rows(rows)
    return linear(rows.unsqueeze(0))[0]


class _Side:
    """Layers that cannot share one product: called one by one, outputs concatenated."""

    def __init__(self, parts):
        self.parts = parts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


class StepDecoder:
    """The decoding step of a loaded model on the CPU or CUDA (called with what the engine passes the transformers
    decoder)."""

    def __init__(self, model: torch.nn.Module, max_positions: int = 4096):
        dec = model.get_decoder()
        self.decoder = dec
        self.config = model.config
        self.embed = dec.embed_tokens
        self.layers = [FusedLayer(layer, model.config.rms_norm_eps) for layer in dec.layers]
        self.norm = RMSNorm(dec.norm.weight, model.config.rms_norm_eps)
        self.rotary = RotaryTable.for_model(dec.rotary_emb, self.norm.weight, max_positions)

    @property
    def products(self) -> list[tuple[torch.nn.Module, int]]:
        """Every linear product the step runs, with the width of its input rows, in the order a step runs them."""
        return [p for layer in self.layers for p in layer.products]

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
        rotary = self.rotary(position_ids[0])
        states = [x] if output_hidden_states else None
        for i, layer in enumerate(self.layers):
            x = layer(x, rotary, past_key_values, i, attention, attention_mask)
            if states is not None:
                states.append(x)
        x = self.norm(x)
        if states is not None:  # as transformers gives them: the embeddings, each layer's output, the last one normed
            states[-1] = x
        return BaseModelOutputWithPast(last_hidden_state=x, hidden_states=tuple(states) if states else None)
