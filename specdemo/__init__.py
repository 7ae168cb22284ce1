"""specdemo: speculative decoding made visible (REST, S4C, SDSAT, prompt lookup) on one lossless tree engine."""
import os
from pathlib import Path

# MKL's conditional numerical reproducibility, set before anything calls MKL (it reads this once, at its first call).
# torch's CPU flash-attention kernel multiplies through MKL, whose default code path depends on the alignment of each
# thread's scratch buffer, so a query's last bits depend on which thread computes it: a tree row batched with others
# then differs from its one-token call, and the row-exact attention of bf16 and int4 has to make one call per row.
# STRICT keeps MKL's fastest instruction set and makes a query's result the same on every thread
# (`cpu_attention.batches_are_exact` checks, and falls back to one call per row where MKL ran first).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"
ASSETS = Path(__file__).resolve().parent.parent / "assets"  # the shipped artifacts, prompts and page style
