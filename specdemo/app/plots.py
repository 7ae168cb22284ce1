"""The live plots: tokens vs compute time, tokens per step, draft vs verify time per step."""
from __future__ import annotations

from collections import Counter

import gradio as gr
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


def plot_updates(rec: RaceRecord) -> tuple:
    """The three plots as updates.  Each carries a caption that changes with the data: a changed caption makes Gradio
    re-embed the chart (a bare data swap keeps stale scales); the categorical x axes get their numeric order."""
    curve, hist, times = plots(rec)
    ar, spec = rec.runs["ar"], rec.runs["spec"]
    verify = sorted(e.verify_s for e in spec.events[1:]) or [0.0]  # step 1 also reads the prompt
    draft = sorted(e.draft_s for e in spec.events[1:]) or [0.0]
    return (
        gr.LinePlot(value=curve, caption=f"autoregressive: {ar.n_tokens} tokens in {ar.compute_s:.2f} s · "
                                         f"speculative: {spec.n_tokens} tokens in {spec.compute_s:.2f} s"),
        gr.BarPlot(value=hist, sort=list(hist["tokens per step"]),
                   caption=f"{spec.forwards} steps · τ = {spec.tau:.2f} tokens per target forward"),
        gr.BarPlot(value=times, sort=list(dict.fromkeys(times["step"])),
                   caption=f"median draft {1e3 * draft[len(draft) // 2]:.1f} ms · median verify "
                           f"{1e3 * verify[len(verify) // 2]:.0f} ms (steps 2+)"),
    )


def refresh_plots(rec: RaceRecord | None) -> tuple:
    return plot_updates(rec) if rec is not None else (gr.skip(),) * 3


def _frame(rows: list[dict], dtypes: dict) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(dtypes)).astype(dtypes)
