"""The race loop: a checked request becomes a stream of RaceRecords, for the page and the API alike.

Every run is an `engine.generate()` generator in ONE process.  Wall-clock time would be shared between them, so each
run is charged only its own compute (the sum of its steps' `draft_s + verify_s`, which the engine measures around
device-synchronised work), and the scheduler always advances the run that has used the least of it.  At any moment
every run has spent about the same compute, so the text on screen grows in proportion to each decoder's real speed.

A request is prepared once (model, prompt ids, the checks that need the model) and its options were checked once at
the edge (request.py).  The model work itself (`race_events`) takes and yields plain data only, so under ZeroGPU it
runs in the GPU worker process.  A failure anywhere ends that one race with a message naming what failed; the gate
and the model thread are freed for the next request.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from specdemo.app.clocks import model_thread, quiet_queue
from specdemo.app.clocks.gate import Busy, Gate, Ticket
from specdemo.app.models import MODELS, load_model
from specdemo.app.public import PublicModeRefusal
from specdemo.app.record import AR, LaneStyle, RaceRecord, TextBuilder
from specdemo.app.request import RaceRequest, UserError, modes
from specdemo.budget import measured_costs
from specdemo.drafters import BY_NAME, LABELS, DrafterUnavailable, build_drafter, sources, unavailable_reason
from specdemo.engine import GenerationConfig, StepEvent, generate, validate_request
from specdemo.target import ModelLoadError, Target, UnsupportedForTree

ZERO_GPU = bool(os.environ.get("SPACES_ZERO_GPU"))
STREAM_EVERY = 0.1  # seconds between two streamed API updates while racing
MAX_WAITING = 16  # requests queued behind the running one; the next is refused with a message
GATE = Gate(MAX_WAITING, on_hold=quiet_queue.hold)  # the server polls slowly while model work runs


def on_gpu(fn: Callable, duration: int = 120) -> Callable:
    """`spaces.GPU` when the `spaces` package is there (a no-op off ZeroGPU), else the function itself."""
    try:
        import spaces  # type: ignore
    except ImportError:
        return fn
    return spaces.GPU(duration=duration)(fn)


class Race:
    """Interleave named step generators; always advance the unfinished run with the least compute so far.

    Iterating yields `(name, event)`.  Ties go to the run named first.  A generator that ends without a finished
    event (the caller stopped it, or it was empty) simply drops out.  Exceptions from a generator propagate.
    """

    def __init__(self, generators: dict[str, Iterator]):
        self.generators = dict(generators)
        self.compute = {name: 0.0 for name in self.generators}
        self.done: set[str] = set()

    def next_name(self) -> str | None:
        live = [name for name in self.generators if name not in self.done]
        return min(live, key=self.compute.__getitem__) if live else None  # min() keeps the first of equals

    def advance(self) -> tuple[str, StepEvent] | None:
        """One step of whichever run is behind; None when every run is done."""
        while (name := self.next_name()) is not None:
            event = next(self.generators[name], None)
            if event is None:
                self.done.add(name)
                continue
            self.compute[name] += event.draft_s + event.verify_s
            if event.finish_reason is not None:
                self.done.add(name)
            return name, event
        return None

    def __iter__(self) -> Iterator[tuple[str, StepEvent]]:
        try:
            while (item := self.advance()) is not None:
                yield item
        finally:
            self.close()

    def close(self) -> None:
        for gen in self.generators.values():
            if close := getattr(gen, "close", None):
                close()


class LaneFailed(RuntimeError):
    """A run raised mid-race; the message names the method and the step."""


def _named_lane(label: str, events: Iterator[StepEvent]) -> Iterator[StepEvent]:
    """`events`, with any exception re-raised as LaneFailed naming the lane and the step it failed at."""
    step = 0
    try:
        for event in events:
            step = event.step + 1
            yield event
    except Exception as exc:  # noqa: BLE001 — re-raised with the lane's name, the cause kept
        raise LaneFailed(f"{label} failed at step {step + 1}") from exc


@dataclass
class Prepared:
    """What a request needs before decoding, worked out once: the model, the prompt's ids, the generation config,
    the methods that race (with their styles) and those skipped with the reason."""

    target: Target
    ids: list[int]
    config: GenerationConfig
    methods: list[str]
    skipped: dict[str, str]


def prepare(req: RaceRequest) -> Prepared:
    """Load the model, encode the prompt and run the checks that need the model: every problem becomes a message
    before any decoding.  A method that cannot run here refuses a race of one method, and is skipped by race all."""
    target = load_model(req.model)
    wanted = (req.methods or modes()) if req.race_all else req.methods
    skipped = {m: reason for m in wanted if (reason := unavailable_reason(m, target))}
    if skipped and not req.race_all:
        method, reason = next(iter(skipped.items()))
        raise UserError(f"{LABELS.get(method, method)} is unavailable for {target.name}: {reason}")
    methods = [m for m in wanted if m not in skipped]
    if not methods:
        raise UserError(f"No method is available for {target.name}: "
                        + "; ".join(f"{LABELS.get(m, m)}: {why}" for m, why in skipped.items()))
    ids = target.encode_prompt(req.prompt)
    cfg = GenerationConfig(max_new_tokens=int(req.max_new_tokens), sampling=req.sampling)
    try:
        validate_request(target, ids, cfg)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    return Prepared(target, ids, cfg, methods, skipped)


def lane_style(method: str) -> LaneStyle:
    """A method's label, plot colour and draft sources, from the drafter registry."""
    return LaneStyle(LABELS.get(method, method), BY_NAME[method].colour,
                     tuple((s.name, s.label, s.colour, s.dark) for s in sources(method)))


