"""The race behind the page and the API: a request becomes a stream of plain records (no gradio here).

`run_race` is the one loop behind the page and the scripted `/race` endpoint; everything it yields is plain data (no
model, no generators), so the same code runs under ZeroGPU, where model work happens in another process.
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import torch

from specdemo import __version__
from specdemo.app import model_thread, quiet_queue
from specdemo.app.gate import Busy, Gate
from specdemo.app.public import PublicModeRefusal, check_model
from specdemo.app.race import Piece, Race, Run, Summary, TextBuilder, summarize
from specdemo.app.request import (
    MAX_MODEL_CHARS,
    MODES,
    RaceRequest,
    UserError,
    race_all_request,
    race_request,
)
from specdemo.bench import acceptance_by_depth, run_bench
from specdemo.budget import measure_cost_curves
from specdemo.drafters import (
    LABELS,
    REGISTRY,
    DrafterUnavailable,
    make_drafter,
    note,
    unavailable_reason,
)
from specdemo.engine import GenerationConfig, StepEvent, generate, validate_request
from specdemo.offline.build_datastore import ensure_default
from specdemo.target import (
    EMBEDDED,
    ModelLoadError,
    Target,
    UnsupportedForTree,
    load_target,
)

DEFAULT_MODE_ORDER = tuple(m.name for m in sorted(REGISTRY, key=lambda m: m.default_rank))
ZERO_GPU = bool(os.environ.get("SPACES_ZERO_GPU"))


def _gpu(fn: Callable, duration: int = 120) -> Callable:
    """`spaces.GPU` when the `spaces` package is there (a no-op off ZeroGPU), else the function itself."""
    try:
        import spaces  # type: ignore
    except ImportError:
        return fn
    return spaces.GPU(duration=duration)(fn)


def model_name(name: str | None) -> str:
    """A model field as the cache keys it: stripped, empty meaning the embedded model."""
    return (name or EMBEDDED).strip() or EMBEDDED


class ModelCache:
    """Loaded targets by name, the most recent few kept (loading is the slow part; memory is the limit)."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._targets: OrderedDict[str, Target] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return model_name(name) in self._targets

    def get(self, name: str) -> Target:
        """The loaded target `name` (loading it on the model thread, like all model work)."""
        return model_thread.call(self._get, model_name(name))

    def _get(self, name: str) -> Target:
        with self._lock:
            if name in self._targets:
                self._targets.move_to_end(name)
                return self._targets[name]
            self._make_room()
            target = load_target(name)
            if name == EMBEDDED:  # a no-op when current; `make setup` builds it before the app starts
                ensure_default(target)
            measure_cost_curves(target)  # here, not in the first race's first step
            self._targets[name] = target
            return target

    def put(self, name: str, target: Target) -> None:
        """Share an already loaded target (tests, or a host app that loaded it)."""
        model_thread.call(self._put, name, target)

    def _put(self, name: str, target: Target) -> None:
        with self._lock:
            if name not in self._targets:
                self._make_room()
            measure_cost_curves(target)
            self._targets[name] = target

    def _make_room(self) -> None:
        """Drop the least recently used targets until one more fits; what drafters loaded for a model lives on its
        Target, so dropping it frees all of it."""
        while len(self._targets) >= self.keep:
            self._targets.popitem(last=False)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


MODELS = ModelCache()


def load_model(name: str) -> Target:
    """The model `name`, from the cache or loaded; the public mode's rules are checked before anything is fetched."""
    if name not in MODELS:
        check_model(model_name(name))
    return MODELS.get(name)


STREAM_EVERY = 0.1  # seconds between two streamed `/race` updates while racing
MAX_WAITING = 16  # requests queued behind the running one; the next is refused with a message
GATE = Gate(MAX_WAITING, on_hold=quiet_queue.hold)  # the server polls slowly while model work runs


def availability(target: Target) -> dict[str, str | None]:
    """Per mode: None when usable on this model, else the reason (with the command that fixes it)."""
    out = {}
    for m in MODES:
        try:
            out[m] = unavailable_reason(m, target)
        except Exception as exc:  # a half-written drafter module must not take the page down
            out[m] = f"{LABELS.get(m, m)} failed to report its status: {type(exc).__name__}: {exc}"
        if (text := note(m, target)) is not None:
            out[f"{m}:note"] = text
    return out


