"""CPU fast path for the model's linear layers: oneDNN on weights packed once (what torch.compile's CPU freezing pass
emits), instead of `F.linear`'s MKL call that re-packs the weight on every small-batch GEMM.

Why it matters here: a verification forward over root + n tree nodes is a GEMM with n + 1 rows.  With plain
`F.linear` on this CPU, 2-16 rows cost 1.5-2x one row (MKL packs the whole weight per call for M > 1), so trees barely
paid.  With packed weights one row is ~1.5x faster (AR gets faster too) and 15 rows cost ~1.4x one row
(`scripts/verify_cost_curve.py`).  Each row's result is also the same whether it is computed alone or among 15 rows,
which keeps the tree's logits those of sequential decoding.

Only no-grad CPU forwards use the packed weight; training (autograd), other devices and dtypes take `F.linear`.  The
dense weight stays (tied embeddings, training) and is re-packed if it changes.  Opt out: SPECDEMO_PACKED_LINEAR=0.

A packed layer's `weights` say what it multiplies with: "fp32" or "bf16" (oneDNN; the target's precisions), or "fp16"
(fbgemm's fp16-weight product, fp32 rows in and out), which only drafters use (`draft_weights`).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F


def available() -> bool:
    return (os.environ.get("SPECDEMO_PACKED_LINEAR", "1") != "0" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


WEIGHTS = ("fp32", "bf16", "fp16")  # what a PackedLinear's packed copy holds


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
        new.weights = "fp32"
        return new

    def _packed_weight(self) -> torch.Tensor | None:
        w = self.weight
        if w.device.type != "cpu" or w.dtype != torch.float32:
            return None
        # an inference tensor (made in generate) has no version counter: it never changes in place
        key = (w.data_ptr(), 0 if w.is_inference() else w._version, self.weights)
        if self._packed_key != key:
            bias = None if self.bias is None else self.bias.detach()
            if self.weights == "fp16":  # fbgemm packs the bias with the weight
                self._packed = torch.ops.quantized.linear_prepack_fp16(w.detach().contiguous(), bias)
            else:
                bf16 = self.weights == "bf16"
                src = w.detach().to(torch.bfloat16).contiguous() if bf16 else w.detach()
                self._packed = torch.ops.mkldnn._reorder_linear_weight(src, None)
                self._bf16_bias = bias.to(torch.bfloat16) if bf16 and bias is not None else None
            self._packed_key = key
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() >= 2 \
                and x.numel():
            packed = self._packed_weight()
            if packed is not None and self.weights == "fp16":
                return torch.ops.quantized.linear_dynamic_fp16(x, packed)
            if packed is not None and self.weights == "bf16":
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


def use_packed_linears(model: torch.nn.Module, max_bytes: int | None = None, weights: str = "fp32") -> int:
    """Swap every nn.Linear of a CPU fp32 model for a PackedLinear; returns how many were swapped (0 = not used).

    The packed copies double the linear weights' memory, so this is skipped when they would exceed `max_bytes`
    (default: a quarter of physical memory).

    weights: what the packed copies hold (`WEIGHTS`; one this CPU lacks falls back as `usable_weights` says).  A model
    that only drafts (its outputs rank candidates the target then verifies) takes `draft_weights()`.
    """
    if not available():
        return 0
    linears = [(n, m) for n, m in model.named_modules() if type(m) is torch.nn.Linear
               and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32]
    if max_bytes is None:
        max_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    if not linears or sum(m.weight.numel() * 4 for _, m in linears) > max_bytes:
        return 0
    weights = usable_weights(weights)
    for name, lin in linears:
        packed = PackedLinear.wrap(lin)
        packed.weights = weights
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


def fp16_available() -> bool:
    """Whether this torch and CPU have fbgemm's fp16-weight products (x86 with AVX2 or AVX-512)."""
    return (available() and "fbgemm" in torch.backends.quantized.supported_engines
            and hasattr(torch.ops.quantized, "linear_dynamic_fp16")
            and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"))


def usable_weights(weights: str) -> str:
    """`weights` where this CPU has their kernel; else fp16 falls back to bf16, and bf16 to fp32."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)} (got {weights!r})")
    if weights == "fp16" and not fp16_available():
        weights = "bf16"
    if weights == "bf16" and not bf16_available():
        weights = "fp32"
    return weights


def draft_weights() -> str:
    """What a drafter's linears multiply with on this CPU: fp16 through fbgemm where it runs.

    A drafter's products have 1-10 rows and run right after a verification has flushed the caches, so each streams its
    weights from memory; its outputs only rank candidates the target then verifies, so reduced precision costs
    nothing but a rare different candidate.  fbgemm's fp16 product (fp32 rows in and out) beats oneDNN's bf16 one at
    these sizes — a 4,096 x 576 scoring matrix, one row, caches warm: 81 against 223 µs on the 2-core AMD EPYC with
    AVX-512 bf16 — and keeps 11 mantissa bits to bf16's 8; it also runs on AVX2 CPUs without native bf16."""
    return usable_weights("fp16")


def frozen_linear(weight: torch.Tensor, weights: str = "fp32",
                  bias: torch.Tensor | None = None) -> torch.nn.Module:
    """`x @ weight.T` as a frozen linear layer, on the packed path wherever `use_packed_linears` would use it: a
    drafter's scoring matrix (1-3 rows against a few thousand vocabulary rows) runs 2-5x faster packed than as a plain
    matrix product on the 2-core dev CPU.

    weights: what the packed copy holds (`use_packed_linears`); a drafter's scoring matrix takes `draft_weights()`."""
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    lin.weight = torch.nn.Parameter(weight.detach().contiguous(), requires_grad=False)
    if bias is not None:
        lin.bias = torch.nn.Parameter(bias.detach().contiguous(), requires_grad=False)
    if available() and weight.device.type == "cpu" and weight.dtype == torch.float32:
        lin = PackedLinear.wrap(lin)
        lin.weights = usable_weights(weights)
        lin._packed_weight()
    return lin