def _race_events(model: str, ids: list[int], cfg: GenerationConfig, methods: list[str],
                 options: dict[str, dict]) -> Iterator[tuple[str, StepEvent]]:
    """The model work: AR and every method's run interleaved by `Race` (the GPU worker's part under ZeroGPU).
    `options` were checked where the request came in, so the drafters are built without checking them again."""
    target = MODELS.get(model)
    runs = {AR: generate(target, ids, None, cfg)}
    for m in methods:
        drafter = build_drafter(m, target, options.get(m, {}))
        runs[m] = _named_lane(LABELS.get(m, m), generate(target, ids, drafter, cfg))
    yield from Race(runs)


race_events = on_gpu(_race_events)


def explain_error(exc: BaseException) -> str:
    """A message for the page; the app keeps serving whatever went wrong."""
    where = ""
    if isinstance(exc, LaneFailed) and exc.__cause__ is not None:
        where, exc = f"{exc}: ", exc.__cause__
    if isinstance(exc, (UserError, Busy, PublicModeRefusal, ModelLoadError, UnsupportedForTree, DrafterUnavailable)):
        return where + str(exc)
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return where + "Out of memory: lower max new tokens, shorten the prompt or pick a smaller model."
    if isinstance(exc, ValueError) and not where:
        return str(exc)
    return f"{where or 'Something went wrong: '}{type(exc).__name__}: {str(exc)[:300]}"


def _wait_turn(rec: RaceRecord, ticket: Ticket, stop: threading.Event | None) -> Iterator[RaceRecord]:
    """Yield the record while `ticket` waits in the gate's line; the record's status says how it ended ("starting":
    it holds the gate now; "stopped": stopped while waiting)."""
    while ahead := GATE.wait(ticket, 1.0):
        rec.message = f"Waiting for {ahead} request{'s' if ahead > 1 else ''} ahead of yours to finish."
        yield rec
        if stop is not None and stop.is_set():
            rec.status, rec.message = "stopped", "Stopped while waiting for its turn."
            return
    rec.status, rec.message, rec.queue_wait_s = "starting", None, round(ticket.waited, 3)


def _start(rec: RaceRecord, prep: Prepared) -> dict[str, TextBuilder]:
    """The record's lanes for the prepared race; the text builders that will fill them."""
    rec.skipped = prep.skipped
    rec.set_lanes({m: lane_style(m) for m in prep.methods})
    target = prep.target
    rec.model, rec.device, rec.dtype = target.name, target.device.type, str(target.dtype).replace("torch.", "")
    rec.precision, rec.caveat = target.precision, target.precision_note
    rec.verify_costs = measured_costs(target)
    rec.prompt_tail = prep.ids[-1:]
    builders = {k: TextBuilder(target.decode) for k in rec.runs}
    rec.pieces = {k: b.pieces for k, b in builders.items()}
    return builders


def _record_step(rec: RaceRecord, builder: TextBuilder, lane: str, ev: StepEvent, target: Target) -> None:
    builder.add(ev.tokens, ev.step, ev.from_draft, ev.sources)
    if lane != AR:  # the tree view shows every node's text
        for tok in ev.tree.tokens + ev.tokens + rec.prompt_tail:
            if tok not in rec.token_text:
                rec.token_text[tok] = target.tokenizer.decode([tok])
    rec.add(lane, ev, builder.text)


def run_race(req: RaceRequest, stop: threading.Event | None = None) -> Iterator[RaceRecord]:
    """Yield the record while waiting for a turn, after the start, after every step of any run, and once more at
    the end.  `stop` is checked after every step, so Stop takes effect within one step."""
    rec, events, ticket = RaceRecord(req), None, None
    try:
        ticket = GATE.join()
        yield from _wait_turn(rec, ticket, stop)
        if rec.status == "starting":
            prep = prepare(req)
            builders = _start(rec, prep)
            yield rec
            rec.status, rec.started = "running", time.perf_counter()
            events = model_thread.iterate(lambda: race_events(req.model, prep.ids, prep.config, prep.methods,
                                                              req.options))
            for lane, ev in events:
                _record_step(rec, builders[lane], lane, ev, prep.target)
                yield rec
                if stop is not None and stop.is_set():
                    rec.status, rec.message = "stopped", "Stopped: the numbers below cover the steps run so far."
                    break
            else:
                rec.status = "done"
    except Exception as exc:  # noqa: BLE001 — every failure becomes a message; the server keeps going
        rec.status, rec.message = "error", explain_error(exc)
    finally:
        if events is not None:
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
