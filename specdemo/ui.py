"""The Gradio demo: an honest race of plain decoding against a speculative method, with every step made visible.

The UI never decodes by itself: it consumes `engine.generate()`'s StepEvents through `race.Race` and only renders
them.  `run_race` is the one loop behind the page and the scripted `race` API endpoint; everything it yields is plain
data (no model, no generators), so the same code runs under ZeroGPU, where model work happens in another process.
"""
from __future__ import annotations

import html
import inspect
import json
import os
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import gradio as gr
import pandas as pd
import torch

from . import __version__
from .drafters import LABELS, DrafterUnavailable, make_drafter, unavailable_reason
from .engine import GenerationConfig, StepEvent, generate, validate_request
from .models import EMBEDDED, ModelLoadError, Target, UnsupportedForTree, load_target
from .race import Piece, Race, Run, Summary, TextBuilder, summarize
from .sampling import SamplingConfig

ASSETS = Path(__file__).resolve().parent.parent / "assets"
MODES = ("rest", "s4c", "sdsat", "pld")  # the order the page shows them in
DEFAULT_MODE_ORDER = ("rest", "pld", "s4c", "sdsat")  # which available mode is selected first
MODEL_CHOICES = (
    EMBEDDED,
    "HuggingFaceTB/SmolLM2-360M-Instruct",
    "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "Qwen/Qwen2.5-1.5B-Instruct",
)
MAX_PROMPT_CHARS = 16_000  # before tokenising; the token limit itself comes from the model's context
MAX_NEW_TOKENS = 512
QUEUE_SIZE = 16
MODEL_WORK = "model"  # the concurrency id every event that touches a model shares: one at a time per device
ZERO_GPU = bool(os.environ.get("SPACES_ZERO_GPU"))


@dataclass(frozen=True)
class Knob:
    """One per-mode setting, passed to `make_drafter(method, target, **{option: value})`.

    zero -- what a slider at 0 means: None (0 is not allowed), "omit" (leave the drafter's own default, e.g. REST's
    cost-based budget) or a value to pass instead (S4C takes budget="auto").
    """

    method: str
    option: str
    label: str
    minimum: int
    maximum: int
    value: int
    info: str = ""
    zero: str | None = None

    def resolve(self, value) -> tuple[bool, object]:
        """(pass it?, value) for a slider value."""
        v = int(value)
        if v == 0 and self.zero is not None:
            return (False, None) if self.zero == "omit" else (True, self.zero)
        return True, v


KNOBS = (
    Knob("rest", "budget", "Tree budget", 0, 64, 0, "draft nodes per step · 0 = auto (cost-based on CPU)", "omit"),
    Knob("rest", "max_suffix", "Longest suffix looked up", 1, 32, 16, "tokens matched in the datastore"),
    Knob("s4c", "budget", "Tree budget", 0, 64, 0, "draft nodes per step · 0 = device default (11 on CPU, 15 on GPU)",
         "omit"),
    Knob("s4c", "topk", "Top-k per head", 1, 8, 3, "candidates each head contributes"),
    Knob("sdsat", "k", "Adaptive tokens", 0, 8, 0, "adaptive tokens per probe chain · 0 = auto (device default)", "omit"),
    Knob("pld", "num_tokens", "Draft length", 1, 32, 10, "tokens copied after a match"),
    Knob("pld", "max_ngram", "Longest n-gram matched", 1, 8, 3, "the suffix looked up in the context"),
)

EXAMPLES = (  # (category, prompt): the first is the default
    ("Summarisation", "Summarise this paragraph in two sentences:\nThe Eiffel Tower is a wrought-iron lattice tower "
                      "on the Champ de Mars in Paris, France. It is named after the engineer Gustave Eiffel, whose "
                      "company designed and built the tower from 1887 to 1889. Locally nicknamed \"La dame de fer\", "
                      "it was constructed as the centrepiece of the 1889 World's Fair. Although initially criticised "
                      "by some of France's leading artists and intellectuals for its design, it has since become a "
                      "global cultural icon of France and one of the most recognisable structures in the world."),
    ("Code edit", "Rename the function `calc` to `average` in this code and return the whole code.\n```python\n"
                  "def calc(values):\n    if not values:\n        return 0.0\n    return sum(values) / len(values)\n\n"
                  "print(calc([1, 2, 3]))\n```"),
    ("Code", "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces."),
    ("Explanation", "Explain how a hash table works, in simple terms."),
    ("Writing", "Write a short story about a robot who learns to paint."),
    ("Maths", "A train travels 60 km in 45 minutes. What is its average speed in km/h? Show each step."),
)


def _gpu(fn: Callable, duration: int = 120) -> Callable:
    """`spaces.GPU` when the `spaces` package is there (a no-op off ZeroGPU), else the function itself."""
    try:
        import spaces  # type: ignore
    except ImportError:
        return fn
    return spaces.GPU(duration=duration)(fn)


# ----------------------------------------------------------------------------------------------------------- models

