"""A prompt's prefill at bf16 and int4 precision on the CPU, with the products' bf16 outputs kept in bf16.

Why: at these precisions every product of a prefill already takes its rows in bf16 (an int4 model's layers on their
bf16 prefill weights, `precision.Int4Linear`) and the prompt's causal attention runs in bf16
(`cpu_attention._bf16_prefill`).  Through the transformers decoder each product's output is then cast to fp32 and back
to bf16 before the next product, and the attention's output moves as fp32: ~700 casts and twice the bytes per
prefill.  Here a layer is the same computation with the products' outputs left in bf16 where the next operation is a
product or the attention; the residual stream, the norms, the rotary embedding of q and k and the SiLU gate stay
fp32, so the cache gets the transformers prefill's keys and values bit for bit (on the 2-core dev machine the tune
prompts' prefills took 12% less time at int4, 14% at bf16: docs/precision.md, "The prompt's products in bf16 from end
to end").

Every mode prefills this way, so drafted output stays plain decoding's; a decoding step (step_decoder.py) never runs it.
It covers what the CPU step covers (Llama/Qwen2/Mistral layers; `StepDecoder`), prompts prefilled into an empty cache.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import BaseModelOutputWithPast

from specdemo.cpu_linear import PackedLinear
from specdemo.precision import Int4Linear
from specdemo.step_decoder import RMSNorm, StepDecoder, rotated

_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class Bf16Product:
    """A linear layer's product on its bf16 weights (oneDNN-packed), bf16 rows in: the output in bf16, or in fp32
    where the layer adds an fp32 bias after the product (an int4 layer, as its own prefill does)."""

    def __init__(self, packed: torch.Tensor, bias_in: torch.Tensor | None, bias_after: torch.Tensor | None):
        self.packed, self.bias_in, self.bias_after = packed, bias_in, bias_after

    @classmethod
    def of(cls, linear: torch.nn.Module) -> "Bf16Product | None":
        """The bf16 product of an int4 layer (its prefill weight) or of a bf16-packed layer; None for any other."""
        if isinstance(linear, Int4Linear) and linear.prefill_weight is not None:
            return cls(linear.prefill_weight, None, linear.bias)
        if type(linear) is PackedLinear and linear.weights == "bf16":
            packed = linear._packed_weight()
            return None if packed is None else cls(packed, linear._bf16_bias, None)
        return None

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias_in, "none", [], "")
        return y if self.bias_after is None else y + self.bias_after


class Bf16Prefill:
    """The prefill of a model whose CPU step is a StepDecoder and whose decoder linears all have bf16 weights."""

    def __init__(self, step: StepDecoder, products: list[dict[str, Bf16Product]]):
        self.step, self.products = step, products

    @classmethod
    def for_model(cls, model: torch.nn.Module, step: StepDecoder | None) -> "Bf16Prefill | None":
        """None where the model has no CPU step or a decoder linear without bf16 weights (fp32 models: nothing to
        gain, their products take fp32 rows)."""
        if step is None or step.embed.weight.device.type != "cpu":
            return None
        products = []
        for layer in model.get_decoder().layers:
            owners = [layer.self_attn] * 4 + [layer.mlp] * 3
            found = {p: Bf16Product.of(getattr(owner, p)) for p, owner in zip(_PARTS, owners)}
            if any(f is None for f in found.values()):
                return None
            products.append(found)
        return cls(step, products)

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, past_key_values, output_hidden_states: bool = False
                 ) -> BaseModelOutputWithPast:
        """`input_ids` (1, n) from position 0 into the empty cache `past_key_values`; the decoder's output (normed last
        hidden states, and with `output_hidden_states` every layer's as transformers gives them)."""
        n = input_ids.shape[1]
        x = self.step.embed(input_ids)[0]
        rotary = self.step.rotary(torch.arange(n, device=x.device))
        states = [x] if output_hidden_states else None
        for i, (layer, products) in enumerate(zip(self.step.layers, self.products)):
            x = _layer(layer, products, x, rotary, past_key_values, i)
            if states is not None:
                states.append(x)
        x = self.step.norm(x)
        if states is not None:
            states[-1] = x
        return BaseModelOutputWithPast(last_hidden_state=x.unsqueeze(0),
                                       hidden_states=tuple(s.unsqueeze(0) for s in states) if states else None)


def _layer(layer, products: dict[str, Bf16Product], x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
           cache, index: int) -> torch.Tensor:
    """One decoder layer over a prompt's rows x (n, d) in fp32; its keys and values go to `cache` layer `index`."""
    n, hd, n_q, n_kv = x.shape[0], layer.head_dim, layer.n_q, layer.n_kv
    cos, sin = rotary
    h = _normed(layer.norm_in, x)
    q, k = products["q_proj"](h).float().view(n, n_q, hd), products["k_proj"](h).float().view(n, n_kv, hd)
    q, k = rotated(q, cos, sin), rotated(k, cos, sin).transpose(0, 1).unsqueeze(0)
    v = products["v_proj"](h).view(n, n_kv, hd).transpose(0, 1).unsqueeze(0)
    cache.update(k, v.float(), index)
    out = F.scaled_dot_product_attention(q.to(torch.bfloat16).transpose(0, 1).unsqueeze(0), k.to(torch.bfloat16),
                                         v.to(torch.bfloat16), is_causal=True, scale=layer.scaling, enable_gqa=True)
    x = x + products["o_proj"](out[0].transpose(0, 1).reshape(n, n_q * hd))
    h = _normed(layer.norm_post, x)
    # the gate in fp32 as the transformers prefill computes it (one rounding to bf16, at the down product's input; in
    # bf16 it would round twice, and the int4 model's prompt-position choices then agreed with the fp32 model's less
    # often), in place: a long prompt's fresh fp32 buffers cost more than their arithmetic
    gated = products["gate_proj"](h).float()
    F.silu(gated, inplace=True)
    return x + products["down_proj"](gated.mul_(products["up_proj"](h)).to(torch.bfloat16))


def _normed(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """The layer's RMSNorm of fp32 rows, as the bf16 rows its products take: torch's `rms_norm`, which over a prompt's
    hundreds of rows takes less than half the time of the decoding step's form of it (`RMSNorm`)."""
    return F.rms_norm(x, (norm.width,), norm.weight, norm.eps).to(torch.bfloat16)
