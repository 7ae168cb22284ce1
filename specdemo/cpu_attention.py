"""Tree verification's attention on CPU without copying the KV cache per layer.

A tree forward passes a custom 4D mask.  With a mask, transformers' SDPA integration expands grouped KV heads to
one per query head (`repeat_kv`) before calling `scaled_dot_product_attention`, because CUDA's fast kernels refuse
masked grouped-query attention.  On CPU that expansion copies the whole cache of every layer on every verification:
for SmolLM2-135M (9 query heads, 3 KV heads) at a 2,000-token context it is ~10 ms of a ~90 ms step, and the reason a
one-node tree costs 1.3x a plain step there while an unmasked one-token step (which keeps the KV heads grouped) does
not.  torch's CPU flash kernel takes the mask and the grouped heads together (`enable_gqa=True`), with the same
result up to float rounding, so this registers an attention function that does exactly that on CPU and defers to
transformers' own SDPA function everywhere else (GPU, unmasked calls, models without grouped heads).

It is registered through transformers' `AttentionInterface` (its extension point for attention functions) under
NAME, with the SDPA mask format; the model's code is not touched.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "sdpa_grouped_kv"


def grouped_kv_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (batch, heads, q, d) inputs -> ((batch, q, heads, d), None)."""
    plain = (query.device.type != "cpu" or attention_mask is None or getattr(module, "num_key_value_groups", 1) == 1
             or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
             or kwargs.get("cache") is not None or attention_mask.dtype == torch.bool)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def use_grouped_kv_attention(model: torch.nn.Module) -> bool:
    """Switch a loaded CPU model that uses SDPA with grouped KV heads to `grouped_kv_sdpa`; True if switched."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    cfg = model.config
    heads = getattr(cfg, "num_attention_heads", None)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    if getattr(cfg, "_attn_implementation", None) != "sdpa" or not heads or kv_heads == heads:
        return False
    AttentionInterface.register(NAME, grouped_kv_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return cfg._attn_implementation == NAME
