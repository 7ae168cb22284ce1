"""CPU precisions (precision.py): the GGUF's Q4_1 blocks in torch's int4 layout, the bound their bf16 scales keep,
row invariance of every precision's linears, loading and naming, and the model spec the page and the API use."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import REDUCED, OracleDrafter, at_precision, needs_int4
from specdemo.cpu_linear import fp16_available
from specdemo.engine import GenerationConfig, generate, run_to_end
from specdemo.precision import (
    DECODER_LINEARS,
    GROUP,
    Int4Linear,
    TREE_ROWS,
    _q_k_rows,
    check_precision,
    decode_q4_1,
    int4_available,
    invariant_rows,
    model_spec,
    prefill_weights,
    split_spec,
)
from specdemo.sampling import SamplingConfig
from specdemo.target import ModelLoadError, load_target
from specdemo.tree import DraftTree, TreeBuffers
from specdemo.verify import check_tree_support, prefilled_cache, trial_forward, tree_forward


def q4_1_blocks(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """GGUF Q4_1 bytes of (rows, in) weights q (0..15) with per-block d, m: fp16 d, fp16 m, 16 bytes of nibbles."""
    rows, cols = q.shape
    g = q.reshape(rows, cols // GROUP, GROUP).astype(np.uint8)
    nib = g[..., :16] | (g[..., 16:] << 4)
    dm = np.stack([d.astype(np.float16), m.astype(np.float16)], -1).view(np.uint8).reshape(rows, cols // GROUP, 4)
    return np.concatenate([dm, nib], -1).reshape(rows, -1)


def test_q4_1_blocks_decode_to_their_weights():
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, (8, 64))
    d, m = rng.uniform(1e-3, 1e-2, (8, 2)), rng.uniform(-0.1, 0, (8, 2))
    qq, dd, mm = decode_q4_1(q4_1_blocks(q, d, m))
    assert torch.equal(qq, torch.from_numpy(q.astype(np.int32)))
    assert torch.equal(dd, torch.from_numpy(d.astype(np.float16).astype(np.float32)))
    assert torch.equal(mm, torch.from_numpy(m.astype(np.float16).astype(np.float32)))


def test_q_k_row_order_undoes_the_rotary_permutation():
    # llama.cpp's converter: w.reshape(heads, 2, dim // heads // 2, ...).swapaxes(1, 2)
    heads, rows = 3, 24
    perm = np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)
    assert np.array_equal(perm[_q_k_rows(rows, heads)], np.arange(rows))


@needs_int4
def test_int4_layer_stays_within_the_bf16_scale_bound():
    """w = d·q + m as the kernel computes it: scale d and zero m + 8d rounded to bf16, so each weight is off by at
    most 8·|d − bf16(d)| + |z − bf16(z)| <= 2^-8 (8|d| + |z|); a 1-row product is x @ those weights."""
    rng = np.random.default_rng(1)
    q = rng.integers(0, 16, (64, 128))
    d, m = rng.uniform(1e-3, 2e-2, (64, 4)), rng.uniform(-0.2, 0, (64, 4))
    layer = Int4Linear.from_q4_1(q4_1_blocks(q, d, m))
    qt, dt, mt = decode_q4_1(q4_1_blocks(q, d, m))
    exact = dt.repeat_interleave(GROUP, 1) * qt + mt.repeat_interleave(GROUP, 1)  # the GGUF's de-quantised values
    z = mt + 8 * dt
    d_b, z_b = dt.bfloat16().float(), z.bfloat16().float()
    used = d_b.repeat_interleave(GROUP, 1) * (qt - 8) + z_b.repeat_interleave(GROUP, 1)
    bound = (2.0 ** -8) * (8 * dt.abs() + z.abs()).repeat_interleave(GROUP, 1)
    assert ((used - exact).abs() <= bound + 1e-9).all()
    x = torch.randn(3, 128).bfloat16().float()
    want = x @ used.t()
    got = layer(x)
    assert got.dtype == torch.float32
    assert (got - want).abs().max() <= 2.0 ** -7 * want.abs().max()  # the kernel's bf16 output rounding


@needs_int4
def test_prefill_weights_are_the_kernels_weights_in_bf16_and_only_inside_the_context():
    """A prompt's prefill runs on the int4 weights de-quantised to bf16 (each within 2^-8 relative of the weight the
    kernel uses); outside `prefill_weights`, and after an error inside it, the layer is the int4 kernel again."""
    rng = np.random.default_rng(2)
    q = rng.integers(0, 16, (64, 128))
    d, m = rng.uniform(1e-3, 2e-2, (64, 4)), rng.uniform(-0.2, 0, (64, 4))
    layer = Int4Linear.from_q4_1(q4_1_blocks(q, d, m))
    model = torch.nn.Sequential(layer)
    qt, dt, mt = decode_q4_1(q4_1_blocks(q, d, m))
    d_b, z_b = dt.bfloat16().float(), (mt + 8 * dt).bfloat16().float()
    used = d_b.repeat_interleave(GROUP, 1) * (qt - 8) + z_b.repeat_interleave(GROUP, 1)
    x = torch.randn(200, 128).bfloat16().float()
    kernel = layer(x)
    with prefill_weights(model):
        dense = layer(x)
    assert not torch.equal(dense, kernel)  # another kernel really ran
    want = x @ used.t()
    bound = 2.0 ** -8 * (x.abs() @ used.abs().t()) + 2.0 ** -7 * want.abs()  # bf16 weights, bf16 output
    assert ((dense - want).abs() <= bound).all()
    assert torch.equal(layer(x), kernel)
    with pytest.raises(RuntimeError), prefill_weights(model):
        raise RuntimeError("a failed prefill")
    assert not layer.prefilling and torch.equal(layer(x), kernel)


@needs_int4
def test_quantised_layer_is_close_to_the_dense_one():
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 64)
    layer = Int4Linear.quantize(lin)
    x = torch.randn(5, 128)
    err = (layer(x) - lin(x)).abs().max() / lin(x).abs().max()
    assert err < 0.1  # 4 bits per weight: ~1/15 of each group's range


def test_the_row_check_covers_the_engines_largest_tree():
    """invariant_rows's default row count is the root plus `GenerationConfig.max_tree_nodes` (precision.py cannot
    import the engine, which imports it): a larger cap would verify rows the load-time check never compared."""
    import inspect

    from specdemo.engine import GenerationConfig

    assert inspect.signature(invariant_rows).parameters["largest"].default == TREE_ROWS
    assert TREE_ROWS == GenerationConfig().max_tree_nodes + 1


class RowByRow(torch.nn.Linear):
    """Each row computed alone, so every row count gives the same bits; with `switch_at`, rows among that many or
    more get another rounding, as a kernel that blocks rows differently past a size does."""

    switch_at = 0

    def forward(self, x):
        y = torch.cat([torch.nn.functional.linear(r[None], self.weight, self.bias) for r in x])
        return y + 1e-3 if self.switch_at and len(x) >= self.switch_at else y


def test_invariant_rows_finds_the_row_count_where_a_kernel_changes():
    lin = RowByRow(8, 4)
    assert invariant_rows(lin) == TREE_ROWS
    for switch_at, most in ((5, 4), (33, 32), (40, 33), (2, 1)):
        lin.switch_at = switch_at
        assert invariant_rows(lin) == most < TREE_ROWS


def test_invariant_rows_reuses_a_layers_own_earlier_check():
    """A layer checked already with its current weights (the int4 LM head, at load) counts with that result and is
    not run again; a check made with other weights does not count."""
    lin = RowByRow(8, 4)
    lin.switch_at = 5
    lin.verified_rows = (9, None)  # its weights attribute: None (a plain layer)
    assert invariant_rows(lin) == 9  # the record, not the kernel's own 4
    lin.verified_rows = (9, "fp16")
    assert invariant_rows(lin) == 4


@pytest.mark.parametrize("precision", ["bf16", "int4"])
def test_every_linear_is_row_invariant(tiny_llama, precision):
    if precision == "int4" and not int4_available():
        pytest.skip("no int4 CPU kernel")
    target = load_target(str(tiny_llama.model.name_or_path), device="cpu", precision=precision)
    rows = invariant_rows(target.model)
    assert rows >= 25  # a CPU tree of 24 nodes (REST's cap) verifies row for row; oneDNN's bf16 on AMX: 32 rows
    check_tree_support(target)
    assert target.tree_rows == rows
    assert target.precision == precision and target.exact
    assert ("different model" in target.weights_note) == (precision == "int4")
    assert precision in target.describe()
    int4_head = "fp16" if fp16_available() else "bf16"  # precision._fp16_int4_head
    assert target.lm_head.weights == (int4_head if precision == "int4" else "bf16")


@needs_int4
def test_an_int4_head_whose_rows_differ_alone_stays_bf16(tiny_llama, monkeypatch):
    """The int4 model's LM head goes fp16 only where that product gives a row the bits it gets among others."""
    import specdemo.precision as precision

    monkeypatch.setattr(precision, "invariant_rows", lambda module, **_: 1 if module.weights == "fp16" else TREE_ROWS)
    target = load_target(str(tiny_llama.model.name_or_path), device="cpu", precision="int4")
    assert target.lm_head.weights == "bf16"


