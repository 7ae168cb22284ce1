"""The live plots, as a registry: each entry says what it draws from a race record and how.  The page builds one
chart per entry, streams every entry's update and wires them, so adding a plot is adding an entry here.

Frames only, no gradio: a `Plot` is data (title, axes, the rows of a record, a caption); the page turns it into a
`gr.LinePlot` or `gr.BarPlot`.  "lane" below is the one method lane a per-lane plot shows (the page's choice).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd

from specdemo.app.record import RaceRecord, Run
from specdemo.metrics import DEPTHS, acceptance_by_depth

PHASE_COLOURS = {"draft": "#f59e0b", "verify": "#6366f1"}


@dataclass(frozen=True)
class Plot:
    name: str  # the page component's name
    kind: str  # "line" | "bar"
    title: str  # short enough to fit the chart's box
    x: str
    y: str
    color: str | None  # the column that picks a series, if any
    dtypes: dict  # column -> type: Gradio fixes its axis types from the first value it draws
    rows: Callable[[RaceRecord, str], list[dict]]
    caption: Callable[[RaceRecord, str], str]
    options: dict = field(default_factory=dict)  # more chart settings (axis formats, limits)
    per_update: Callable[[RaceRecord, str, pd.DataFrame], dict] | None = None  # settings that follow the data

    def frame(self, rec: RaceRecord | None, lane: str | None) -> pd.DataFrame:
        rows = self.rows(rec, lane) if rec is not None else []
        return pd.DataFrame(rows, columns=list(self.dtypes)).astype(self.dtypes)

    def colours(self, rec: RaceRecord | None) -> dict[str, str]:
        """Series -> colour: the phases, or every lane's label and plot colour (from the drafter registry)."""
        if self.color == "phase":
            return dict(PHASE_COLOURS)
        return {s.label: s.colour for s in rec.styles.values()} if rec is not None else {}


def _lane(rec: RaceRecord, lane: str | None) -> Run:
    return rec.runs.get(lane or "", Run(lane or ""))


def _curve_rows(rec: RaceRecord, lane: str | None) -> list[dict]:
    return [{"run": rec.label(key), "compute (s)": t, "tokens": n} for key, run in rec.runs.items()
            for t, n in run.curve]


def _curve_caption(rec: RaceRecord, lane: str | None) -> str:
    return " · ".join(f"{rec.label(k)}: {r.n_tokens} tokens in {r.compute_s:.2f} s" for k, r in rec.runs.items())


def _length_rows(rec: RaceRecord, lane: str | None) -> list[dict]:
    lengths = Counter(_lane(rec, lane).accept_lengths)
    return [{"tokens per step": str(k), "steps": lengths[k]} for k in sorted(lengths)]


def _length_caption(rec: RaceRecord, lane: str | None) -> str:
    run = _lane(rec, lane)
    return (f"{rec.label(lane) if lane else ''}: {run.forwards} steps · accepted drafts + 1 per step · "
            f"τ = {run.tau:.2f}")


def _time_rows(rec: RaceRecord, lane: str | None) -> list[dict]:
    return [{"step": str(e.step + 1), "ms": 1e3 * v, "phase": phase} for e in _lane(rec, lane).events
            for phase, v in (("draft", e.draft_s), ("verify", e.verify_s))]


def _time_caption(rec: RaceRecord, lane: str | None) -> str:
    events = _lane(rec, lane).events[1:]  # step 1 also reads the prompt
    mid = lambda xs: sorted(xs)[len(xs) // 2] if xs else 0.0  # noqa: E731
    return (f"{rec.label(lane) if lane else ''}: median draft {1e3 * mid([e.draft_s for e in events]):.1f} ms · "
            f"median verify {1e3 * mid([e.verify_s for e in events]):.0f} ms (steps 2+)")


def _time_settings(rec: RaceRecord, lane: str | None, frame: pd.DataFrame) -> dict:
    steps = len(_lane(rec, lane).events)
    return {"sort": list(dict.fromkeys(frame["step"])), "x_axis_labels_visible": steps <= 40,
            "x_title": f"step (1 … {steps})" if steps > 40 else "step"}


def _depth_rows(rec: RaceRecord, lane: str | None) -> list[dict]:
    return [{"accepted drafts ≥": str(d + 1), "share of steps": x, "run": rec.label(key)}
            for key in rec.method_lanes
            for d, x in enumerate(acceptance_by_depth(rec.runs[key].accept_lengths, DEPTHS))]


def _depth_caption(rec: RaceRecord, lane: str | None) -> str:
    return " · ".join(f"{rec.label(k)}: τ {rec.runs[k].tau:.2f}" for k in rec.method_lanes)


PLOTS: tuple[Plot, ...] = (
    Plot("curve_plot", "line", "Tokens vs own compute", "compute (s)", "tokens", "run",
         {"run": str, "compute (s)": float, "tokens": int}, _curve_rows, _curve_caption,
         {"x_axis_format": "~r", "y_axis_format": "~r"}),
    Plot("hist_plot", "bar", "Tokens per step", "tokens per step", "steps", None,
         {"tokens per step": str, "steps": int}, _length_rows, _length_caption,
         {"y_axis_format": "~r", "y_lim": [0, None]},
         lambda rec, lane, frame: {"sort": list(frame["tokens per step"])}),
    Plot("time_plot", "bar", "Draft vs verify (ms)", "step", "ms", "phase",
         {"step": str, "ms": float, "phase": str}, _time_rows, _time_caption,
         {"y_lim": [0, None], "y_axis_format": "d"}, _time_settings),
    Plot("depth_plot", "line", "Acceptance by depth", "accepted drafts ≥", "share of steps", "run",
         {"accepted drafts ≥": str, "share of steps": float, "run": str}, _depth_rows, _depth_caption,
         {"y_lim": [0, 1], "y_axis_format": "~r", "sort": [str(d + 1) for d in range(DEPTHS)]}),
)


def plot_data(rec: RaceRecord | None, lane: str | None) -> list[tuple[Plot, pd.DataFrame, dict]]:
    """Every plot's frame and update settings (caption, colours and what follows the data) for `rec`."""
    out = []
    for plot in PLOTS:
        frame = plot.frame(rec, lane)
        settings = {"caption": plot.caption(rec, lane) if rec is not None else None}
        if plot.color:
            settings["color_map"] = plot.colours(rec)
        if plot.per_update and rec is not None:
            settings.update(plot.per_update(rec, lane, frame))
        out.append((plot, frame, settings))
    return out