class ModelCache:
    """Loaded targets by name, the most recent few kept (loading is the slow part; memory is the limit)."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._targets: OrderedDict[str, Target] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, name: str) -> Target:
        name = (name or EMBEDDED).strip() or EMBEDDED
        with self._lock:
            if name in self._targets:
                self._targets.move_to_end(name)
                return self._targets[name]
            while len(self._targets) >= self.keep:
                self._targets.popitem(last=False)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            target = load_target(name)
            self._targets[name] = target
            return target

    def put(self, name: str, target: Target) -> None:
        """Share an already loaded target (tests, or a host app that loaded it)."""
        with self._lock:
            self._targets[name] = target


MODELS = ModelCache()


def availability(target: Target) -> dict[str, str | None]:
    """Per mode: None when usable on this model, else the reason (with the command that fixes it)."""
    out = {}
    for m in MODES:
        try:
            out[m] = unavailable_reason(m, target)
        except Exception as exc:  # a half-written drafter module must not take the page down
            out[m] = f"{LABELS.get(m, m)} failed to report its status: {type(exc).__name__}: {exc}"
    from .drafters.sdsat import SELF_VERIFY_NOTE, self_verifying

    if self_verifying(target):  # a published SDSAT fine-tune: say whose output the panes show
        out["sdsat:note"] = SELF_VERIFY_NOTE
    return out


# ------------------------------------------------------------------------------------------------------ the race loop

class UserError(Exception):
    """A problem the user can fix; its message is shown in the page."""


@dataclass
class RaceRequest:
    prompt: str
    method: str = "pld"
    model: str = EMBEDDED
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    options: dict = field(default_factory=dict)


@dataclass
class RaceRecord:
    """Everything the page and the API show about one race; plain data, safe to keep in gr.State."""

    request: RaceRequest
    model: str = ""
    device: str = ""
    dtype: str = ""
    status: str = "starting"  # starting | running | done | stopped | error
    message: str | None = None
    runs: dict[str, Run] = field(default_factory=lambda: {"ar": Run("ar"), "spec": Run("spec")})
    pieces: dict[str, list[Piece]] = field(default_factory=lambda: {"ar": [], "spec": []})
    texts: dict[str, str] = field(default_factory=lambda: {"ar": "", "spec": ""})
    token_text: dict[int, str] = field(default_factory=dict)  # id -> text, for tree nodes and roots
    prompt_tail: list[int] = field(default_factory=list)  # the prompt's last token (the first step's root)
    summary: Summary | None = None

    @property
    def label(self) -> str:
        return LABELS.get(self.request.method, self.request.method)

    @property
    def active(self) -> bool:
        return self.status in ("starting", "running")


def prepare(req: RaceRequest) -> tuple[Target, list[int], GenerationConfig]:
    """Load the model, encode and check the request: every problem becomes a UserError before any decoding."""
    if req.method not in MODES:
        raise UserError(f"Unknown mode '{req.method}'. Choose one of: {', '.join(MODES)}.")
    if not req.prompt or not req.prompt.strip():
        raise UserError("The prompt is empty: type something (or pick an example) and press Generate.")
    if len(req.prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt is {len(req.prompt):,} characters; this demo takes up to {MAX_PROMPT_CHARS:,}.")
    if not 1 <= req.max_new_tokens <= MAX_NEW_TOKENS:
        raise UserError(f"Max new tokens must be between 1 and {MAX_NEW_TOKENS}.")
    try:
        target = MODELS.get(req.model)
    except ModelLoadError as exc:
        raise UserError(str(exc)) from exc
    reason = unavailable_reason(req.method, target)
    if reason:
        raise UserError(f"{LABELS.get(req.method, req.method)} is unavailable for {target.name}: {reason}")
    ids = target.encode_prompt(req.prompt)
    cfg = GenerationConfig(max_new_tokens=int(req.max_new_tokens), sampling=req.sampling)
    try:
        validate_request(target, ids, cfg)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    return target, ids, cfg


def _race_events(req: RaceRequest) -> Iterator[tuple[str, StepEvent]]:
    """The model work: AR and the chosen method interleaved by `Race`.  Runs on the GPU worker under ZeroGPU."""
    target, ids, cfg = prepare(req)
    try:
        drafter = make_drafter(req.method, target, **req.options)
    except TypeError as exc:
        raise UserError(f"{LABELS.get(req.method, req.method)} does not take these settings: {exc}") from exc
    yield from Race({"ar": generate(target, ids, None, cfg), "spec": generate(target, ids, drafter, cfg)})


race_events = _gpu(_race_events)


def _bench(*args, **kwargs) -> dict:
    from .bench import run_bench

    return run_bench(*args, **kwargs)


bench_on_device = _gpu(_bench, duration=300)  # decorated at import time, as ZeroGPU expects


def explain_error(exc: BaseException) -> str:
    """A message for the page; the app keeps serving whatever went wrong."""
    if isinstance(exc, (UserError, ModelLoadError, UnsupportedForTree, DrafterUnavailable)):
        return str(exc)
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return "Out of memory: lower max new tokens, shorten the prompt or pick a smaller model."
    if isinstance(exc, ValueError):
        return str(exc)
    return f"Something went wrong: {type(exc).__name__}: {str(exc)[:300]}"


def run_race(req: RaceRequest, stop: threading.Event | None = None) -> Iterator[RaceRecord]:
    """Yield the record after the start, after every step of either run, and once more at the end.

    `stop` is checked after every step, so Stop takes effect within one step.
    """
    rec = RaceRecord(req)
    events = None
    try:
        target, ids, _ = prepare(req)
        rec.model, rec.device, rec.dtype = target.name, target.device.type, str(target.dtype).replace("torch.", "")
        rec.prompt_tail = ids[-1:]
        builders = {"ar": TextBuilder(target.decode), "spec": TextBuilder(target.decode)}
        rec.pieces = {k: b.pieces for k, b in builders.items()}
        yield rec
        rec.status = "running"
        events = race_events(req)
        for name, ev in events:
            rec.runs[name].add(ev)
            builders[name].add(ev.tokens, ev.step, ev.from_draft, ev.sources)
            rec.texts[name] = builders[name].text
            if name == "spec":
                for tok in ev.tree.tokens + ev.tokens + rec.prompt_tail:
                    if tok not in rec.token_text:
                        rec.token_text[tok] = target.tokenizer.decode([tok])
            rec.summary = summarize(rec.runs["ar"], rec.runs["spec"])
            yield rec
            if stop is not None and stop.is_set():
                rec.status, rec.message = "stopped", "Stopped: the numbers below cover the steps run so far."
                break
        else:
            rec.status = "done"
    except Exception as exc:  # noqa: BLE001 — every failure becomes a message; the server keeps going
        rec.status, rec.message = "error", explain_error(exc)
    finally:
        if events is not None and hasattr(events, "close"):
            events.close()
    yield rec


def record_json(rec: RaceRecord) -> dict:
    """The run in Spec-Bench's fields (new_tokens, wall_time, accept_lengths) plus method, model and settings.

    wall_time is each run's own compute time (the race interleaves the two runs, so shared wall time means nothing).
    """
    req = rec.request
    runs = {}
    for key, run in rec.runs.items():
        method = "ar" if key == "ar" else req.method
        runs[method] = {
            "method": method, "new_tokens": run.n_tokens, "wall_time": run.compute_s,
            "accept_lengths": run.accept_lengths, "decoding_steps": run.forwards, "tokens_per_s": run.tokens_per_s,
            "tau": run.tau, "draft_s": [e.draft_s for e in run.events], "verify_s": [e.verify_s for e in run.events],
            "finish_reason": run.finish_reason, "tokens": run.tokens, "text": rec.texts[key],
        }
    s = rec.summary
    return {
        "specdemo": __version__, "model": rec.model, "device": rec.device, "dtype": rec.dtype,
        "method": req.method, "status": rec.status, "prompt": req.prompt,
        "settings": {"max_new_tokens": req.max_new_tokens, **asdict(req.sampling), "options": req.options},
        "runs": runs,
        "summary": None if s is None else {"speedup": s.speedup, "tau": s.tau, "forwards": s.forwards,
                                           "baseline_forwards": s.baseline_forwards,
                                           "forwards_saved": s.forwards_saved, "identical": s.identical,
                                           "complete": s.complete, "first_difference": s.first_difference},
    }


# ---------------------------------------------------------------------------------------------------------- render

def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _visible(text: str) -> str:
    """A token as a tree label: whitespace made visible."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or "∅"