@dataclass
class RaceRecord:
    """Everything the page and the API show about one race; plain data, safe to keep in gr.State."""

    request: RaceRequest
    model: str = ""
    device: str = ""
    dtype: str = ""
    status: str = "queued"  # queued | starting | running | done | stopped | error
    message: str | None = None
    queue_wait_s: float = 0.0  # seconds spent waiting for the races ahead of this one
    started: float | None = None  # perf_counter when decoding began; wall_s runs from here
    ended: float | None = None
    # lane -> the method it runs: "ar" and "spec" in a race of one method; "ar" and one lane per method in race all
    lanes: dict[str, str] = field(default_factory=dict)
    runs: dict[str, Run] = field(default_factory=dict)
    pieces: dict[str, list[Piece]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    token_text: dict[int, str] = field(default_factory=dict)  # id -> text, for tree nodes and roots
    prompt_tail: list[int] = field(default_factory=list)  # the prompt's last token (the first step's root)
    summaries: dict[str, Summary] = field(default_factory=dict)  # per speculative lane, against the AR lane
    skipped: dict[str, str] = field(default_factory=dict)  # race all: methods unavailable here, with the reason

    def __post_init__(self) -> None:
        if not self.lanes:
            self.set_lanes(() if self.request.race_all else (self.request.method,))

    def set_lanes(self, methods: tuple[str, ...] | list[str]) -> None:
        """AR plus `methods`: one method races in lane "spec", several (race all) in lanes named after them."""
        if self.request.race_all:
            self.lanes = {"ar": "ar", **{m: m for m in methods}}
        else:
            self.lanes = {"ar": "ar", "spec": methods[0]}
        self.runs = {k: Run(k) for k in self.lanes}
        self.pieces = {k: [] for k in self.lanes}
        self.texts = {k: "" for k in self.lanes}

    @property
    def spec_lanes(self) -> list[str]:
        return [k for k in self.lanes if k != "ar"]

    @property
    def summary(self) -> Summary | None:
        """The single race's readout (its "spec" lane against AR)."""
        return self.summaries.get("spec")

    @summary.setter
    def summary(self, value: Summary | None) -> None:
        if value is None:
            self.summaries.pop("spec", None)
        else:
            self.summaries["spec"] = value

    @property
    def wall_s(self) -> float:
        """Wall time since decoding began (to the end, once over)."""
        if self.started is None:
            return 0.0
        return (self.ended or time.perf_counter()) - self.started

    @property
    def other_s(self) -> float:
        """Wall time that went to neither run's compute: whoever consumes the stream (the page's rendering and
        sending) and the race's bookkeeping.  Near zero through `/race`; what the page costs in the page."""
        return max(0.0, self.wall_s - sum(run.compute_s for run in self.runs.values()))

    @property
    def active(self) -> bool:
        return self.status in ("queued", "starting", "running")


def prepare(req: RaceRequest) -> tuple[Target, list[int], GenerationConfig]:
    """Load the model, encode the prompt and run the checks that need the model (the request's own fields were
    checked where it came in, by `request.race_request`): every problem becomes a UserError before any decoding."""
    try:
        target = load_model(req.model)
    except ModelLoadError as exc:
        raise UserError(str(exc)) from exc
    reason = None if req.race_all else unavailable_reason(req.method, target)
    if reason:
        raise UserError(f"{LABELS.get(req.method, req.method)} is unavailable for {target.name}: {reason}")
    ids = target.encode_prompt(req.prompt)
    cfg = GenerationConfig(max_new_tokens=int(req.max_new_tokens), sampling=req.sampling)
    try:
        validate_request(target, ids, cfg)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    return target, ids, cfg


def race_lanes(req: RaceRequest, target: Target) -> tuple[list[str], dict[str, str]]:
    """The methods a request races beside AR on `target`, and those it skips with the reason (race all only: a race
    of one method that cannot run is refused in `prepare`)."""
    if not req.race_all:
        return [req.method], {}
    wanted = req.methods or MODES
    skipped = {m: reason for m in wanted if (reason := unavailable_reason(m, target))}
    return [m for m in wanted if m not in skipped], skipped


def _race_events(req: RaceRequest, lanes: dict[str, str]) -> Iterator[tuple[str, StepEvent]]:
    """The model work: every lane's run interleaved by `Race`.  Runs on the GPU worker under ZeroGPU."""
    target, ids, cfg = prepare(req)
    runs = {}
    for key, method in lanes.items():
        try:
            drafter = None if method == "ar" else make_drafter(method, target, **req.options_of(method))
        except TypeError as exc:
            raise UserError(f"{LABELS.get(method, method)} does not take these settings: {exc}") from exc
        runs[key] = generate(target, ids, drafter, cfg)
    yield from Race(runs)


race_events = _gpu(_race_events)


def _bench(*args, **kwargs) -> dict:
    return run_bench(*args, **kwargs)


bench_on_device = _gpu(_bench, duration=300)  # decorated at import time, as ZeroGPU expects


def explain_error(exc: BaseException) -> str:
    """A message for the page; the app keeps serving whatever went wrong."""
    if isinstance(exc, (UserError, Busy, PublicModeRefusal, ModelLoadError, UnsupportedForTree, DrafterUnavailable)):
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
    events, ticket = None, None
    try:
        ticket = GATE.join()
        while ahead := GATE.wait(ticket, 1.0):
            rec.message = f"Waiting for {ahead} request{'s' if ahead > 1 else ''} ahead of yours to finish."
            yield rec
            if stop is not None and stop.is_set():
                rec.status, rec.message = "stopped", "Stopped while waiting for its turn."
                yield rec
                return
        rec.status, rec.message, rec.queue_wait_s = "starting", None, round(ticket.waited, 3)
        target, ids, _ = prepare(req)
        methods, rec.skipped = race_lanes(req, target)
        if not methods:
            raise UserError(f"No method is available for {target.name}: "
                            + "; ".join(f"{LABELS.get(m, m)}: {why}" for m, why in rec.skipped.items()))
        rec.set_lanes(methods)
        rec.model, rec.device, rec.dtype = target.name, target.device.type, str(target.dtype).replace("torch.", "")
        rec.prompt_tail = ids[-1:]
        builders = {k: TextBuilder(target.decode) for k in rec.lanes}
        rec.pieces = {k: b.pieces for k, b in builders.items()}
        yield rec
        rec.status, rec.started = "running", time.perf_counter()
        events = model_thread.iterate(lambda: race_events(req, rec.lanes))
        for name, ev in events:
            builders[name].add(ev.tokens, ev.step, ev.from_draft, ev.sources)
            rec.texts[name] = builders[name].text
            if name != "ar":
                for tok in ev.tree.tokens + ev.tokens + rec.prompt_tail:
                    if tok not in rec.token_text:
                        rec.token_text[tok] = target.tokenizer.decode([tok])
            rec.runs[name].add(ev)
            for key in rec.spec_lanes if name == "ar" else [name]:
                rec.summaries[key] = summarize(rec.runs["ar"], rec.runs[key])
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
        if ticket is not None:
            GATE.leave(ticket)
    if rec.started is not None:
        rec.ended = time.perf_counter()
    yield rec


def throttled(records: Iterator[RaceRecord], every: float) -> Iterator[RaceRecord]:
    """The records a watcher needs: every status change, at most one per `every` seconds of racing in between (the
    watcher's own time between two records does not count), and always the last (which carries the whole run).
    What is skipped costs nothing: the race goes on, and a watcher's work (rendering, sending, drawing) would share
    the cores with the decoding it watches."""
    last_sent, last_status = 0.0, None
    try:
        for rec in records:
            now = time.monotonic()
            if rec.active and rec.status == last_status and now - last_sent < every:
                continue
            last_status = rec.status
            yield rec
            last_sent = time.monotonic()  # the interval counts racing only, not the watcher's own time
    finally:  # a watcher that leaves (a closed page, a cancelled job) ends the race and frees its place in line
        if hasattr(records, "close"):
            records.close()


def _summary_json(s: Summary | None) -> dict | None:
    if s is None:
        return None
    return {"speedup": s.speedup, "tau": s.tau, "forwards": s.forwards, "baseline_forwards": s.baseline_forwards,
            "forwards_saved": s.forwards_saved, "identical": s.identical, "complete": s.complete,
            "first_difference": s.first_difference}


def record_json(rec: RaceRecord) -> dict:
    """The race in Spec-Bench's fields (new_tokens, wall_time, accept_lengths) per run, plus method, model and
    settings; a race-all record also has `board`: each method's summary against AR, and `skipped`.

    wall_time is each run's own compute time (the race interleaves the runs, so shared wall time means nothing).
    """
    req = rec.request
    runs = {}
    for key, run in rec.runs.items():
        method = rec.lanes[key]
        runs[method] = {
            "method": method, "new_tokens": run.n_tokens, "wall_time": run.compute_s,
            "accept_lengths": run.accept_lengths, "decoding_steps": run.forwards, "tokens_per_s": run.tokens_per_s,
            "tau": run.tau, "draft_s": [e.draft_s for e in run.events], "verify_s": [e.verify_s for e in run.events],
            "finish_reason": run.finish_reason, "tokens": run.tokens, "text": rec.texts[key],
            "acceptance_by_depth": acceptance_by_depth(run.accept_lengths),
        }
    out = {
        "specdemo": __version__, "model": rec.model, "device": rec.device, "dtype": rec.dtype,
        "method": req.method, "status": rec.status, "prompt": req.prompt,
        "settings": {"max_new_tokens": req.max_new_tokens, **asdict(req.sampling), "options": req.options},
        "runs": runs,
    }
    if req.race_all:
        out["board"] = {rec.lanes[k]: _summary_json(rec.summaries.get(k)) for k in rec.spec_lanes}
        out["skipped"] = dict(rec.skipped)
    else:
        out["summary"] = _summary_json(rec.summary)
    return out


def race_api(prompt: str, method: str = "pld", model: str = EMBEDDED, max_new_tokens: int = 64,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
             options: dict | None = None) -> dict:
    """Race plain decoding against `method` on `prompt`; streams a dict after every step, the last one final.
    A request out of range gets one dict with status "error" and a message that names the allowed range.

    Keys: status (queued|starting|running|done|stopped|error), message, model, method, queue_wait_s, ar / spec (text,
    new_tokens, wall_time, tokens_per_s, decoding_steps, accept_lengths, tau, done; spec also spans: [{text, step,
    accepted_draft, source}]), summary (speedup, tau, forwards_saved, identical, complete) and, in the final dict, run
    (the exported JSON)."""
    try:
        req = race_request(prompt, method, model, max_new_tokens, temperature, top_p, top_k, seed, options)
    except UserError as exc:
        yield refused_view(str(exc), method, model)
        return
    for rec in throttled(run_race(req), STREAM_EVERY):
        yield api_view(rec)


def refused_view(message: str, method, model) -> dict:
    """What `/race` sends for a request refused before it started: api_view's keys, empty panes."""
    rec = RaceRecord(RaceRequest(""), status="error", message=message)
    out = api_view(rec)
    out["method"], out["model"] = str(method)[:40], str(model)[:MAX_MODEL_CHARS]
    out.pop("run", None)  # nothing ran
    return out


LIVE_FIELDS = ("text", "new_tokens", "wall_time", "tokens_per_s", "decoding_steps", "accept_lengths", "tau")


def api_view(rec: RaceRecord) -> dict:
    """What `/race` streams: record_json's per-run fields (the same names as the export) for the two panes, the spec
    pane's highlighted spans, and the whole export once the race is over."""
    record = record_json(rec)
    panes = {}
    for key, method in (("ar", "ar"), ("spec", rec.request.method)):
        panes[key] = {k: record["runs"][method][k] for k in LIVE_FIELDS} | {"done": rec.runs[key].done}
    out = {"status": rec.status, "message": rec.message, "model": rec.model, "method": rec.request.method,
           "queue_wait_s": rec.queue_wait_s, **panes, "summary": record["summary"]}
    out["spec"]["spans"] = [{"text": p.text, "step": p.step + 1, "accepted_draft": p.from_draft, "source": p.source}
                            for p in TextBuilder.groups_of(rec.pieces["spec"]) if p.text]
    if not rec.active:
        out["run"] = record
    return out


def race_all_api(prompt: str, model: str = EMBEDDED, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, options: dict | None = None,
                 methods: list[str] | None = None) -> dict:
    """Race plain decoding against every method available for the model (or those in `methods`), each in its own
    lane; streams a dict after every step, the last one final.  `options` maps a method to its options.  Errors come
    back as one dict with status "error" and a message.

    Keys: status, message, model, queue_wait_s, skipped ({method: why it cannot run here}), lanes ({"ar" or method:
    text, new_tokens, wall_time, tokens_per_s, decoding_steps, accept_lengths, tau, done, acceptance_by_depth; the
    methods also speedup and identical}) and, in the final dict, run (the exported JSON, with `board`)."""
    try:
        req = race_all_request(prompt, model, max_new_tokens, temperature, top_p, top_k, seed, options, methods)
    except UserError as exc:
        yield {"status": "error", "message": str(exc), "model": str(model)[:MAX_MODEL_CHARS], "queue_wait_s": 0.0,
               "skipped": {}, "lanes": {}}
        return
    for rec in throttled(run_race(req), STREAM_EVERY):
        yield lanes_view(rec)


def lanes_view(rec: RaceRecord) -> dict:
    """What `/race_all` streams: each lane's live fields (the export's names) and its result against AR."""
    record = record_json(rec)
    lanes = {}
    for key, method in rec.lanes.items():
        lane = {k: record["runs"][method][k] for k in (*LIVE_FIELDS, "acceptance_by_depth")}
        lane["done"] = rec.runs[key].done
        if key != "ar":
            s = rec.summaries.get(key)
            lane["speedup"], lane["identical"] = (s.speedup, s.identical) if s else (None, True)
        lanes[method] = lane
    out = {"status": rec.status, "message": rec.message, "model": rec.model, "queue_wait_s": rec.queue_wait_s,
           "skipped": dict(rec.skipped), "lanes": lanes}
    if not rec.active:
        out["run"] = record
    return out
