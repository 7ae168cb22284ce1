"""The live plots' data: tokens vs compute time, tokens per step, draft vs verify time per step (frames, no gradio)."""
from __future__ import annotations

from collections import Counter

import pandas as pd

from specdemo.app.race import Run
from specdemo.app.session import RaceRecord

SERIES = {"ar": "autoregressive", "spec": "speculative"}


def plots(rec: RaceRecord | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Tokens vs compute time (both runs), tokens per step (spec), draft vs verify ms per step (spec).

    Gradio's plots fix their axis types and colour categories from the first value they draw and only swap the data
    afterwards, so every frame has explicit dtypes and always holds every colour category (fixed names, zero rows).
    """
    runs = rec.runs if rec else {"ar": Run("ar"), "spec": Run("spec")}
    curve = [{"run": SERIES[key], "compute (s)": t, "tokens": n} for key in SERIES for t, n in runs[key].curve]
    lengths = Counter(runs["spec"].accept_lengths)
    hist = [{"tokens per step": str(k), "steps": lengths[k]} for k in sorted(lengths)]
    times = [{"step": str(e.step + 1), "ms": 1e3 * v, "phase": phase} for e in runs["spec"].events
             for phase, v in (("draft", e.draft_s), ("verify", e.verify_s))]
    times = times or [{"step": "1", "ms": 0.0, "phase": "draft"}, {"step": "1", "ms": 0.0, "phase": "verify"}]
    return (_frame(curve, {"run": str, "compute (s)": float, "tokens": int}),
            _frame(hist, {"tokens per step": str, "steps": int}),
            _frame(times, {"step": str, "ms": float, "phase": str}))


def _frame(rows: list[dict], dtypes: dict) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(dtypes)).astype(dtypes)