def spans_html(rec: RaceRecord, key: str) -> str:
    """The run's text as escaped spans: accepted drafts shaded by step parity, the target's own tokens plain."""
    run = rec.runs[key]
    out = []
    for p in TextBuilder.groups_of(rec.pieces[key]):
        if not p.text:
            continue
        ev = run.events[p.step]
        text = _esc(p.text)
        if key == "ar":
            out.append(text)
        elif p.from_draft:
            tip = (f"step {p.step + 1} · accepted {ev.accepted} of {ev.tree_size} drafted · "
                   f"source: {p.source or 'draft'}")
            out.append(f'<span class="sd-acc sd-s{p.step % 2}" data-step="{p.step + 1}" title="{_esc(tip)}">'
                       f'{text}</span>')
        else:
            tip = (f"step {p.step + 1} · the target's own token · accepted {ev.accepted} of {ev.tree_size} drafted"
                   if ev.tree_size else f"step {p.step + 1} · the target's own token · nothing was drafted")
            out.append(f'<span class="sd-own" data-step="{p.step + 1}" title="{_esc(tip)}">{text}</span>')
    return "".join(out)


def pane_html(rec: RaceRecord | None, key: str) -> str:
    """One side of the race: title, live stats, a progress bar and the streamed text."""
    title = "Autoregressive" if key == "ar" else (rec.label if rec else "Speculative")
    badge = "baseline · one token per forward" if key == "ar" else "speculative · drafts verified in one forward"
    if rec is None or (rec.status == "error" and not rec.runs[key].events):
        body = '<span class="sd-placeholder">Press Generate to start the race.</span>'
        stats = ""
        pct = 0.0
    else:
        run = rec.runs[key]
        pct = 100.0 * run.n_tokens / max(1, rec.request.max_new_tokens)
        state = ("done" if run.done else "racing…" if rec.active else rec.status)
        stats = (f'<span><b>{run.n_tokens}</b> tokens</span><span><b>{run.compute_s:.2f} s</b> compute</span>'
                 f'<span><b>{run.tokens_per_s:.1f}</b> tok/s</span><span><b>{run.forwards}</b> forwards</span>'
                 f'<span class="sd-state">{state}</span>')
        body = spans_html(rec, key) or '<span class="sd-placeholder">…</span>'
        if run.done:
            pct = 100.0
    legend = ""
    if key == "spec":
        legend = ('<div class="sd-legend"><span class="sd-acc sd-s0">accepted</span><span class="sd-acc sd-s1">draft'
                  '</span> tokens (shade alternates per step) · plain = the target\'s own token · hover for details'
                  '</div>')
    return (f'<div class="sd-pane sd-pane-{key}"><div class="sd-pane-head"><span class="sd-pane-title">{_esc(title)}'
            f'</span><span class="sd-badge">{badge}</span></div><div class="sd-stats">{stats}</div>'
            f'<div class="sd-bar"><div style="width:{pct:.1f}%"></div></div>{legend}'
            f'<div class="sd-scroll"><div class="sd-text">{body}</div></div></div>')


def summary_html(rec: RaceRecord | None) -> str:
    """Speedup, τ, forwards saved and the identical-output check; live while racing, final at the end."""
    if rec is None or rec.summary is None:
        return ('<div class="sd-summary sd-muted">The two decoders run interleaved in one process; the one that has '
                'used less compute so far always goes next, so each pane grows at its true speed.</div>')
    s = rec.summary
    final = not rec.active
    note = "final" if rec.status == "done" else ("so far" if rec.active else rec.status)
    speed = "–" if s.speedup is None else f"{s.speedup:.2f}×"
    ident_cls = "sd-ok" if s.identical else "sd-bad"
    if s.identical:
        ident = "✓ identical" if s.complete else "✓ identical so far"
    else:
        ident = f"✗ differ at token {s.first_difference}"
    cards = [
        ("Speedup", speed, f"tokens/s vs autoregressive ({note})", "sd-big" if final else ""),
        ("τ", f"{s.tau:.2f}", "tokens per target forward", ""),
        ("Forwards saved", f"{s.forwards_saved}", f"{s.baseline_forwards} → {s.forwards} target forwards", ""),
        ("Outputs", ident, "token lists compared", ident_cls),
    ]
    inner = "".join(f'<div class="sd-card {cls}"><div class="sd-card-label">{k}</div><div class="sd-card-value">{v}'
                    f'</div><div class="sd-card-note">{n}</div></div>' for k, v, n, cls in cards)
    return f'<div class="sd-summary" data-status="{rec.status}">{inner}</div>'


