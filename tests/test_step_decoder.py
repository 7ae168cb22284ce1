"""The decoding step in few operations (step_decoder.py): the transformers decoder's values in fewer operations, fused products that
compute each part's rows exactly, the engine's output unchanged, and SDSAT's hooks following the fused products."""
from __future__ import annotations

import types

import pytest
import torch

from conftest import OracleDrafter, needs_int4
from specdemo.step_decoder import RMSNorm, StepDecoder, RotaryTable, fusable, unsupported_reason
from specdemo.engine import GenerationConfig, run_to_end
from specdemo.kvcache import KVCache
from specdemo.precision import Int4Linear
from specdemo.sampling import SamplingConfig
from specdemo.tree import DraftTree, TreeBuffers



def _step_both_ways(target, ctx: list[int], tree: DraftTree, hidden: bool):
    """(transformers decoder, CPU step) outputs of one tree verification after `ctx`, each on its own cache."""
    outs = []
    for run in (target.decoder, target.step_decoder):
        cache = KVCache(capacity=64)
        target.decoder(input_ids=torch.tensor([ctx[:-1]]), past_key_values=cache, use_cache=True)
        buf = TreeBuffers.build(tree, len(ctx) - 1)
        mask = buf.attention_mask(len(ctx) - 1, target.dtype) if buf.n > 1 else None
        outs.append(run(input_ids=torch.tensor([[ctx[-1]] + tree.tokens]), attention_mask=mask,
                        position_ids=buf.positions.unsqueeze(0), past_key_values=cache, use_cache=True,
                        output_hidden_states=hidden))
    return outs


@pytest.mark.parametrize("width", [64, 576])
def test_the_cpu_norm_is_rms_norm_and_gives_a_row_the_same_bits_alone_or_among_rows(width):
    """RMSNorm as LayerNorm of [x, −x]: torch's rms_norm up to float rounding, and (what a tree's rows need) each row's
    bits the same whether it is normed alone or among others."""
    g = torch.Generator().manual_seed(0)
    weight, x = torch.randn(width, generator=g), 3 * torch.randn(17, width, generator=g)
    norm = RMSNorm(weight, 1e-5)
    assert norm.doubled is not None  # the CPU path
    out = norm(x)
    want = torch.nn.functional.rms_norm(x, (width,), weight, 1e-5)
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(norm(x + 1), want, rtol=1e-3, atol=1e-3)  # a shift changes the RMS: no mean is removed
    alone = torch.cat([norm(x[i : i + 1]) for i in range(len(x))])
    for n in (2, 3, 5, 17):
        assert torch.equal(norm(x[:n]), alone[:n])
    assert torch.equal(norm(x.view(1, 17, width))[0], out)


@pytest.mark.parametrize("tree", [DraftTree.empty(), DraftTree(tokens=[11, 12, 13, 14], parents=[-1, 0, -1, 2])])
def test_the_step_gives_the_transformers_decoders_values(tiny, tree):
    """A one-token step and a two-branch tree: last hidden states and every layer's states as transformers gives them
    (fp32, up to float rounding: the fused products and the norms sum in another order)."""
    assert unsupported_reason(tiny.model) is None and isinstance(tiny.step_decoder, StepDecoder)
    with torch.no_grad():
        ref, got = _step_both_ways(tiny, list(range(100, 112)), tree, hidden=True)
    torch.testing.assert_close(got.last_hidden_state, ref.last_hidden_state, rtol=1e-4, atol=1e-4)
    assert len(got.hidden_states) == len(ref.hidden_states)
    for a, b in zip(got.hidden_states, ref.hidden_states):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_positions_past_the_rotary_table_grow_it(tiny_llama):
    table = tiny_llama.step_decoder.rotary
    table._build(8)  # a table shorter than the context below
    with torch.no_grad():
        ref, got = _step_both_ways(tiny_llama, list(range(100, 120)), DraftTree.chain([5, 6]), hidden=False)
    assert len(table) >= 22
    torch.testing.assert_close(got.last_hidden_state, ref.last_hidden_state, rtol=1e-4, atol=1e-4)


