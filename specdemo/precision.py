"""The precision a CPU model's linear layers run at: fp32, bf16 or int4 weights (`--precision`, the page's picker).

Why: a decoding step on the CPU is mostly its linear layers streaming weights.  The embedded model ships as 4-bit
GGUF `Q4_1` blocks (32 weights, an fp16 scale d and minimum m per block), and torch has a CPU kernel for exactly that
layout (`_weight_int4pack_mm_for_cpu`, group 32, w = scale·(q − 8) + zero): Q4_1's w = d·q + m is scale d and zero
m + 8d, so the file's own 4-bit weights feed the kernel without re-quantising.  One 1-row step's decoder linears take
~5 ms that way against ~24 ms dequantised to fp32 on the 2-core dev machine.

    fp32  the weights de-quantised to fp32, oneDNN-packed (cpu_linear.py): the reference
    bf16  every linear bf16-packed (oneDNN), fp32 activations in and out (a rounding of the fp32 weights)
    int4  the decoder's linears in torch's int4 layout (the GGUF's Q4_1 blocks for the embedded model; other models
          are quantised group-wise here, which makes a different model than the checkpoint), LM head bf16-packed

The int4 kernel is fast only on bf16 activations (fp32 ones take a scalar path ~20x slower), so an int4 linear
rounds its input to bf16 and its scales to bf16: a weight differs from the GGUF's de-quantised value by at most
8·|d − bf16(d)| + |z − bf16(z)| ≤ 2⁻⁸·(8|d| + |z|) (bf16 keeps 8 significant bits).  Every linear here gives a row
the same result alone or among others, up to a row count measured at load (`invariant_rows`).  That alone does not
keep drafted output that of plain decoding: the CPU attention kernel sums a one-token step's keys in another order
than a multi-row masked call does, and where fp32 keeps those last-bit differences below any near-tie, the bf16
rounding of each linear's input turns them into 2⁻⁸ steps that flip near-ties (measured: identical on 40-80% of
prompts).  So at bf16 and int4 the model's attention is `cpu_attention.row_exact_sdpa`, in which each verification row
makes the very call a one-token step makes; with it every mode is token-identical to AR at the same precision.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from specdemo.cpu_attention import ROW_EXACT, use_row_exact_attention
from specdemo.cpu_linear import PackedLinear, bf16_available, fp16_available

PRECISIONS = ("fp32", "bf16", "int4")
DEFAULT_MODEL = "embedded"  # target.EMBEDDED (precision.py sits below target.py)
GROUP = 32  # Q4_1's block: the int4 kernel's group size
DECODER_LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                   "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                   "ffn_down": "mlp.down_proj"}


def check_precision(precision: str | None) -> str:
    """The precision asked for, or a ValueError that names the allowed ones."""
    p = (precision or "fp32").strip().lower()
    if p not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (got {precision!r})")
    return p


SEP = "@"  # "embedded@int4": a model at a CPU precision (precision.py); no hub id or usual folder holds an "@"


def model_spec(name: str | None, precision: str | None = None) -> str:
    """The cache's key of a model at a precision: "embedded", "embedded@int4" (fp32 has no suffix); `precision`, when
    given, wins over a suffix of `name`.  An unknown precision is a ValueError naming the allowed ones."""
    base, asked = split_spec(name)
    return join_spec(base, check_precision(precision or asked))


def join_spec(base: str, precision: str) -> str:
    """"embedded", "int4" -> "embedded@int4"; fp32 has no suffix.  Checks nothing (model_spec does)."""
    return base if precision == "fp32" else f"{base}{SEP}{precision}"


def split_spec(spec: str | None) -> tuple[str, str]:
    """("embedded", "int4") of "embedded@int4"; a bare name is fp32.  An unknown precision is left to be refused by
    check_precision with the allowed ones named."""
    text = (spec or DEFAULT_MODEL).strip() or DEFAULT_MODEL
    base, sep, precision = text.rpartition(SEP)
    if not sep or not base.strip():
        return text, "fp32"
    return base.strip(), precision.strip().lower() or "fp32"


def default_precision() -> str:
    """The precision the page and the CLIs start at: int4, whose best mode ran fastest of the three on the tune
    prompts (docs/precision.md), where this CPU has torch's int4 kernel and native bf16; else fp32 (and on a GPU).
    A model named without a precision ("embedded", the API's default) is fp32."""
    return "int4" if int4_available() and not torch.cuda.is_available() else "fp32"


# torch's int4 CPU kernel as its resolved overload (None in a build without it)
_INT4_MM = getattr(getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None), "default", None)