def message_html(text: str | None, kind: str = "error") -> str:
    if not text:
        return ""
    return f'<div class="sd-msg sd-msg-{kind}">{_esc(text)}</div>'


def header_html(target: Target | None, error: str | None = None) -> str:
    chip = (f'<span class="sd-chip">{_esc(target.describe())}</span>' if target
            else f'<span class="sd-chip sd-chip-bad">{_esc(error or "no model loaded")}</span>')
    return (f'<div class="sd-header"><div><h1>specdemo <span>· speculative decoding, made visible</span></h1>'
            f'<p>A small model drafts, the big one checks many tokens in one pass: same output, fewer passes. '
            f'Race it against plain decoding and watch every step.</p></div>{chip}</div>')


def modes_html(avail: dict[str, str | None]) -> str:
    """The modes that cannot run on this model, each with its reason (and the command that fixes it)."""
    off = [m for m in MODES if avail.get(m)]
    rows = [f'<div class="sd-mode-off"><b>{_esc(LABELS.get(m, m))}</b> {_esc(avail[m])}</div>' for m in off]
    # grey out and disable those choices in the radio above (its inputs carry the method as their value)
    style = "".join(f'#sd-mode label:has(input[value="{m}"]) {{ opacity: .45; pointer-events: none; '
                    f'border-style: dashed; }}' for m in off)
    return f'<style>{style}</style><div class="sd-modes">{"".join(rows)}</div>' if rows else ""


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


# -------------------------------------------------------------------------------------------- step-by-step view

def _root_token(rec: RaceRecord, k: int) -> int | None:
    """The newest committed token before spec step k (the tree hangs off it)."""
    for ev in reversed(rec.runs["spec"].events[:k]):
        if ev.tokens:
            return ev.tokens[-1]
    return rec.prompt_tail[-1] if rec.prompt_tail else None


def tree_html(rec: RaceRecord, k: int) -> str:
    """The proposed tree of step k: accepted path green, the drafts the target rejected red, its own token starred.

    Runs of single children are drawn on one line, so a chain reads left to right and only branches indent.
    """
    ev = rec.runs["spec"].events[k]
    tree, tt = ev.tree, rec.token_text
    depths = tree.depths()
    accepted = set(ev.accepted_nodes)
    own = ev.tokens[-1] if ev.tokens and not ev.from_draft[-1] else None
    stop_at = ev.accepted_nodes[-1] if ev.accepted_nodes else -1  # the node the acceptance walk ended on
    OWN = "own"
    children: dict[int, list] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    if own is not None:  # first among its siblings: the target's choice, then the drafts it rejected
        children.setdefault(stop_at, []).insert(0, OWN)

    def label(tok: int | None) -> str:
        return "" if tok is None else _esc(_visible(tt.get(tok, f"#{tok}")))

    def chip(item) -> str:
        if item == OWN:
            return f'<span class="sd-node sd-n-own" title="the token the target chose here">★ {label(own)}</span>'
        if item == -1:
            return (f'<span class="sd-node sd-n-root" title="the newest committed token: the tree hangs off it">'
                    f'{label(_root_token(rec, k))}</span>')
        cls = ("sd-n-probe" if tree.is_probe(item) else "sd-n-acc" if item in accepted
               else "sd-n-rej" if tree.parents[item] == stop_at and own is not None else "sd-n-other")
        src = tree.sources[item] if tree.sources else "draft"
        tip = f"node {item} · depth {depths[item]} · source: {src}" + (" · probe" if tree.is_probe(item) else "")
        return f'<span class="sd-node {cls}" title="{_esc(tip)}">{label(tree.tokens[item])}</span>'

    def branch(item) -> str:
        line = [chip(item)]
        kids = children.get(item, []) if item != OWN else []
        while len(kids) == 1:
            item = kids[0]
            line.append(chip(item))
            kids = children.get(item, []) if item != OWN else []
        leaves = all(c == OWN or not children.get(c) for c in kids)  # a row of leaves wraps instead of stacking
        sub = (f'<ul{" class=sd-leaves" if leaves else ""}>' + "".join(f"<li>{branch(c)}</li>" for c in kids)
               + "</ul>" if kids else "")
        return '<span class="sd-arrow">→</span>'.join(line) + sub

    legend = ('<div class="sd-tree-legend"><span class="sd-node sd-n-root">root</span>'
              '<span class="sd-node sd-n-acc">accepted</span><span class="sd-node sd-n-rej">rejected here</span>'
              '<span class="sd-node sd-n-other">not reached</span><span class="sd-node sd-n-own">★ target\'s own'
              '</span></div>')
    return f'<div class="sd-tree">{legend}<ul><li>{branch(-1)}</li></ul></div>'


