"""CPU fast path for the model's linear layers: oneDNN on weights packed once (what torch.compile's CPU freezing pass
emits), instead of `F.linear`'s MKL call that re-packs the weight on every small-batch GEMM.

Why it matters here: a verification forward over root + n tree nodes is a GEMM with n + 1 rows.  With plain
`F.linear` on this CPU, 2-16 rows cost 1.5-2x one row (MKL packs the whole weight per call for M > 1), so trees barely
paid.  With packed weights one row is ~1.5x faster (AR gets faster too) and 15 rows cost ~1.4x one row
(`scripts/verify_cost_curve.py`).  Each row's result is also the same whether it is computed alone or among 15 rows,
which keeps the tree's logits those of sequential decoding.

Only no-grad CPU forwards use the packed weight; training (autograd), other devices and dtypes take `F.linear`.  The
dense weight stays (tied embeddings, training) and is re-packed if it changes.  Opt out: SPECDEMO_PACKED_LINEAR=0.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F


def available() -> bool:
    return (os.environ.get("SPECDEMO_PACKED_LINEAR", "1") != "0" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedLinear(torch.nn.Linear):
    """An nn.Linear (same Parameters, so ties and state_dict keys are unchanged) with a packed-weight no-grad path."""

    @classmethod
    def wrap(cls, lin: torch.nn.Linear) -> "PackedLinear":
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = lin.in_features, lin.out_features
        new.register_parameter("weight", lin.weight)  # the same Parameter objects: ties survive
        new.register_parameter("bias", lin.bias)
        new._packed, new._packed_key, new._bf16_bias = None, None, None
        new.bf16 = False
        return new

    def _packed_weight(self) -> torch.Tensor | None:
        w = self.weight
        if w.device.type != "cpu" or w.dtype != torch.float32:
            return None
        key = (w.data_ptr(), w._version, self.bf16)
        if self._packed_key != key:
            src = w.detach().to(torch.bfloat16).contiguous() if self.bf16 else w.detach()
            self._packed = torch.ops.mkldnn._reorder_linear_weight(src, None)
            self._bf16_bias = None if self.bias is None or not self.bf16 else self.bias.detach().to(torch.bfloat16)
            self._packed_key = key
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() >= 2 \
                and x.numel():
            packed = self._packed_weight()
            if packed is not None and self.bf16:
                return _bf16_rows(x, packed, self._bf16_bias)
            if packed is not None:
                return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def _bf16_rows(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`x` (fp32, rows in its last dimension) through a bf16-packed weight, fp32 out.  One row is computed as two (the
    second zero): on some CPUs oneDNN's bf16 kernel takes another path for a single row than for several, which sums
    in another order (AVX-512 bf16 without AMX: the embedded model's 1,536-wide down projection gave ~10% of rows other
    bits alone than among others, while every count from two up agreed), and a tree's rows must get the bits of
    one-token steps.  Two rows cost what one does: the product streams the weight once either way."""
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    if rows.shape[0] == 1:
        y = torch.ops.mkldnn._linear_pointwise(torch.cat([rows, torch.zeros_like(rows)]), packed, bias, "none", [],
                                               "")[:1]
    else:
        y = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return y.reshape(*x.shape[:-1], y.shape[-1]).float()


def use_packed_linears(model: torch.nn.Module, max_bytes: int | None = None, draft_precision: bool = False) -> int:
    """Swap every nn.Linear of a CPU fp32 model for a PackedLinear; returns how many were swapped (0 = not used).

    The packed copies double the linear weights' memory, so this is skipped when they would exceed `max_bytes`
    (default: a quarter of physical memory).

    draft_precision: the model only drafts (its outputs rank candidates the target then verifies), so where the CPU
    has native bf16 the weights are packed in bf16: a drafter's 1-10 row products are memory-bound, and half the bytes
    make them faster after a verification has flushed the caches (fp32 rows in and out; see `frozen_linear`).
    """
    if not available():
        return 0
    linears = [(n, m) for n, m in model.named_modules() if type(m) is torch.nn.Linear
               and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32]
    if max_bytes is None:
        max_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    if not linears or sum(m.weight.numel() * 4 for _, m in linears) > max_bytes:
        return 0
    bf16 = draft_precision and bf16_available()
    for name, lin in linears:
        packed = PackedLinear.wrap(lin)
        packed.bf16 = bf16
        packed._packed_weight()  # pack now (~1-2 s for the embedded model), not in whichever request comes first
        model.set_submodule(name, packed)
    return len(linears)


NATIVE_BF16_ENV = "SPECDEMO_NATIVE_BF16"  # 0: run as on a CPU without native bf16 (every bf16 path off)


def bf16_available() -> bool:
    """Whether this CPU has native bf16 (AVX-512 bf16 or AMX) for oneDNN; SPECDEMO_NATIVE_BF16=0 answers no, so that a
    machine that has it can measure how the project runs on one that has not (AVX-512/AVX2 fp32 kernels only)."""
    if os.environ.get(NATIVE_BF16_ENV, "").strip() in ("0", "false", "no"):
        return False
    return available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def frozen_linear(weight: torch.Tensor, draft_precision: bool = False,
                  bias: torch.Tensor | None = None) -> torch.nn.Module:
    """`x @ weight.T` as a frozen linear layer, on the packed path wherever `use_packed_linears` would use it: a
    drafter's scoring matrix (1-3 rows against a few thousand vocabulary rows) runs 2-5x faster packed than as a plain
    matrix product on the 2-core dev CPU.

    draft_precision: the scores only rank draft candidates (the target verifies every draft), so where the CPU has
    native bf16 the matrix is packed in bf16: half the bytes to stream for each 1-3 row product, which is memory-bound
    (0.72 -> 0.47 ms for 2 rows against 6,911 vocabulary rows, caches flushed as a verification flushes them)."""
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    lin.weight = torch.nn.Parameter(weight.detach().contiguous(), requires_grad=False)
    if bias is not None:
        lin.bias = torch.nn.Parameter(bias.detach().contiguous(), requires_grad=False)
    if available() and weight.device.type == "cpu" and weight.dtype == torch.float32:
        lin = PackedLinear.wrap(lin)
        lin.bf16 = draft_precision and bf16_available()
        lin._packed_weight()
    return lin