def int4_available() -> bool:
    return _INT4_MM is not None and bf16_available()


class Int4Linear(torch.nn.Module):
    """A linear layer on int4 group-32 weights (torch's packed CPU layout), bf16 activations inside, the caller's dtype
    outside.  Inference only: it has no dense weight to train.

    A prompt's prefill (`prefill_weights`) takes the same weights de-quantised to bf16 and oneDNN-packed instead: the
    int4 kernel unpacks every group for every block of rows, so hundreds of rows cost hundreds of steps' worth, where
    bf16 on AMX/AVX-512 runs a 1,000-token prompt's linears ~5x faster.  Every mode prefills the same way and every
    decoding step (AR, tree verification) runs the int4 kernel, so drafted output stays plain decoding's."""

    ROW_BLOCK = 64  # the packed layout interleaves output rows in blocks of 64: layers concatenate at block bounds

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bias: torch.Tensor | None = None):
        """q: (out, in) int values 0..15; scale, zero: (out, in // 32), w = scale·(q − 8) + zero."""
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 2))
        self.register_buffer("scales_zeros", torch.stack([scale.t(), zero.t()], -1).to(torch.bfloat16).contiguous())
        self.bias = bias
        self.prefilling = False
        self.prefill_weight = self._prefill_weight(q) if bf16_available() else None

    def _prefill_weight(self, q: torch.Tensor) -> torch.Tensor:
        """The weights as the int4 kernel sees them (bf16 scale and zero), rounded to bf16 and packed for oneDNN."""
        sz = self.scales_zeros.float()  # (in // 32, out, 2)
        scale, zero = (sz[..., i].t().repeat_interleave(GROUP, 1) for i in (0, 1))
        w = (scale * (q.float() - 8) + zero).to(torch.bfloat16).contiguous()
        return torch.ops.mkldnn._reorder_linear_weight(w, None)

    @classmethod
    def from_q4_1(cls, blocks: np.ndarray, rows: np.ndarray | None = None) -> "Int4Linear":
        """From GGUF Q4_1 blocks (see `decode_q4_1`)."""
        q, d, m = decode_q4_1(blocks, rows)
        return cls(q, d, m + 8 * d)

    @classmethod
    def concat(cls, parts: "list[Int4Linear] | tuple[Int4Linear, ...]") -> "Int4Linear":
        """One layer computing `parts` side by side (outputs concatenated), from their packed blocks, scales and zeros
        as they are: each output row is the same computation as in its own layer.  No prefill weight: a fused layer
        serves decoding steps (step_decoder.py), not prefills."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = parts[0].in_features, sum(p.out_features for p in parts)
        new.register_buffer("packed", torch.cat([p.packed for p in parts]))
        new.register_buffer("scales_zeros", torch.cat([p.scales_zeros for p in parts], dim=1))
        new.bias = None if parts[0].bias is None else torch.cat([p.bias for p in parts])
        new.prefilling, new.prefill_weight = False, None
        return new

    @classmethod
    def quantize(cls, lin: torch.nn.Linear) -> "Int4Linear":
        """Group-wise asymmetric 4-bit quantisation of a dense layer (min/max per group of 32, as Q4_1 does)."""
        w = lin.weight.detach().float()
        g = w.reshape(w.shape[0], -1, GROUP)
        lo, hi = g.amin(-1), g.amax(-1)
        d = ((hi - lo) / 15).clamp_min(1e-12)
        q = ((g - lo[..., None]) / d[..., None]).round().clamp(0, 15).reshape(w.shape)
        bias = None if lin.bias is None else lin.bias.detach().float()
        return cls(q.to(torch.int32), d, lo + 8 * d, bias)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """The int4 product of rows `x` (n, in) -> (n, out) in `x`'s dtype, bias included.  A decoding step makes 120
        of these, so the kernel is called as its resolved overload and the casts by their short forms: 4-8 µs less
        Python per product than through `torch.ops`' overload lookup and `.to`."""
        y = _INT4_MM(x.bfloat16(), self.packed, GROUP, self.scales_zeros)
        y = y.float() if x.dtype == torch.float32 else y.to(x.dtype)
        return y if self.bias is None else y + self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if self.prefilling and self.prefill_weight is not None:
            y = torch.ops.mkldnn._linear_pointwise(flat.to(torch.bfloat16), self.prefill_weight, None, "none", [],
                                                   "").to(x.dtype)
            y = y if self.bias is None else y + self.bias
        else:
            y = self.rows(flat)
        return y.reshape(*x.shape[:-1], self.out_features)