@needs_int4
def test_a_reduced_precision_target_decodes_and_passes_the_tree_check(tiny_llama):
    target = load_target(str(tiny_llama.model.name_or_path), device="cpu", precision="int4")
    check_tree_support(target)
    ids = target.encode_prompt("Hello there")
    out = [t for ev in generate(target, ids, None, GenerationConfig(max_new_tokens=8)) for t in ev.tokens]
    assert len(out) == 8


def test_bad_precisions_are_refused_with_the_allowed_ones(tiny_llama):
    with pytest.raises(ModelLoadError, match="fp32, bf16, int4"):
        load_target(str(tiny_llama.model.name_or_path), device="cpu", precision="int3")
    with pytest.raises(ValueError, match="fp32, bf16, int4"):
        check_precision("fp8")


def test_model_specs_name_a_precision():
    assert model_spec("embedded", "int4") == "embedded@int4"
    assert model_spec("embedded@bf16") == "embedded@bf16"
    assert model_spec(" owner/name ", "fp32") == "owner/name" == model_spec("owner/name@fp32")
    assert split_spec("owner/name@INT4") == ("owner/name", "int4") and split_spec("") == ("embedded", "fp32")
    with pytest.raises(ValueError, match="fp32, bf16, int4"):
        model_spec("embedded@int3")


