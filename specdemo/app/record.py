"""A race as plain data: what each run has done, the text it wrote, and the JSON the API and the export send.

A race is AR against one or more methods, each in its own lane keyed by the method's name ("ar" first).  A race of
one method and *Race all* are the same record; they differ only in how many lanes they hold and in how the page lays
them out.  No torch and no gradio here: a record is safe to keep in `gr.State` and to send between processes.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

from specdemo import __version__
from specdemo.metrics import Summary, acceptance_by_depth, summarize
from specdemo.metrics import tau as tau_of
from specdemo.metrics import tokens_per_s as tokens_per_s_of

if TYPE_CHECKING:  # a record reads its request's fields only; the checks (and torch, with the registry) stay out
    from specdemo.app.request import RaceRequest

AR = "ar"


class Event(Protocol):
    """What a run reads from an engine StepEvent (structural, so tests can use light fakes)."""

    step: int
    tokens: list[int]
    from_draft: list[bool]
    sources: list[str | None]
    draft_s: float
    verify_s: float
    finish_reason: str | None
    margins: list[float]


@dataclass
class Run:
    """Everything one decoder has done so far."""

    name: str
    events: list = field(default_factory=list)
    compute_s: float = 0.0
    done: bool = False
    curve: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 0)])  # (compute_s, tokens) after each step

    def add(self, event: Event) -> None:
        self.events.append(event)
        self.compute_s += event.draft_s + event.verify_s
        self.curve.append((self.compute_s, self.n_tokens))
        if event.finish_reason is not None:
            self.done = True

    @property
    def tokens(self) -> list[int]:
        return [t for e in self.events for t in e.tokens]

    @property
    def margins(self) -> list[float]:
        return [g for e in self.events for g in e.margins]

    @property
    def n_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.events)

    @property
    def forwards(self) -> int:
        """Target forward passes: one per step."""
        return len(self.events)

    @property
    def tokens_per_s(self) -> float:
        return tokens_per_s_of(self.n_tokens, self.compute_s)

    @property
    def tau(self) -> float:
        return tau_of(self.n_tokens, self.forwards) or 0.0

    @property
    def accept_lengths(self) -> list[int]:
        return [len(e.tokens) for e in self.events]

    @property
    def finish_reason(self) -> str | None:
        return self.events[-1].finish_reason if self.events else None


@dataclass
class Piece:
    """The text one committed token added, and where that token came from."""

    text: str
    step: int
    from_draft: bool
    source: str | None


class TextBuilder:
    """Turns committed token ids into per-token text pieces that always concatenate to `decode(all ids)`.

    Decoding tokens one by one breaks multi-byte characters and merged pieces, so this decodes the cumulative ids and
    diffs the text: a token that ends inside an incomplete UTF-8 character adds nothing until the character is
    complete (it is then credited to the token that completes it); if decoding rewrites earlier text (tokenizer clean-up
    rules), earlier pieces are trimmed to the common prefix.
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.pieces: list[Piece] = []
        self.text = ""

    def add(self, tokens: list[int], step: int, from_draft: list[bool], sources: list[str | None]) -> None:
        for tok, fd, src in zip(tokens, from_draft, sources):
            self.ids.append(tok)
            full = self.decode(self.ids)
            if full.endswith("\ufffd"):  # an incomplete character: wait for the bytes that finish it
                self.pieces.append(Piece("", step, fd, src))
                continue
            keep = len(self.text) if full.startswith(self.text) else _common_prefix(self.text, full)
            if keep < len(self.text):
                self._trim(keep)
            self.pieces.append(Piece(full[keep:], step, fd, src))
            self.text = full

    def _trim(self, length: int) -> None:
        total = len(self.text)
        for piece in reversed(self.pieces):
            if total <= length:
                break
            cut = min(len(piece.text), total - length)
            piece.text = piece.text[: len(piece.text) - cut]
            total -= cut
        self.text = self.text[:length]

    def groups(self) -> list[Piece]:
        return groups_of(self.pieces)