def explain_step(rec: RaceRecord, k: int) -> str:
    """Plain-language account of spec step k (markdown)."""
    ev = rec.runs["spec"].events[k]
    tt = rec.token_text
    q = lambda toks: "“" + "".join(tt.get(t, "") for t in toks).replace("\n", "↵") + "”"  # noqa: E731
    n, d, a = len(ev.tokens), ev.tree_size, ev.accepted
    own = ev.tokens[-1] if ev.tokens and not ev.from_draft[-1] else None
    first = " (this first step also includes reading the prompt)" if k == 0 else ""
    timing = f"Drafting took {1e3 * ev.draft_s:.0f} ms and the check {1e3 * ev.verify_s:.0f} ms{first}."
    parts = [f"**Step {k + 1} of {len(rec.runs['spec'].events)}.**"]
    if d == 0:
        parts.append(f"The {rec.label} drafter had no guess this time, so the target model ran one ordinary forward "
                     f"pass and wrote one token, {q(ev.tokens)} — exactly what plain decoding does.")
    else:
        leaves = sum(1 for i in range(d) if i not in set(ev.tree.parents))
        shape = "a chain" if leaves == 1 else f"a tree with {leaves} branches"
        srcs = sorted({s for s in (ev.tree.sources or []) if s})
        parts.append(f"The {rec.label} drafter proposed {d} token{'s' if d > 1 else ''} as {shape}"
                     + (f" (from {', '.join(srcs)})" if srcs else "") + ". The target model checked all of them "
                     "in **one** forward pass.")
        if a:
            parts.append(f"It agreed with the first {a}: {q(ev.tokens[:a])}.")
        elif leaves == 1:
            parts.append("It disagreed with the very first drafted token.")
        else:
            parts.append("None of the branches started with the token it wanted.")
        if own is not None:
            stop_at = ev.accepted_nodes[-1] if ev.accepted_nodes else -1
            rejected = [ev.tree.tokens[i] for i, p in enumerate(ev.tree.parents)
                        if p == stop_at and not ev.tree.is_probe(i)]
            if rejected:
                parts.append(f"At the {'next' if a else 'first'} position the target wanted {q([own])} where the "
                             "draft said "
                             + " or ".join(q([t]) for t in rejected[:3])
                             + ", so the rest of the draft was dropped and the target's own token was kept.")
            else:
                parts.append(f"The draft ended there, and the same forward pass also gave the next token, {q([own])}, "
                             "for free.")
    if d and n > 1:
        parts.append(f"This step added **{n} tokens for one forward pass**; plain decoding needs {n}.")
    elif d:
        parts.append("This step added one token, as a plain step would: the draft cost a little time and saved "
                     "nothing.")
    parts.append(timing)
    if ev.finish_reason:
        why = {"eos": "the model ended its answer", "length": "the max-new-tokens limit was reached",
               "stop": "a stop string appeared"}.get(ev.finish_reason, ev.finish_reason)
        parts.append(f"Generation ends here: {why}.")
    return " ".join(parts)


def step_text_html(rec: RaceRecord, k: int) -> str:
    """The speculative text up to step k, step k's tokens outlined."""
    out = []
    for p in TextBuilder.groups_of([p for p in rec.pieces["spec"] if p.step <= k]):
        if p.text:
            cls = (f"sd-acc sd-s{p.step % 2}" if p.from_draft else "sd-own") + (" sd-now" if p.step == k else "")
            out.append(f'<span class="{cls}">{_esc(p.text)}</span>')
    return f'<div class="sd-scroll sd-scroll-small"><div class="sd-text">{"".join(out)}</div></div>'


def show_step(rec: RaceRecord | None, k: float | None) -> tuple[str, str, str]:
    if rec is None or not rec.runs["spec"].events:
        empty = ('<div class="sd-muted">Run a race first: every verification step of the speculative run shows '
                 'here.</div>')
        return empty, "", ""
    n = len(rec.runs["spec"].events)
    k = min(max(int(k or 1), 1), n) - 1
    return tree_html(rec, k), explain_step(rec, k), step_text_html(rec, k)


# ----------------------------------------------------------------------------------------------------- handlers

_STOPS: dict[str, threading.Event] = {}


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "default"


def _options(method: str, values: tuple) -> dict:
    out = {}
    for knob, value in zip(KNOBS, values):
        if knob.method == method and value is not None:
            use, v = knob.resolve(value)
            if use:
                out[knob.option] = v
    return out


def _write_json(data: dict, prefix: str) -> str:
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    return path


def on_generate(model: str, method: str, prompt: str, max_new_tokens: float, temperature: float, top_p: float,
                top_k: float, seed: float, *knobs, request: gr.Request | None = None):
    """The page's Generate: stream the race into both panes, the summary and (throttled) the plots."""
    req = RaceRequest(prompt or "", method or "pld", model or EMBEDDED, int(max_new_tokens),
                      SamplingConfig(float(temperature), float(top_p), int(top_k), int(seed or 0)), _options(method, knobs))
    stop = _STOPS.setdefault(_session(request), threading.Event())
    stop.clear()
    last_plot = 0.0
    try:
        for rec in run_race(req, None if ZERO_GPU else stop):
            final = not rec.active
            now = time.monotonic()
            plot_now = final or now - last_plot > 1.0
            if plot_now:
                last_plot = now
            if final and rec.status == "error":
                gr.Warning(rec.message)
            n = len(rec.runs["spec"].events)
            steps = show_step(rec, 1) if final else (gr.skip(),) * 3
            yield (
                pane_html(rec, "ar"), pane_html(rec, "spec"), summary_html(rec),
                message_html(rec.message, "error" if rec.status == "error" else "info") if final else "",
                *(plot_updates(rec) if plot_now else (gr.skip(),) * 3),
                rec if final else gr.skip(),
                gr.Slider(minimum=1, maximum=max(n, 2), value=1, step=1, interactive=n > 1) if final else gr.skip(),
                *steps,
                gr.DownloadButton(value=_write_json(record_json(rec), "specdemo-run-"), interactive=True)
                if final and n else gr.skip(),
            )
    finally:
        _STOPS.pop(_session(request), None)


def generate_event(request: gr.Request, *inputs):
    """on_generate as an event: Gradio injects the request only into a parameter it can see by position."""
    yield from on_generate(*inputs, request=request)


def on_stop(request: gr.Request | None = None) -> None:
    if (flag := _STOPS.get(_session(request))) is not None:
        flag.set()