@pytest.mark.slow
@needs_int4
def test_the_embedded_int4_weights_are_the_gguf_blocks(embedded):
    """The int4 target's decoder linears come from the GGUF's own Q4_1 blocks: decoded (rows back in transformers'
    order) they equal the weights transformers de-quantises from the same file, exactly."""
    import gguf

    from specdemo.target import embedded_gguf_path

    reader = gguf.GGUFReader(embedded_gguf_path())
    weights = dict(embedded.model.named_parameters())
    cfg, checked = embedded.model.config, 0
    for t in reader.tensors:
        if t.tensor_type.name != "Q4_1":
            continue
        _, layer, kind, _ = t.name.split(".")
        heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}.get(kind)
        rows = _q_k_rows(t.data.shape[0], heads) if heads else None
        q, d, m = decode_q4_1(np.asarray(t.data), rows)
        w = d.repeat_interleave(GROUP, 1) * q + m.repeat_interleave(GROUP, 1)
        assert torch.equal(w, weights[f"model.layers.{layer}.{DECODER_LINEARS[kind]}.weight"].cpu())
        checked += 1
    assert checked == 7 * cfg.num_hidden_layers
    int4 = load_target("embedded", device="cpu", precision="int4")
    assert "GGUF's own Q4_1" in int4.weights_note and invariant_rows(int4.model) == TREE_ROWS
    assert sum(isinstance(m, Int4Linear) for m in int4.model.modules()) == checked


# ------------------------------------------------------------------------------- lossless at every precision
@pytest.mark.parametrize("precision", REDUCED)
@pytest.mark.parametrize("parents", [[-1, 0, -1, 2], [-1, 0, 1, -1, 3, 0, 5, 1, 2, 6]], ids=["two-branch", "deep"])
def test_tree_rows_compute_exactly_what_one_token_steps_compute(tiny, precision, parents):
    """Row-exact attention: every row of a branching tree (rows move their ancestors into place, a side branch only
    what differs from the row before, and the tree is put back) gives the bitwise logits of one-token steps along its
    own path."""
    target = at_precision(tiny, precision)
    torch.manual_seed(0)
    ctx = torch.randint(100, 5000, (10 + len(parents),)).tolist()
    tree = DraftTree(tokens=ctx[10:], parents=parents)
    with torch.no_grad():
        rows, _ = trial_forward(target, prefilled_cache(target, ctx[:9], 16), ctx[9], tree)
        for row, node in enumerate(range(-1, len(parents))):  # row 0 is the root, row i + 1 is node i
            cache = prefilled_cache(target, ctx[:9], 16)
            for tok in [ctx[9]] + _path(tree, node):
                buf = TreeBuffers.build(DraftTree.empty(), cache.get_seq_length())
                want = target.lm_head(tree_forward(target, cache, [tok], buf))[0]
            assert torch.equal(rows[row], want)


def _path(tree: DraftTree, node: int) -> list[int]:
    """The tokens from the root's first child down to `node` (none for the root, -1)."""
    out = []
    while node >= 0:
        out.insert(0, tree.tokens[node])
        node = tree.parents[node]
    return out


