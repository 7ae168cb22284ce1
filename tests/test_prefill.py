"""A prompt's prefill at bf16 and int4 with bf16 outputs between products (prefill.py): the cache it writes, bit for
bit the transformers prefill's, where it runs and where it does not."""
from __future__ import annotations

import pytest
import torch

from conftest import REDUCED, at_precision
from specdemo.engine import GenerationConfig, run_to_end
from specdemo.kvcache import KVCache
from specdemo.precision import prefill_weights
from specdemo.prefill import Bf16Prefill, Bf16Product
from specdemo.target import load_target


def _cache(target, n: int) -> KVCache:
    return KVCache(capacity=n + 8, layers=target.n_layers)


def _transformers_prefill(target, ids: torch.Tensor, cache: KVCache):
    with prefill_weights(target.model):
        return target.decoder(input_ids=ids, past_key_values=cache, use_cache=True, output_hidden_states=True)


@pytest.mark.parametrize("precision", REDUCED)
def test_the_prefill_writes_the_transformers_prefills_cache_bit_for_bit(tiny, precision):
    """Keys and values of every layer, and every layer's hidden states, equal the transformers prefill's (Llama, and
    Qwen2 with its q/k/v biases); the final norm is the decoding step's form of RMSNorm, equal up to rounding."""
    target = at_precision(tiny, precision)
    assert isinstance(target.bf16_prefill, Bf16Prefill)
    ids = torch.randint(100, 5000, (1, 37), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ours, theirs = _cache(target, 37), _cache(target, 37)
        out = target.prefill(ids, ours, output_hidden_states=True)
        ref = _transformers_prefill(target, ids, theirs)
    for a, b in zip(ours.layers, theirs.layers):
        assert a.keys.dtype == torch.float32 and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert len(out.hidden_states) == len(ref.hidden_states) == target.n_layers + 1
    for a, b in zip(out.hidden_states[:-1], ref.hidden_states[:-1]):
        assert torch.equal(a, b)
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", REDUCED)
def test_the_engine_prefills_through_it_once_and_never_in_a_step(tiny, precision, monkeypatch):
    target = at_precision(tiny, precision)
    rows = []
    call = Bf16Product.__call__

    def spy(self, x):
        rows.append(x.shape[0])
        return call(self, x)

    monkeypatch.setattr(Bf16Product, "__call__", spy)
    prompt = list(range(100, 120))
    tokens, _ = run_to_end(target, prompt, None, GenerationConfig(max_new_tokens=6))
    assert rows == [len(prompt) - 1] * 7 * target.n_layers  # q, k, v, o, gate, up, down per layer
    monkeypatch.setattr(target, "bf16_prefill", None)  # the transformers prefill: the same tokens
    assert run_to_end(target, prompt, None, GenerationConfig(max_new_tokens=6))[0] == tokens


def test_fp32_models_and_filled_caches_prefill_through_transformers(tiny, monkeypatch):
    """fp32 has nothing to gain (its products take fp32 rows); a cache that holds entries already (the prefill is
    causal from position 0) goes to the decoder too."""
    assert load_target(str(tiny.model.name_or_path), device="cpu").bf16_prefill is None
    target = at_precision(tiny, "bf16")
    monkeypatch.setattr(Bf16Prefill, "__call__", lambda *a, **k: pytest.fail("prefilled a filled cache"))
    cache = _cache(target, 12)
    with torch.inference_mode():
        target.decoder(input_ids=torch.tensor([[5, 6, 7]]), past_key_values=cache, use_cache=True)
        target.prefill(torch.tensor([[8, 9]]), cache)
    assert cache.get_seq_length() == 5


def test_a_model_without_the_cpu_step_has_no_bf16_prefill(tiny, monkeypatch):
    monkeypatch.setenv("SPECDEMO_FUSED_DECODER", "0")
    target = at_precision(tiny, "bf16")
    assert target.step_decoder is None and target.bf16_prefill is None