def on_load_model(model: str, current: str | None):
    """Load (or fetch from cache) the model; refresh the header and which modes can run on it."""
    try:
        target = MODELS.get(model)
    except Exception as exc:  # noqa: BLE001
        msg = explain_error(exc)
        gr.Warning(msg)
        return (header_html(None, "model not loaded"), gr.skip(), gr.skip(), message_html(msg), gr.skip(), gr.skip(),
                gr.skip())
    avail = availability(target)
    ok = [m for m in MODES if avail[m] is None]
    value = current if current in ok else next((m for m in DEFAULT_MODE_ORDER if m in ok), None)
    choices = [(LABELS.get(m, m) + ("" if avail[m] is None else " (unavailable)"), m) for m in MODES]
    bench_choices = [(LABELS.get(m, m), m) for m in ok]
    return (header_html(target), gr.Radio(choices=choices, value=value), modes_html(avail), "", avail,
            gr.CheckboxGroup(choices=bench_choices, value=ok[:1]), _generate_button(avail, value))


def _generate_button(avail: dict | None, method: str | None):
    if avail and method in avail and avail[method] is not None:
        return gr.Button(value=f"{LABELS.get(method, method)} unavailable", interactive=False)
    return gr.Button(value="Generate", interactive=True)


def on_mode(method: str, avail: dict | None):
    avail = avail or {}
    reason = avail.get(method) or avail.get(f"{method}:note")
    return _generate_button(avail, method), message_html(reason, "info") if reason else ""


def on_bench(model: str, methods: list[str], prompt_labels: list[str], max_new_tokens: float,
             progress: gr.Progress = gr.Progress()):
    """Run specdemo.bench over a few example prompts: a table, a speedup chart and the JSON."""
    empty = pd.DataFrame(columns=["method", "tok/s", "speedup", "τ", "identical", "draft ms", "verify ms"])
    try:
        from .bench import run_bench

        if not methods:
            raise UserError("Pick at least one method to compare with autoregressive decoding.")
        chosen = [(c, p) for c, p in EXAMPLES if c in (prompt_labels or [])]
        if not chosen:
            raise UserError("Pick at least one example prompt.")
        target = MODELS.get(model)
        prompts = [{"id": c, "prompt": p} for c, p in chosen]

        def report(i: int, n: int, pid: str = "", method: str = "", *_) -> None:
            progress(i / max(n, 1), desc=f"{pid} · {LABELS.get(method, method)}")

        kwargs = {"sampling": SamplingConfig(), "progress": None if ZERO_GPU else report}
        if "warmup" in inspect.signature(run_bench).parameters:
            kwargs["warmup"] = True
        result = bench_on_device(target, list(methods), prompts, int(max_new_tokens), **kwargs)
    except Exception as exc:  # noqa: BLE001
        msg = explain_error(exc)
        gr.Warning(msg)
        return empty, "", message_html(msg), gr.skip()
    rows, bars = [], {}
    for m, r in result["methods"].items():
        f = lambda v, nd=2: None if v is None else round(v, nd)  # noqa: E731
        rows.append({"method": LABELS.get(m, m), "tok/s": f(r["tokens_per_s"]), "speedup": f(r["speedup"]),
                     "τ": f(r["tau"]), "identical": None if r["identical"] is None else f"{100 * r['identical']:.0f}%",
                     "draft ms": f(r["draft_ms"], 1),
                     "verify ms": f(r["verify_ms"], 1)})
        bars[LABELS.get(m, m)] = r["speedup"] or 0.0
    note = (f"{result.get('model')} on {result.get('device')} · {len(prompts)} prompts · "
            f"{int(max_new_tokens)} new tokens max · greedy. Speedup = tokens/s ÷ autoregressive tokens/s, same run.")
    return (pd.DataFrame(rows), bench_bars_html(bars), message_html(note, "info"),
            gr.DownloadButton(value=_write_json(result, "specdemo-bench-"), interactive=True))


def bench_bars_html(speedups: dict[str, float]) -> str:
    """Speedup per method as horizontal bars, with the 1.0× line (autoregressive) marked."""
    top = max([1.0, *speedups.values()]) * 1.1
    rows = "".join(
        f'<div class="sd-bb-row"><span class="sd-bb-name">{_esc(name)}</span><span class="sd-bb-track">'
        f'<span class="sd-bb-bar{" sd-bb-base" if v == 1.0 and name == LABELS["ar"] else ""}" '
        f'style="width:{100 * v / top:.1f}%"></span><span class="sd-bb-one" style="left:{100 / top:.1f}%"></span>'
        f'</span><b>{v:.2f}×</b></div>' for name, v in speedups.items())
    return f'<div class="sd-bb"><div class="sd-bb-title">Speedup vs autoregressive</div>{rows}</div>'


def race_api(prompt: str, method: str = "pld", model: str = EMBEDDED, max_new_tokens: int = 64,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
             options: dict | None = None) -> dict:
    """Race plain decoding against `method` on `prompt`; streams a dict after every step, the last one final.

    Keys: status (running|done|stopped|error), message, model, method, ar / spec (text, new_tokens, elapsed_s,
    tokens_per_s, forwards, accept_lengths; spec also spans: [{text, step, accepted_draft, source}]), summary
    (speedup, tau, forwards_saved, identical, complete) and, in the final dict, run (the exported JSON).
    """
    req = RaceRequest(prompt or "", (method or "pld").lower().strip(), model or EMBEDDED, int(max_new_tokens),
                      SamplingConfig(float(temperature), float(top_p), int(top_k), int(seed or 0)), dict(options or {}))
    for rec in run_race(req):
        yield api_view(rec)