@pytest.mark.parametrize("precision", REDUCED)
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(0.8, 0.9, 0, seed=7)], ids=["greedy", "sampling"])
def test_oracle_trees_are_lossless_at_reduced_precision(tiny, precision, sampling):
    target = at_precision(tiny, precision)
    torch.manual_seed(1)
    prompt = torch.randint(100, 5000, (12,)).tolist()
    cfg = GenerationConfig(max_new_tokens=32, sampling=sampling)
    ref, _ = run_to_end(target, prompt, None, cfg)
    out, events = run_to_end(target, prompt, OracleDrafter(ref, target.vocab_size, 3, probes=True), cfg)
    assert out == ref and len(events) < len(ref)


@needs_int4
def test_the_engine_prefills_on_the_prefill_weights_and_steps_on_the_int4_kernel(tiny, monkeypatch):
    """Through the transformers prefill (`Target.prefill`'s fallback; test_prefill.py covers the bf16 prefill)."""
    target = at_precision(tiny, "int4")
    monkeypatch.setattr(target, "bf16_prefill", None)
    seen = []  # (rows, on the prefill weights) per product: the module's forward, or its kernel called directly
    forward, kernel = Int4Linear.forward, Int4Linear.rows

    def spy_forward(self, x):
        if self.prefilling:
            seen.append((x.reshape(-1, self.in_features).shape[0], True))
        return forward(self, x)

    def spy_kernel(self, x):
        seen.append((x.shape[0], False))
        return kernel(self, x)

    monkeypatch.setattr(Int4Linear, "forward", spy_forward)
    monkeypatch.setattr(Int4Linear, "rows", spy_kernel)
    prompt = list(range(100, 120))
    run_to_end(target, prompt, OracleDrafter(run_to_end(target, prompt, None, GenerationConfig(8))[0],
                                             target.vocab_size, 3), GenerationConfig(max_new_tokens=8))
    assert {rows for rows, prefilling in seen if prefilling} == {len(prompt) - 1}
    steps = [rows for rows, prefilling in seen if not prefilling]  # AR steps and tree verifications
    assert steps and max(steps) > 1


@pytest.mark.parametrize("precision", REDUCED)
def test_only_the_prompts_prefill_runs_its_attention_in_bf16(tiny, precision, monkeypatch):
    """At bf16 and int4 a prompt's causal attention runs in bf16 inside `prefill_weights` (every layer, once), never in
    a decoding step, and the layers are unmarked again after the prefill, also after an error inside it."""
    from specdemo import cpu_attention

    target = at_precision(tiny, precision)
    monkeypatch.setattr(target, "bf16_prefill", None)  # the transformers prefill, which models without a CPU step take
    calls = []
    bf16_prefill = cpu_attention._bf16_prefill

    def spy(query, key, value, scaling):
        calls.append(query.shape[2])
        out = bf16_prefill(query, key, value, scaling)
        fp32 = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                                                enable_gqa=True).transpose(1, 2)
        # bf16 rounding of q, k and v (a wrong scale or a missing causal mask would be far off)
        assert out.dtype == query.dtype and (out - fp32).abs().max() <= 2.0 ** -4 * fp32.abs().max()
        return out

    monkeypatch.setattr(cpu_attention, "_bf16_prefill", spy)
    prompt = list(range(100, 120))
    run_to_end(target, prompt, None, GenerationConfig(max_new_tokens=6))
    assert calls == [len(prompt) - 1] * target.n_layers
    attn = [layer.self_attn for layer in target.decoder.layers]
    with pytest.raises(RuntimeError), prefill_weights(target.model):
        assert all(a.prefilling for a in attn)
        raise RuntimeError("a failed prefill")
    assert not any(getattr(a, "prefilling", False) for a in attn)


@pytest.mark.slow
@needs_int4
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(0.8, 0.9, 0, seed=11)], ids=["greedy", "sampling"])
def test_every_drafter_is_lossless_on_the_embedded_model_at_int4(embedded, sampling):
    from specdemo.drafters import make_drafter
    from specdemo.offline.build_datastore import ensure_default

    target = load_target("embedded", device="cpu", precision="int4")
    ensure_default(target, progress=False)
    cfg = GenerationConfig(max_new_tokens=32, sampling=sampling)
    for text in ("Write a Python function that checks whether a string is a palindrome.",
                 "Explain in two sentences why the sky is blue."):
        ids = target.encode_prompt(text)
        ref, _ = run_to_end(target, ids, None, cfg)
        for method in ("pld", "rest", "s4c", "sdsat"):
            assert run_to_end(target, ids, make_drafter(method, target), cfg)[0] == ref, method