@contextmanager
def prefill_weights(model: torch.nn.Module) -> Iterator[None]:
    """Within it, a prompt's prefill runs as this precision prefills: an int4 model's layers on their bf16 prefill
    weights (see Int4Linear), and at bf16 and int4 (the models on row-exact attention) the prompt's causal attention
    in bf16 (`cpu_attention.row_exact_sdpa`).  For a prompt's prefill, never for a decoding step; a no-op at fp32."""
    flagged = [m for m in model.modules() if isinstance(m, Int4Linear)]
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == ROW_EXACT:
        flagged += [layer.self_attn for layer in getattr(model.get_decoder(), "layers", ())]
    for m in flagged:
        m.prefilling = True
    try:
        yield
    finally:
        for m in flagged:
            m.prefilling = False


def decode_q4_1(blocks: np.ndarray, rows: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, d, m) of GGUF Q4_1 blocks, (out, in // 32 · 20) bytes: per block d and m (fp16), then 16 bytes of nibbles
    (low nibbles are weights 0-15, high nibbles 16-31); w = d·q + m.  `rows`: the output-row order to take them in."""
    b = blocks if rows is None else blocks[rows]
    b = b.reshape(b.shape[0], -1, 20)
    d = b[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = b[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    nib = b[:, :, 4:20]
    q = np.concatenate([nib & 0x0F, nib >> 4], axis=-1).reshape(b.shape[0], -1)
    return torch.from_numpy(q.astype(np.int32)), torch.from_numpy(d), torch.from_numpy(m)


def _q_k_rows(n_rows: int, n_head: int) -> np.ndarray:
    """The row order that undoes llama.cpp's rotary permutation of q/k weights (transformers undoes it the same way
    when it de-quantises a GGUF)."""
    dim = n_rows // n_head // 2
    return np.arange(n_rows).reshape(n_head, dim, 2).swapaxes(2, 1).reshape(-1)


def gguf_int4_layers(gguf_path: Path, config) -> dict[str, Int4Linear]:
    """{module name: Int4Linear} for every Q4_1 decoder linear of a llama GGUF."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    out = {}
    for t in reader.tensors:
        block, _, rest = t.name.partition(".")
        layer, _, kind = rest.partition(".")
        kind = kind.removesuffix(".weight")
        if block != "blk" or kind not in DECODER_LINEARS or t.tensor_type.name != "Q4_1":
            continue
        blocks = np.asarray(t.data)
        rows = None
        if kind == "attn_q":
            rows = _q_k_rows(blocks.shape[0], config.num_attention_heads)
        elif kind == "attn_k":
            rows = _q_k_rows(blocks.shape[0], config.num_key_value_heads)
        out[f"model.layers.{layer}.{DECODER_LINEARS[kind]}"] = Int4Linear.from_q4_1(blocks, rows)
    return out


def _decoder_linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    head = model.get_output_embeddings()
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and m is not head and ".layers." in f".{n}"]


