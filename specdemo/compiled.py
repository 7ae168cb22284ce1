"""`torch.compile` of a CPU model's decoder forward: the ~10 ms of small operations per step (norms, rotary
embeddings, residuals, dtype casts, Python) fused into generated C++ kernels.

Why: once the linears run at the model's own 4-bit precision (precision.py) they take ~5 ms of a ~21 ms step on the
2-core dev machine, and the rest is work that Inductor fuses: the compiled step takes ~15 ms.  One graph serves every
step: shapes are dynamic (rows = root + draft nodes, keys = the context), so AR steps, tree verifications and prefills
reuse a few compiled graphs.  The first compilation takes minutes on 2 cores (Inductor caches its kernels on disk, so
a later process pays less), which is why it is asked for (`--compile`, SPECDEMO_COMPILE=1) and not on by default in
tests; `warm_up` runs it once at load time so that no request pays for it.

Losslessness holds as before: AR and tree verification both run the compiled graph, whose per-row arithmetic does not
depend on how many rows there are (each mode stays token-identical to AR with the same settings).
"""
from __future__ import annotations

import os

import torch

ENV = "SPECDEMO_COMPILE"


def wanted(asked: bool | None) -> bool:
    """Compile when asked; None reads SPECDEMO_COMPILE ("1" = on; off otherwise)."""
    return asked if asked is not None else os.environ.get(ENV, "0") == "1"


def compile_decoder(model: torch.nn.Module) -> None:
    """Replace the decoder's forward by its compiled version (the module and its weights are unchanged)."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    decoder = model.get_decoder()
    decoder.forward = torch.compile(decoder.forward, dynamic=True)
