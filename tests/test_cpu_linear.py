"""The oneDNN packed-weight linear path (cpu_linear.py): same results as F.linear, autograd untouched, ties kept."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdemo import cpu_linear
from specdemo.cpu_linear import PackedLinear, use_packed_linears

pytestmark = pytest.mark.skipif(not cpu_linear.available(), reason="this torch build has no oneDNN linear ops")


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def test_packed_model_matches_plain_and_keeps_ties_and_keys():
    model = _model()
    ids = torch.randint(0, 300, (1, 17))
    with torch.no_grad():
        want = model(ids).logits
    keys = list(model.state_dict())
    n = use_packed_linears(model)
    assert n == 2 * 7 + 1  # 7 linears per layer + the LM head
    assert all(type(m) is not torch.nn.Linear for m in model.modules())
    assert model.lm_head.weight is model.get_input_embeddings().weight  # the tie survives the swap
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 15, 16, 33])
def test_packed_linear_any_row_count_and_strided_input(rows):
    lin = torch.nn.Linear(48, 80)
    packed = PackedLinear.wrap(lin)
    x = torch.randn(1, rows, 96)[..., ::2]  # non-contiguous input
    with torch.no_grad():
        torch.testing.assert_close(packed(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


def test_packed_linear_1d_and_empty_inputs():
    lin = torch.nn.Linear(8, 4)
    packed = PackedLinear.wrap(lin)
    with torch.no_grad():
        for x in (torch.randn(8), torch.randn(0, 8), torch.randn(1, 0, 8)):
            torch.testing.assert_close(packed(x), lin(x))


def test_weight_change_is_seen_and_autograd_uses_plain_path():
    lin = torch.nn.Linear(32, 16, bias=False)
    packed = PackedLinear.wrap(lin)
    x = torch.randn(4, 32)
    with torch.no_grad():
        before = packed(x)
        lin.weight.mul_(2)  # in place, as an optimizer step would
        torch.testing.assert_close(packed(x), 2 * before, rtol=1e-5, atol=1e-5)
    w = torch.nn.Parameter(torch.randn(16, 32))
    packed.weight = w
    y = packed(x.requires_grad_())
    y.sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(4, 16).t() @ x.detach())


@pytest.mark.skipif(not cpu_linear.bf16_available(), reason="this CPU has no native bf16")
def test_bf16_weights_pack_bf16_and_keep_fp32_io():
    """A drafting model's linears in bf16: fp32 rows in and out, within bf16 rounding of F.linear; the fp32 weights
    (state dict, autograd) are untouched."""
    model = _model()
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    n = use_packed_linears(model, weights="bf16")
    assert n and all(m.weights == "bf16" for m in model.modules() if isinstance(m, PackedLinear))
    lin = model.model.layers[0].mlp.up_proj
    x = torch.randn(3, 64)
    with torch.no_grad():
        y = lin(x)
        want = F.linear(x, lin.weight, lin.bias)
    assert y.dtype == torch.float32
    assert not torch.equal(y, want)  # really the bf16 product
    torch.testing.assert_close(y, want, rtol=2e-2, atol=2e-2)
    assert all(torch.equal(v, keys[k]) for k, v in model.state_dict().items())


def test_a_cpu_without_native_bf16_packs_no_bf16_and_refuses_reduced_precisions(monkeypatch):
    """SPECDEMO_NATIVE_BF16=0 runs the project as on a CPU without native bf16: linears asked for in bf16 stay fp32,
    drafting linears take fp16 where fbgemm has it (it needs AVX2, not native bf16), and the bf16 and int4 precisions
    are refused with a message naming what to use."""
    from specdemo.precision import apply_precision, default_precision

    monkeypatch.setenv("SPECDEMO_NATIVE_BF16", "0")
    model = _model()
    assert use_packed_linears(model, weights="bf16")
    assert all(m.weights == "fp32" for m in model.modules() if isinstance(m, PackedLinear))
    assert cpu_linear.draft_weights() == ("fp16" if cpu_linear.fp16_available() else "fp32")
    assert default_precision() == "fp32"
    for precision in ("bf16", "int4"):
        with pytest.raises(ValueError, match="native bf16.*use fp32"):
            apply_precision(_model(), precision)


def test_opt_out_and_memory_guard(monkeypatch):
    monkeypatch.setenv("SPECDEMO_PACKED_LINEAR", "0")
    assert use_packed_linears(_model()) == 0
    monkeypatch.delenv("SPECDEMO_PACKED_LINEAR")
    assert use_packed_linears(_model(), max_bytes=1000) == 0  # would not fit: left as it is


@pytest.mark.parametrize("rows", [1, 3, 10])
def test_frozen_linear_scores_like_the_plain_product_on_the_packed_path(rows):
    torch.manual_seed(1)
    w = torch.randn(700, 64)  # a scoring matrix: vocabulary rows x hidden size
    x = torch.randn(rows, 64)
    lin = cpu_linear.frozen_linear(w)
    assert isinstance(lin, PackedLinear) and not lin.weight.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(lin(x), x @ w.T, rtol=1e-5, atol=1e-5)
    assert type(cpu_linear.frozen_linear(w.double())) is torch.nn.Linear  # other dtypes: the plain layer


@pytest.mark.skipif(not cpu_linear.bf16_available(), reason="this CPU has no native bf16")
def test_bf16_scores_rank_like_the_fp32_product():
    torch.manual_seed(2)
    w = torch.randn(5000, 64)
    x = torch.randn(3, 64)
    lin = cpu_linear.frozen_linear(w, weights="bf16")
    with torch.no_grad():
        got, want = lin(x), x @ w.T
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=2e-2, atol=0.1)  # bf16 has 8 mantissa bits
    # the top candidates a drafter keeps: the fp32 top-1 is among the bf16 top-3, row by row
    assert all(int(want[r].argmax()) in got[r].topk(3).indices.tolist() for r in range(3))


@pytest.mark.skipif(not cpu_linear.fp16_available(), reason="no fbgemm fp16 product on this CPU")
@pytest.mark.parametrize("rows", [1, 3, 10])
def test_fp16_weights_compute_the_product_of_the_fp16_rounded_weights(rows):
    """A drafter's fp16 product (fbgemm): fp32 rows in and out, and the product of the weights rounded to fp16 (11
    mantissa bits) with a float32 sum, bias included; state dict and autograd keep the fp32 weights."""
    torch.manual_seed(3)
    w, b = torch.randn(700, 64), torch.randn(700)
    lin = cpu_linear.frozen_linear(w, weights="fp16", bias=b)
    assert lin.weights == "fp16"
    x = torch.randn(rows, 64)
    with torch.no_grad():
        got = lin(x)
        rounded = x @ w.half().float().T + b
    assert got.dtype == torch.float32 and got.shape == (rows, 700)
    assert not torch.equal(got, x @ w.T + b)  # really the fp16 weights
    torch.testing.assert_close(got, rounded, rtol=1e-4, atol=1e-4)
    assert torch.equal(lin.weight, w)
    model = _model()
    assert use_packed_linears(model, weights="fp16")
    assert all(m.weights == "fp16" for m in model.modules() if isinstance(m, PackedLinear))
    assert cpu_linear.draft_weights() == "fp16"


def test_weights_fall_back_to_what_the_cpu_has(monkeypatch):
    """fp16 falls back to bf16 where fbgemm's product is missing, and bf16 to fp32 without native bf16; an unknown
    kind is refused with the allowed ones named."""
    monkeypatch.setattr(cpu_linear, "fp16_available", lambda: False)
    assert cpu_linear.usable_weights("fp16") == ("bf16" if cpu_linear.bf16_available() else "fp32")
    monkeypatch.setenv("SPECDEMO_NATIVE_BF16", "0")
    assert cpu_linear.usable_weights("fp16") == cpu_linear.usable_weights("bf16") == "fp32"
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        cpu_linear.usable_weights("int8")


def test_s4c_heads_run_on_the_packed_path(embedded):
    from specdemo.drafters import make_drafter

    drafter = make_drafter("s4c", embedded)
    linears = [m for m in drafter.heads.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m, PackedLinear) for m in linears)


@pytest.mark.skipif(not cpu_linear.bf16_available(), reason="no native bf16 on this CPU")
def test_a_bf16_row_gets_the_same_bits_alone_as_among_others():
    """A tree's rows must equal one-token steps bit for bit: each row alone equals the same row among 2, 3, 5 or 16
    (oneDNN's one-row bf16 path summed a 1,536-wide product in another order on an AVX-512 bf16 CPU without AMX)."""
    g = torch.Generator().manual_seed(0)
    lin = PackedLinear.wrap(torch.nn.Linear(1536, 576))
    lin.weights = "bf16"
    with torch.no_grad():
        lin.weight.copy_(torch.randn(576, 1536, generator=g) / 40)
        for _ in range(4):
            x = torch.randn(16, 1536, generator=g)
            alone = torch.cat([lin(x[i : i + 1]) for i in range(16)])
            for n in (2, 3, 5, 16):
                assert torch.equal(lin(x[:n]), alone[:n])