def apply_precision(model: torch.nn.Module, precision: str, gguf_path: Path | None = None) -> str:
    """Put a CPU fp32 model's linears at `precision` (after cpu_linear.use_packed_linears); returns what its weights
    are, for the page's header ("" for fp32)."""
    precision = check_precision(precision)
    if precision == "fp32":
        return ""
    if not bf16_available():
        raise ValueError(f"precision {precision} needs a CPU with native bf16 (AVX-512 bf16 or AMX); use fp32")
    if precision == "int4" and not int4_available():
        raise ValueError("precision int4 needs torch's int4 CPU kernel and native bf16; use fp32 or bf16")
    use_row_exact_attention(model)
    head = model.get_output_embeddings()
    bf16_packed = [m for _, m in _decoder_linears(model)] if precision == "bf16" else []
    if not (precision == "int4" and isinstance(head, PackedLinear) and _fp16_int4_head(head)):
        bf16_packed.append(head)  # the LM head is bf16 at bf16, and at int4 where fp16 does not keep its rows exact
    for m in bf16_packed:
        if isinstance(m, PackedLinear):
            m.weights = "bf16"
            m._packed_weight()
    if precision == "bf16":
        return "bf16 weights (rounded from fp32)"
    from_gguf = gguf_int4_layers(gguf_path, model.config) if gguf_path else {}
    linears = _decoder_linears(model)
    for name, lin in linears:
        model.set_submodule(name, from_gguf[name] if name in from_gguf else Int4Linear.quantize(lin))
    if from_gguf and len(from_gguf) == len(linears):
        return "int4 weights (the GGUF's own Q4_1 blocks)"
    return "int4 weights (quantised here, group 32: a different model than the checkpoint)"


def _fp16_int4_head(head: PackedLinear) -> bool:
    """Put an int4 model's LM head in fp16 (fbgemm) where that product gives a row the same bits alone as among
    others; whether it did.  In a step it is as fast as oneDNN's bf16 head (1.0 ms either way at int4 on the 2-core
    AMD EPYC, `scripts/step_breakdown.py`), and with 11 mantissa bits to bf16's 8 it is closer to the GGUF's Q8_0
    embedding.  From ~16 rows on it is the slower one; a CPU tree at int4 rarely has more than 4."""
    if not fp16_available():
        return False
    head.weights = "fp16"
    rows = invariant_rows(head)  # packs it; where it falls short, the caller packs it in bf16
    head.verified_rows = (rows, head.weights)  # the load-time tree check (`verify.check_tree_support`) reuses it
    return rows >= TREE_ROWS


TREE_ROWS = 65  # the root and the engine's largest tree (`GenerationConfig.max_tree_nodes`; a test ties the two)


@torch.no_grad()
def invariant_rows(model: torch.nn.Module, largest: int = TREE_ROWS, trials: int = 3, also: tuple = ()) -> int:
    """The most rows n (up to `largest`) for which every distinct kind of linear layer gives each row the same result
    alone as among any 2..n rows, bitwise, on `trials` random inputs: what keeps a tree verification's logits those of
    one-token steps, for trees of up to n - 1 nodes.  `largest` defaults to the root and the engine's largest tree
    (`GenerationConfig.max_tree_nodes`).  A kernel may differ on only some rows and inputs (oneDNN's bf16 single-row
    path did on ~10% of rows) or from some row count on (oneDNN's bf16 products from 33 rows on, on an Intel Xeon with
    AMX: its tile kernel sums in another order), so every row of every count up to 33 is compared, then 48, 64 and
    `largest`.  1: even two rows differ.  `also`: more layers to check (the CPU step's fused products)."""
    g = torch.Generator().manual_seed(0)
    counts = sorted({*range(2, min(largest, 33) + 1), *(n for n in (48, 64, largest) if n <= largest)})
    most = largest
    seen = set()
    for m in (*model.modules(), *also):
        if not isinstance(m, (torch.nn.Linear, Int4Linear)):
            continue
        key = (type(m), m.in_features, m.out_features, getattr(m, "weights", None))
        if key in seen:
            continue
        seen.add(key)
        known = getattr(m, "verified_rows", None)  # (rows, weights) this very layer was checked with, all rows
        if known is not None and known[1] == key[-1]:  # of every count compared (the int4 LM head: _fp16_int4_head)
            most = min(most, known[0])
            if most == 1:
                return 1
            continue
        for _ in range(trials):
            x = torch.randn(most, m.in_features, generator=g)
            alone = torch.cat([m(x[i : i + 1]) for i in range(most)])
            bad = next((n for n in counts if n <= most and not torch.equal(m(x[:n]), alone[:n])), None)
            if bad is not None:
                most = max(n for n in (1, *counts) if n < bad)
                if most == 1:
                    return 1
    return most