def groups_of(pieces: list[Piece]) -> list[Piece]:
    """Adjacent pieces of the same step and kind merged (one highlighted span per step's accepted drafts)."""
    out: list[Piece] = []
    for p in pieces:
        if out and out[-1].step == p.step and out[-1].from_draft == p.from_draft:
            last = out[-1]
            out[-1] = Piece(last.text + p.text, last.step, last.from_draft, last.source or p.source)
        else:
            out.append(Piece(p.text, p.step, p.from_draft, p.source))
    return out


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass(frozen=True)
class LaneStyle:
    """How the page shows a lane: its name and plot colour, and its draft sources' names and colours (from the
    drafter registry, copied in so that rendering needs nothing but the record)."""

    label: str
    colour: str = "#6366f1"
    sources: tuple[tuple[str, str, str, str], ...] = ()  # (name, label, light colour, dark colour)


AR_STYLE = LaneStyle("Autoregressive", "#9ca3af")


@dataclass
class RaceRecord:
    """Everything the page and the API show about one race; plain data, safe to keep in gr.State."""

    request: RaceRequest
    model: str = ""
    device: str = ""
    dtype: str = ""
    precision: str = "fp32"  # the CPU precision of the model's linears (precision.py)
    caveat: str = ""  # why the outputs may differ from AR's (a model in half precision on a GPU); "" when exact
    # what a forward verifying n drafts costs in plain steps on this machine (the loaded model's cost curve), for n
    # in budget.SHOWN_COSTS: why a speedup stays below τ, and far below it where the products are compute-bound
    verify_costs: dict[int, float] = field(default_factory=dict)
    status: str = "queued"  # queued | starting | running | done | stopped | error
    message: str | None = None
    queue_wait_s: float = 0.0  # seconds spent waiting for the races ahead of this one
    started: float | None = None  # perf_counter when decoding began; wall_s runs from here
    ended: float | None = None
    runs: dict[str, Run] = field(default_factory=dict)  # lane (AR or a method name) -> its run, AR first
    styles: dict[str, LaneStyle] = field(default_factory=dict)
    pieces: dict[str, list[Piece]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    token_text: dict[int, str] = field(default_factory=dict)  # id -> text, for tree nodes and roots
    prompt_tail: list[int] = field(default_factory=list)  # the prompt's last token (the first step's root)
    summaries: dict[str, Summary] = field(default_factory=dict)  # per method lane, against the AR lane
    skipped: dict[str, str] = field(default_factory=dict)  # methods asked for that cannot run here, with the reason

    def __post_init__(self) -> None:
        if not self.runs:
            self.set_lanes({m: LaneStyle(m) for m in self.request.methods})

    def set_lanes(self, styles: dict[str, LaneStyle]) -> None:
        """AR plus one lane per method of `styles`, all empty."""
        self.styles = {AR: AR_STYLE, **styles}
        self.runs = {k: Run(k) for k in self.styles}
        self.pieces = {k: [] for k in self.styles}
        self.texts = {k: "" for k in self.styles}
        self.summaries = {}

    @property
    def method_lanes(self) -> list[str]:
        return [k for k in self.runs if k != AR]

    def label(self, lane: str) -> str:
        return self.styles[lane].label if lane in self.styles else lane

    def add(self, lane: str, event, text: str) -> None:
        """One step of `lane`, and its effect on the summaries against AR."""
        self.runs[lane].add(event)
        self.texts[lane] = text
        for key in self.method_lanes if lane == AR else [lane]:
            self.summaries[key] = summarize(self.runs[AR], self.runs[key])

    def chosen_lane(self, lane: str | None = None) -> str | None:
        """The method lane a per-lane view shows: `lane` when the record has it, else the only method, else the
        fastest one so far; None before any method lane exists."""
        if lane in self.runs and lane != AR:
            return lane
        if not self.method_lanes:
            return None
        return max(self.method_lanes, key=lambda k: self.runs[k].tokens_per_s)

    @property
    def wall_s(self) -> float:
        """Wall time since decoding began (to the end, once over)."""
        if self.started is None:
            return 0.0
        return (self.ended or time.perf_counter()) - self.started

    @property
    def other_s(self) -> float:
        """Wall time that went to no run's compute: whoever consumes the stream (the page's rendering and sending)
        and the race's bookkeeping.  Near zero through `/race`; what the page costs in the page."""
        return max(0.0, self.wall_s - sum(run.compute_s for run in self.runs.values()))

    @property
    def active(self) -> bool:
        return self.status in ("queued", "starting", "running")


# -------------------------------------------------------------------------------------------------------- the JSON

def run_json(rec: RaceRecord, lane: str) -> dict:
    """One lane in Spec-Bench's fields (new_tokens, wall_time, accept_lengths) plus its text and figures.

    wall_time is the run's own compute time (the race interleaves the runs, so shared wall time means nothing)."""
    run = rec.runs[lane]
    return {"method": lane, "new_tokens": run.n_tokens, "wall_time": run.compute_s,
            "accept_lengths": run.accept_lengths, "decoding_steps": run.forwards, "tokens_per_s": run.tokens_per_s,
            "tau": run.tau, "draft_s": [e.draft_s for e in run.events], "verify_s": [e.verify_s for e in run.events],
            "finish_reason": run.finish_reason, "tokens": run.tokens, "text": rec.texts[lane],
            "acceptance_by_depth": acceptance_by_depth(run.accept_lengths)}


def record_json(rec: RaceRecord) -> dict:
    """The race's export: every run, plus method, model and settings; a race of every method (`race_all`) has
    `board` (each method's summary against AR) and `skipped`, a race of one method its `summary`."""
    req = rec.request
    out = {
        "specdemo": __version__, "model": rec.model, "device": rec.device, "dtype": rec.dtype,
        "precision": rec.precision, "caveat": rec.caveat,
        "method": req.method, "status": rec.status, "prompt": req.prompt,
        "settings": {"max_new_tokens": req.max_new_tokens, **asdict(req.sampling), "options": req.options_json()},
        "runs": {lane: run_json(rec, lane) for lane in rec.runs},
    }
    if req.race_all:
        out["board"] = {k: _summary_json(rec.summaries.get(k)) for k in rec.method_lanes}
        out["skipped"] = dict(rec.skipped)
    else:
        out["summary"] = _summary_json(rec.summaries.get(req.method))
    return out


def _summary_json(s: Summary | None) -> dict | None:
    return None if s is None else s.as_json()


LIVE_FIELDS = ("text", "new_tokens", "wall_time", "tokens_per_s", "decoding_steps", "accept_lengths", "tau")


def lane_json(rec: RaceRecord, lane: str, record: dict) -> dict:
    """A lane while racing: the export's live fields, whether it is done and, for a method, its result against AR."""
    out = {k: record["runs"][lane][k] for k in (*LIVE_FIELDS, "acceptance_by_depth")} | {"done": rec.runs[lane].done}
    if lane != AR:
        s = rec.summaries.get(lane)
        out["speedup"], out["identical"] = (s.speedup, s.identical) if s else (None, True)
        out["spans"] = [{"text": p.text, "step": p.step + 1, "accepted_draft": p.from_draft, "source": p.source}
                        for p in groups_of(rec.pieces[lane]) if p.text]
    return out


def race_view(rec: RaceRecord) -> dict:
    """What the API streams, one view for both endpoints: status, message, model, queue_wait_s, skipped and every
    lane; `/race` reads its two panes (`ar`, `spec`) and `summary` from it, `/race_all` its `lanes`.  The whole
    export (`run`) once the race is over."""
    record = record_json(rec)
    lanes = {lane: lane_json(rec, lane, record) for lane in rec.runs}
    out = {"status": rec.status, "message": rec.message, "model": rec.model, "method": rec.request.method,
           "queue_wait_s": rec.queue_wait_s, "skipped": dict(rec.skipped), "lanes": lanes}
    if not rec.request.race_all:
        spec = lanes.get(rec.request.method, {})
        out.update(ar={k: v for k, v in lanes[AR].items() if k in (*LIVE_FIELDS, "done")},
                   spec={k: v for k, v in spec.items() if k in (*LIVE_FIELDS, "done", "spans")},
                   summary=record["summary"])
        del out["lanes"], out["skipped"]
    else:
        del out["method"]
        for lane in lanes.values():
            lane.pop("spans", None)
    if not rec.active:
        out["run"] = record
    return out


def refused_view(message: str, request: RaceRequest, model: str) -> dict:
    """What the API sends for a request refused before it started: the view's keys, nothing run."""
    out = race_view(RaceRecord(request, status="error", message=message))
    out["model"] = model
    if request.race_all:
        out["lanes"] = {}
    return out