def api_view(rec: RaceRecord) -> dict:
    def run_view(key: str) -> dict:
        run = rec.runs[key]
        return {"text": rec.texts[key], "new_tokens": run.n_tokens, "elapsed_s": run.compute_s,
                "tokens_per_s": run.tokens_per_s, "forwards": run.forwards, "accept_lengths": run.accept_lengths,
                "done": run.done}

    out = {"status": rec.status, "message": rec.message, "model": rec.model, "method": rec.request.method,
           "ar": run_view("ar"), "spec": run_view("spec"), "summary": record_json(rec)["summary"]}
    out["spec"]["spans"] = [{"text": p.text, "step": p.step + 1, "accepted_draft": p.from_draft, "source": p.source}
                            for p in TextBuilder.groups_of(rec.pieces["spec"]) if p.text]
    if not rec.active:
        out["run"] = record_json(rec)
    return out


# -------------------------------------------------------------------------------------------------------- layout

def build_demo(default_model: str = EMBEDDED) -> gr.Blocks:
    """The whole page.  Pass `launch_kwargs()` to `launch()` (Gradio 6 takes theme/css there)."""
    if os.environ.get("SPACE_ID"):
        try:  # on Spaces: load at start-up (ZeroGPU moves weights to the GPU only outside GPU functions)
            MODELS.get(default_model)
        except Exception as exc:  # noqa: BLE001 — the page still opens and shows the reason
            print(f"specdemo: could not preload {default_model}: {exc}", flush=True)

    with gr.Blocks(title="specdemo · speculative decoding, made visible") as demo:
        avail_state = gr.State({})
        record_state = gr.State(None)
        header = gr.HTML(header_html(None, "loading model…"), padding=False)

        with gr.Row(equal_height=False):
            with gr.Column(scale=5):
                prompt = gr.Textbox(value=EXAMPLES[0][1], label="Prompt", lines=7, max_lines=14,
                                    placeholder="Ask something, or pick an example below", elem_id="sd-prompt")
                gr.Examples([[p] for _, p in EXAMPLES], inputs=[prompt], example_labels=[c for c, _ in EXAMPLES],
                            label="Examples")
                gr.Markdown(HOW_TO_READ, elem_classes=["sd-howto"])
            with gr.Column(scale=4):
                with gr.Row():
                    model = gr.Dropdown(list(MODEL_CHOICES), value=default_model, allow_custom_value=True,
                                        label="Model", info="embedded = SmolLM2-135M-Instruct, offline; or a hub id "
                                        "or local folder", scale=4)
                    load_btn = gr.Button("Load", scale=1, min_width=70, size="md", elem_id="sd-load")
                mode = gr.Radio([(LABELS.get(m, m), m) for m in MODES], value=None, label="Speculative mode",
                                elem_id="sd-mode")
                modes_box = gr.HTML(modes_html({}), padding=False)
                with gr.Accordion("Settings", open=False, elem_id="sd-settings"):
                    with gr.Row():
                        max_new = gr.Slider(1, MAX_NEW_TOKENS, value=128, step=1, label="Max new tokens")
                        seed = gr.Number(0, precision=0, label="Seed", minimum=0)
                    with gr.Row():
                        temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature", info="0 = greedy")
                        top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p")
                        top_k = gr.Slider(0, 200, value=0, step=1, label="Top-k", info="0 = off")
                    sliders: dict[Knob, gr.Slider] = {}
                    groups = {}
                    for m in MODES:
                        ks = [k for k in KNOBS if k.method == m]
                        if not ks:
                            continue
                        with gr.Group(visible=False) as groups[m]:
                            gr.Markdown(f"**{LABELS.get(m, m)} settings**", padding=True)
                            with gr.Row():
                                for k in ks:
                                    sliders[k] = gr.Slider(k.minimum, k.maximum, value=k.value, step=1,
                                                           label=k.label, info=k.info)
                    knob_inputs = [sliders[k] for k in KNOBS]  # the order _options() reads them in
                with gr.Row():
                    gen_btn = gr.Button("Generate", variant="primary", elem_id="sd-generate", scale=3)
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="sd-stop", scale=1)
        message = gr.HTML("", padding=False, elem_id="sd-message")
        summary = gr.HTML(summary_html(None), padding=False, elem_id="sd-summary")
        with gr.Row(equal_height=True):
            ar_pane = gr.HTML(pane_html(None, "ar"), padding=False, elem_id="sd-ar")
            spec_pane = gr.HTML(pane_html(None, "spec"), padding=False, elem_id="sd-spec")

        with gr.Tabs():
            with gr.Tab("Live plots"):
                with gr.Row():
                    curve_plot = gr.LinePlot(plots(None)[0], x="compute (s)", y="tokens", color="run",
                                             title="Tokens vs own compute time", label="Tokens vs compute time",
                                             color_map={"autoregressive": "#9ca3af", "speculative": "#6366f1"})
                    hist_plot = gr.BarPlot(plots(None)[1], x="tokens per step", y="steps",
                                           title="Tokens per step (accepted + 1)",
                                           label="Accepted lengths", y_lim=[0, None])
                    time_plot = gr.BarPlot(plots(None)[2], x="step", y="ms", color="phase",
                                           title="Draft vs verify ms per step",
                                           label="Draft vs verify", y_lim=[0, None],
                                           color_map={"draft": "#f59e0b", "verify": "#6366f1"})
            with gr.Tab("Step by step", elem_id="sd-steps"):
                gr.Markdown("Walk through the speculative run one verification step at a time: the tree the drafter "
                            "proposed, the path the target accepted, and the token that stopped it.")
                with gr.Row():
                    prev_btn = gr.Button("◀ Previous step", size="sm", scale=1)
                    step = gr.Slider(1, 2, value=1, step=1, label="Step", interactive=False, scale=6)
                    next_btn = gr.Button("Next step ▶", size="sm", variant="primary", scale=1, elem_id="sd-next")
                explanation = gr.Markdown(elem_id="sd-explain")
                with gr.Row():
                    tree_view = gr.HTML(padding=False)
                    step_text = gr.HTML(padding=False)
            with gr.Tab("Export"):
                gr.Markdown("The last race as JSON: Spec-Bench fields (`new_tokens`, `wall_time`, `accept_lengths`) "
                            "per run, plus method, model, settings and the summary. `wall_time` is each run's own "
                            "compute time.")
                export_btn = gr.DownloadButton("Download run JSON", interactive=False)
            with gr.Tab("Benchmark"):
                gr.Markdown("Runs `specdemo.bench` (AR first, then each method, after a warm-up) on the chosen example "
                            "prompts. Greedy; speedup is measured here, against AR in the same run.")
                with gr.Row():
                    bench_methods = gr.CheckboxGroup([], label="Methods")
                    bench_prompts = gr.CheckboxGroup([c for c, _ in EXAMPLES], value=[c for c, _ in EXAMPLES[:3]],
                                                     label="Prompts")
                    bench_tokens = gr.Slider(8, 256, value=48, step=8, label="Max new tokens")
                bench_btn = gr.Button("Run benchmark", variant="primary")
                bench_note = gr.HTML(padding=False)
                with gr.Row():
                    bench_table = gr.Dataframe(interactive=False, label="Results", scale=3)
                    bench_plot = gr.HTML("", padding=False, scale=2)
                bench_json = gr.DownloadButton("Download bench JSON", interactive=False)
            with gr.Tab("API"):
                gr.Markdown(API_DOC)

        # events ------------------------------------------------------------------------------------------------
        load_outputs = [header, mode, modes_box, message, avail_state, bench_methods, gen_btn]
        model_work = dict(concurrency_id=MODEL_WORK, concurrency_limit=1)
        demo.load(on_load_model, [model, mode], load_outputs, api_visibility="private", **model_work)
        load_btn.click(on_load_model, [model, mode], load_outputs, api_visibility="private", **model_work)
        model.input(on_load_model, [model, mode], load_outputs, api_visibility="private", **model_work)
        mode.change(on_mode, [mode, avail_state], [gen_btn, message], api_visibility="private",
                    queue=False)
        for m, g in groups.items():
            mode.change(lambda x, m=m: gr.Group(visible=x == m), [mode], [g], api_visibility="private", queue=False)

        gen_outputs = [ar_pane, spec_pane, summary, message, curve_plot, hist_plot, time_plot, record_state, step,
                       tree_view, explanation, step_text, export_btn]
        gen_inputs = [model, mode, prompt, max_new, temperature, top_p, top_k, seed, *knob_inputs]
        run_event = gen_btn.click(generate_event, gen_inputs, gen_outputs, api_visibility="undocumented",
                                  api_name="generate", **model_work)
        submit_event = prompt.submit(generate_event, gen_inputs, gen_outputs, api_visibility="private", **model_work)
        for event in (run_event, submit_event):  # redraw the plots once more: Gradio shows a re-embedded plot one
            event.then(refresh_plots, [record_state], [curve_plot, hist_plot, time_plot],  # update late
                       api_visibility="private", queue=False)
        stop_btn.click(on_stop, None, None, api_visibility="private", queue=False,
                       cancels=[run_event] if ZERO_GPU else None)

        step.change(show_step, [record_state, step], [tree_view, explanation, step_text], api_visibility="private",
                    queue=False)
        prev_btn.click(lambda k: max(1, int(k) - 1), [step], [step], api_visibility="private", queue=False)
        next_btn.click(lambda k, r: min(int(k) + 1, len(r.runs["spec"].events) if r else 1), [step, record_state],
                       [step], api_visibility="private", queue=False)

        bench_btn.click(on_bench, [model, bench_methods, bench_prompts, bench_tokens],
                        [bench_table, bench_plot, bench_note, bench_json], api_visibility="private", **model_work)
        gr.api(race_api, api_name="race", **model_work)
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=1)
    return demo


