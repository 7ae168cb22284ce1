"""The live plots' data: tokens vs compute time (every lane), tokens per step and draft vs verify time per step (one
speculative lane), acceptance by depth (every speculative lane).  Frames only, no gradio."""
from __future__ import annotations

from collections import Counter

import pandas as pd

from specdemo.app.race import Run
from specdemo.app.request import RaceRequest
from specdemo.app.session import RaceRecord
from specdemo.bench import acceptance_by_depth
from specdemo.drafters import LABELS

DEPTHS = 8  # depths the acceptance plot shows
AR_SERIES, SPEC_SERIES = "autoregressive", "speculative"
# every series a plot can show, with its colour: the page's two runs, and race all's lanes by method
SERIES_COLOURS = {AR_SERIES: "#9ca3af", SPEC_SERIES: "#6366f1", LABELS["pld"]: "#db2777", LABELS["rest"]: "#16a34a",
                  LABELS["s4c"]: "#2563eb", LABELS["sdsat"]: "#ea580c"}


def series(rec: RaceRecord, key: str) -> str:
    """A lane's name in the plots: autoregressive / speculative in a race of one method, the method in race all."""
    if key == "ar":
        return AR_SERIES
    return SPEC_SERIES if key == "spec" else LABELS.get(rec.lanes[key], key)


def plots(rec: RaceRecord | None, lane: str | None = None) -> tuple[pd.DataFrame, ...]:
    """Tokens vs compute time (every lane), tokens per step and draft vs verify ms per step (`lane`, default the
    "spec" lane), acceptance by depth (every speculative lane).

    Gradio's plots fix their axis types from the first value they draw and only swap the data afterwards, so every
    frame has explicit dtypes.
    """
    rec = rec or RaceRecord(RaceRequest(""))
    lane = lane or ("spec" if "spec" in rec.runs else next(iter(rec.spec_lanes), "ar"))
    curve = [{"run": series(rec, key), "compute (s)": t, "tokens": n} for key, run in rec.runs.items()
             for t, n in run.curve]
    one: Run = rec.runs.get(lane, Run(lane))
    lengths = Counter(one.accept_lengths)
    hist = [{"tokens per step": str(k), "steps": lengths[k]} for k in sorted(lengths)]
    times = [{"step": str(e.step + 1), "ms": 1e3 * v, "phase": phase} for e in one.events
             for phase, v in (("draft", e.draft_s), ("verify", e.verify_s))]
    depth = [{"accepted drafts ≥": str(d + 1), "share of steps": x, "run": series(rec, key)} for key in rec.spec_lanes
             for d, x in enumerate(acceptance_by_depth(rec.runs[key].accept_lengths, DEPTHS))]
    return (_frame(curve, {"run": str, "compute (s)": float, "tokens": int}),
            _frame(hist, {"tokens per step": str, "steps": int}),
            _frame(times, {"step": str, "ms": float, "phase": str}),
            _frame(depth, {"accepted drafts ≥": str, "share of steps": float, "run": str}))


def _frame(rows: list[dict], dtypes: dict) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(dtypes)).astype(dtypes)