def test_a_whole_table_never_grows_and_gives_the_growing_tables_values(tiny_llama):
    """On a GPU the table is built for every position the model takes and a call reads nothing back to the host (a
    CUDA graph captures no synchronisation): the same values as the growing table, and no growth."""
    dec = tiny_llama.step_decoder
    whole = RotaryTable(dec.decoder.rotary_emb, dec.norm.weight, 64, grow=False)
    positions = torch.tensor([0, 5, 63])
    for a, b in zip(whole(positions), dec.rotary(positions)):
        assert torch.equal(a, b)
    assert len(whole) == 64
    with pytest.raises(IndexError):
        whole(torch.tensor([64]))
    cpu = RotaryTable.for_model(dec.decoder.rotary_emb, dec.norm.weight, 10_000)  # a CPU's table starts small and grows
    assert cpu.grow and len(cpu) == 4096


def test_the_step_runs_on_cpu_and_cuda_unless_turned_off(tiny_llama, monkeypatch):
    """The fused step is the default on the CPU and on CUDA (under ZeroGPU when asked), other devices decode through
    transformers; SPECDEMO_FUSED_DECODER=0 turns it off everywhere."""
    class OnDevice:
        def __init__(self, model, device):
            self._model, self._device = model, device

        def __getattr__(self, name):
            return getattr(self._model, name)

        def parameters(self):
            yield types.SimpleNamespace(device=torch.device(self._device))

    model, mps = OnDevice(tiny_llama.model, "cuda"), OnDevice(tiny_llama.model, "mps")
    monkeypatch.delenv("SPECDEMO_FUSED_DECODER", raising=False)
    assert unsupported_reason(model) is None and unsupported_reason(tiny_llama.model) is None
    assert unsupported_reason(mps) == "on mps (the step is built for the CPU and CUDA)"
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")  # off under ZeroGPU unless asked
    assert "ZeroGPU" in unsupported_reason(model) and unsupported_reason(tiny_llama.model) is None
    monkeypatch.setenv("SPECDEMO_FUSED_DECODER", "1")
    assert unsupported_reason(model) is None
    monkeypatch.setenv("SPECDEMO_FUSED_DECODER", "0")
    assert unsupported_reason(model) == unsupported_reason(tiny_llama.model) == "SPECDEMO_FUSED_DECODER=0"


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.8, top_p=0.9, seed=3)])
def test_the_engine_decodes_the_same_tokens_with_and_without_the_step(tiny, sampling):
    """AR and oracle-tree decoding through the CPU step give transformers' decoder's tokens (greedy and sampling)."""
    prompt = torch.randint(100, 5000, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    cfg = GenerationConfig(max_new_tokens=24, sampling=sampling)
    saved, tiny.step_decoder = tiny.step_decoder, None
    try:
        ref, _ = run_to_end(tiny, prompt, None, cfg)
    finally:
        tiny.step_decoder = saved
    assert run_to_end(tiny, prompt, None, cfg)[0] == ref
    out, events = run_to_end(tiny, prompt, OracleDrafter(ref, tiny.vocab_size, seed=2), cfg)
    assert out == ref and any(e.accepted for e in events)


@needs_int4
def test_fused_int4_products_compute_each_parts_rows_exactly():
    """Concatenated int4 layers (packed blocks, scales and zeros as they are) give each part's output bit for bit,
    where the parts before the last fill whole packing blocks; `fusable` refuses the rest."""
    g = torch.Generator().manual_seed(0)

    def layer(rows):
        return Int4Linear(torch.randint(0, 16, (rows, 128), generator=g, dtype=torch.int32),
                          torch.rand(rows, 4, generator=g) / 10, torch.randn(rows, 4, generator=g) / 10)

    parts = [layer(128), layer(64), layer(64)]
    assert fusable(*parts) and not fusable(layer(32), layer(32))
    fused = Int4Linear.concat(parts)
    for rows in (1, 5):
        x = torch.randn(rows, 128, generator=g)
        assert torch.equal(fused(x), torch.cat([p(x) for p in parts], -1))