HOW_TO_READ = """
**How to read the race.** Both decoders get the same prompt and settings. The one that has used less compute so far
always runs next, so each pane grows at its true speed. On the right, **shaded** text is draft tokens the model
accepted: several tokens for the price of one forward pass (the shade alternates per step; hover for details). Plain
text is the model's own token. At the end: speedup, τ (tokens per forward pass) and whether both outputs are
identical, as they must be. **Step by step** below replays every verification.
"""

API_DOC = """
### Script a race with `gradio_client`

The endpoint **`/race`** runs the same race as the page and streams a dict after every step (the last one is final).

```python
from gradio_client import Client

client = Client("http://127.0.0.1:7860/")          # or "user/space-name" on Hugging Face
job = client.submit(
    "Explain recursion in one paragraph.",  # prompt
    "pld", "embedded", 64,                  # method, model, max_new_tokens
    0.0, 1.0, 0, 0,                         # temperature (0 = greedy), top_p, top_k, seed
    {"num_tokens": 10},                     # options for the drafter
    api_name="/race",
)
for update in job:                                   # streamed while racing
    print(update["status"], update["ar"]["new_tokens"], update["spec"]["new_tokens"])
final = job.outputs()[-1]
print(final["summary"])    # speedup, tau, forwards_saved, identical, ...
print(final["run"])        # the exported JSON: new_tokens, wall_time, accept_lengths per run
```

Methods: `rest`, `s4c`, `sdsat`, `pld` (those available for the model). Errors come back as
`{"status": "error", "message": ...}`, not as exceptions.
"""


def launch_kwargs() -> dict:
    """theme / css / head for `demo.launch()` (Gradio 6 takes them there, not in Blocks)."""
    return {
        "theme": gr.themes.Soft(primary_hue="indigo", secondary_hue="emerald",
                                font=["ui-sans-serif", "system-ui", "sans-serif"],  # no web-font fetch: works offline
                                font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"]),
        "css_paths": [ASSETS / "style.css"],
    }
