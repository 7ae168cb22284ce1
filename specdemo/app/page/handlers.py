"""The page's event handlers: a race streamed into the page, model loads, Stop, step by step, the user's datastore
and the Benchmark tab.  The page never decodes by itself: it streams `racing.run_race`'s records into its outputs.

Per-session state lives in the page's `gr.State` (the last race, the user's datastore); the only shared table is the
Stop flags of the races running now, keyed by session and removed when the race ends, so it never outgrows the
gate's line.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time

import gradio as gr
import pandas as pd

from specdemo.app.clocks import model_thread
from specdemo.app.clocks.drawn import DRAWN, same_machine
from specdemo.app.models import MODELS, availability, load_model, model_name
from specdemo.app.page.examples import EXAMPLES
from specdemo.app.plots import PLOTS, plot_data
from specdemo.app.public import public_mode
from specdemo.app.racing import GATE, ZERO_GPU, explain_error, on_gpu, run_race, throttled
from specdemo.app.record import RaceRecord, record_json
from specdemo.app.render import (
    bench_bars_html,
    header_html,
    lanes_html,
    message_html,
    modes_html,
    pane_html,
    show_step,
    summary_html,
)
from specdemo.app.request import RACE_ALL, UserError, modes, race_all_request, race_request
from specdemo.app.user_store import UserStoreError, build_user_store
from specdemo.bench import prefill_line, run_bench
from specdemo.drafters import DEFAULT_METHOD, LABELS, all_knobs, by_default_rank
from specdemo.drafters.rest.datastore import DatastoreError
from specdemo.precision import model_spec
from specdemo.sampling import SamplingConfig
from specdemo.target import EMBEDDED

# The page's updates while racing: the text at most every TEXT_EVERY seconds of racing, the plots at most every
# PLOT_EVERY (each redraw re-embeds every chart, the browser's most expensive work).  A browser on this machine draws
# them on the cores the race is timed on, so the race waits until the page reports each one drawn (clocks/drawn.py);
# the wait is charged to no run and the summary shows it.
TEXT_EVERY = 0.5
PLOT_EVERY = 5.0
# what `_stream` yields, in order: the page's race outputs (the layout lists its components in the same order)
RACE_OUTPUTS = ("ar_pane", "spec_pane", "summary", "message", "record_state", "step", "tree_view", "explanation",
                "step_text", "export_btn", "pair", "lanes", "step_lane") + tuple(p.name for p in PLOTS)

_STOPS: dict[str, threading.Event] = {}  # session -> the Stop flag of its running race (removed when it ends)


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "default"


def options_of(method: str, values: tuple) -> dict:
    """The page's sliders of `method` as drafter options (a slider at 0 may mean "the drafter's own default")."""
    out = {}
    for knob, value in zip(all_knobs(), values):
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


def on_race(request: gr.Request, mode: str, model: str, precision: str, prompt: str, max_new_tokens: float,
            temperature: float, top_p: float, top_k: float, seed: float, user_store: tuple | None, *knobs):
    """Generate (mode = a method) and Race all (mode = "all"): check the request once, then stream the race."""
    try:
        options = {m: options_of(m, knobs) for m in modes()}
        if user_store and user_store[0] == model_name(model):  # REST retrieves from the user's own datastore
            options["rest"] = {**options["rest"], "datastore": user_store[1]}
        model = with_precision(model, precision)
        if mode == RACE_ALL:
            req = race_all_request(prompt, model or EMBEDDED, max_new_tokens, temperature, top_p, top_k, seed, options)
        else:
            req = race_request(prompt, mode or DEFAULT_METHOD, model or EMBEDDED, max_new_tokens, temperature,
                               top_p, top_k, seed, options.get(mode))
    except UserError as exc:
        gr.Warning(str(exc))
        yield tuple(message_html(str(exc), "error") if name == "message" else gr.skip() for name in RACE_OUTPUTS)
        return
    yield from _stream(req, request)


def _stream(req, request: gr.Request | None):
    """Stream a race into the page: text at most every TEXT_EVERY seconds of racing, plots every PLOT_EVERY, and
    everything at the end.  A browser on this machine is waited for after each update until it misses one."""
    stop = _STOPS.setdefault(_session(request), threading.Event())
    stop.clear()
    last_plot, first, acked = 0.0, True, 0
    wait_for_page = same_machine(getattr(getattr(request, "client", None), "host", None))
    try:
        for rec in throttled(run_race(req, None if ZERO_GPU else stop), TEXT_EVERY):
            final = not rec.active
            lane = rec.chosen_lane()  # the per-lane plots' lane: once it has a step, every chart has marks to draw
            started = rec.status == "running" and lane is not None and bool(rec.runs[lane].events)
            plot_now = final or (started and time.monotonic() - last_plot > PLOT_EVERY)
            if plot_now:
                last_plot = time.monotonic()
            if final and rec.status == "error":
                gr.Warning(rec.message)
            token = DRAWN.expect() if wait_for_page and not final else None
            out = _race_outputs(rec, lane, first, final, plot_now, summary_html(rec, token, acked, plot_now))
            yield tuple(out[k] for k in RACE_OUTPUTS)
            first = False
            if token is not None:
                if DRAWN.wait(token):
                    acked += 1
                else:
                    wait_for_page = False
    finally:
        _STOPS.pop(_session(request), None)


def _race_outputs(rec: RaceRecord, lane: str | None, first: bool, final: bool, plot_now: bool, summary: str) -> dict:
    """One update of the page's race outputs (gr.skip() for what this update leaves alone); `lane` is the method lane
    the per-lane views show."""
    skip, every = gr.skip(), rec.request.race_all
    out = dict(
        ar_pane=skip if every else pane_html(rec, "ar"),
        spec_pane=skip if every else pane_html(rec, rec.request.methods[0] if rec.request.methods else ""),
        summary=summary,
        message=message_html(rec.message, "error" if rec.status == "error" else "info") if final or rec.message else "",
        record_state=rec if final else skip,
        step=step_slider(rec, lane) if final else skip,
        export_btn=(gr.DownloadButton(value=_write_json(record_json(rec), "specdemo-run-"), interactive=True)
                    if final and lane and rec.runs[lane].events else skip),
        pair=gr.Row(visible=not every) if first else skip,
        lanes=gr.HTML(lanes_html(rec), visible=every) if every or first else skip,
        step_lane=(gr.Dropdown(choices=[(rec.label(k), k) for k in rec.method_lanes], value=lane, visible=every)
                   if final else skip),
    )
    out.update(zip(("tree_view", "explanation", "step_text"), show_step(rec, 1, lane) if final else (skip,) * 3))
    out.update(plot_updates(rec, lane) if plot_now else {p.name: skip for p in PLOTS})
    return out


def plot_updates(rec: RaceRecord | None, lane: str | None = None) -> dict:
    """Every plot as an update.  Each carries a caption that changes with the data: a changed caption makes Gradio
    re-embed the chart (a bare data swap keeps stale scales)."""
    chart = {"line": gr.LinePlot, "bar": gr.BarPlot}
    return {plot.name: chart[plot.kind](value=frame, **settings) for plot, frame, settings in plot_data(rec, lane)}


def refresh_plots(rec: RaceRecord | None) -> tuple:
    """The plots once more after a race: Gradio shows a re-embedded plot's last streamed update late."""
    if rec is None:
        return (gr.skip(),) * len(PLOTS)
    updates = plot_updates(rec, rec.chosen_lane())
    return tuple(updates[p.name] for p in PLOTS)


def on_stop(request: gr.Request | None = None) -> None:
    if (flag := _STOPS.get(_session(request))) is not None:
        flag.set()


def step_slider(rec: RaceRecord | None, lane: str | None) -> gr.Slider:
    """Step by step's slider at step 1, sized to the steps of `lane`."""
    key = rec.chosen_lane(lane) if rec is not None else None
    n = len(rec.runs[key].events) if key else 0
    return gr.Slider(minimum=1, maximum=max(n, 2), value=1, step=1, interactive=n > 1)


def on_step_lane(rec: RaceRecord | None, lane: str | None) -> tuple:
    """Step by step switched to another lane of a race all: its first step, the slider sized to its steps."""
    return (step_slider(rec, lane), *show_step(rec, 1, lane))


def next_step(k: float, rec: RaceRecord | None, lane: str | None) -> int:
    key = rec.chosen_lane(lane) if rec is not None else None
    return min(int(k) + 1, len(rec.runs[key].events)) if key else 1


def with_precision(model: str | None, precision: str | None) -> str:
    """The model field and the precision picker as one model spec ("embedded@int4"), or a UserError."""
    try:
        return model_spec(model, precision)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def on_load_model(model: str, precision: str, current: str | None):
    """Load (or fetch from cache) the model at the picked precision; refresh the header and which modes can run."""
    try:
        model = with_precision(model, precision)
        if model in MODELS:
            target = MODELS.get(model)
        else:
            with GATE.turn():  # loading competes with a running race for the cores (and may evict a model)
                target = load_model(model)
    except Exception as exc:  # noqa: BLE001
        msg = explain_error(exc)
        gr.Warning(msg)
        return (header_html(None, "model not loaded"), gr.skip(), gr.skip(), message_html(msg), gr.skip(), gr.skip(),
                gr.skip())
    avail = availability(target)
    ok = [m for m in modes() if avail[m] is None]
    value = current if current in ok else next((m for m in by_default_rank() if m in ok), None)
    choices = [(LABELS.get(m, m) + ("" if avail[m] is None else " (unavailable)"), m) for m in modes()]
    return (header_html(target.describe()), gr.Radio(choices=choices, value=value), modes_html(avail, LABELS), "",
            avail, gr.CheckboxGroup(choices=[(LABELS.get(m, m), m) for m in ok], value=ok[:1]),
            generate_button(avail, value))


def generate_button(avail: dict | None, method: str | None):
    if avail and method in avail and avail[method] is not None:
        return gr.Button(value=f"{LABELS.get(method, method)} unavailable", interactive=False)
    return gr.Button(value="Generate", interactive=True)


def on_mode(method: str, avail: dict | None):
    avail = avail or {}
    reason = avail.get(method) or avail.get(f"{method}:note")
    return generate_button(avail, method), message_html(reason, "info") if reason else ""


def on_build_store(model: str, files: list[str] | None, folder: str | None,
                   progress=gr.Progress(track_tqdm=True)) -> tuple[str, tuple | None]:
    """Your datastore: build a REST datastore for the loaded model from uploads or a folder (local mode only); the
    session's REST races on that model then use it (the returned state)."""
    if public_mode():
        return message_html("Building datastores is off in the public mode.", "error"), gr.skip()
    inputs = list(files or []) + ([folder.strip()] if folder and folder.strip() else [])
    if not inputs:
        return (message_html("Upload files or archives, or name a folder on this machine, then press Build.", "error"),
                gr.skip())
    name = model_name(model)
    try:
        with GATE.turn():  # tokenising and sorting compete with a running race for the cores
            target = load_model(name)
            progress(0, desc="reading the files")
            out, manifest, corpus = build_user_store(target, inputs)
    except (UserStoreError, DatastoreError) as exc:
        return message_html(str(exc), "error"), gr.skip()
    except Exception as exc:  # noqa: BLE001 — every failure becomes a message
        return message_html(explain_error(exc), "error"), gr.skip()
    skipped = f" Skipped: {corpus.skipped_text()}." if corpus.skipped else ""
    return (message_html(f"Built a datastore of {manifest['tokens']:,} tokens from {len(corpus.files)} file(s) "
                         f"({corpus.bytes / 1e6:.1f} MB) for {target.name}. REST races on this model now retrieve "
                         f"from it (Generate with REST, or Race all).{skipped}", "info"), (name, str(out)))


def on_reset_store() -> tuple[str, None]:
    return message_html("REST uses the model's default datastore again.", "info"), None


def _bench(model: str, *args, **kwargs) -> dict:
    """The Benchmark tab's model work (the GPU worker's part under ZeroGPU): takes the model's name, not the model,
    so that only plain data crosses to the worker."""
    return run_bench(MODELS.get(model), *args, **kwargs)


bench_on_device = on_gpu(_bench, duration=300)  # decorated at import time, as ZeroGPU expects


BENCH_COLUMNS = ("method", "tok/s", "speedup", "τ", "identical", "draft ms", "verify ms")


def empty_bench_table() -> pd.DataFrame:
    """The Benchmark tab's results before a run and after a failed one: its columns, no rows (a table without a value
    shows the headers 1, 2, 3)."""
    return pd.DataFrame(columns=list(BENCH_COLUMNS))


def on_bench(model: str, precision: str, methods: list[str], prompt_labels: list[str], max_new_tokens: float,
             progress: gr.Progress = gr.Progress()):
    """Run specdemo.bench over the chosen example prompts: a table, a speedup chart and the JSON."""
    empty = empty_bench_table()
    try:
        model = with_precision(model, precision)
        if not methods:
            raise UserError("Pick at least one method to compare with autoregressive decoding.")
        prompts = [{"id": c, "prompt": p} for c, p in EXAMPLES if c in (prompt_labels or [])]
        if not prompts:
            raise UserError("Pick at least one example prompt.")

        def report(i: int, n: int, pid: str = "", method: str = "", *_) -> None:
            progress(i / max(n, 1), desc=f"{pid} · {LABELS.get(method, method)}")

        with GATE.turn():
            load_model(model)  # the public mode's checks, and the load itself, before the GPU function
            result = model_thread.call(bench_on_device, model_name(model), list(methods), prompts,
                                       int(max_new_tokens), sampling=SamplingConfig(),
                                       progress=None if ZERO_GPU else report)
    except Exception as exc:  # noqa: BLE001
        msg = explain_error(exc)
        gr.Warning(msg)
        return empty, "", message_html(msg), gr.skip()
    # as text with fixed decimals: the table shows a float 1.0 as "1" beside "1.67"
    f = lambda v, nd=2, unit="": None if v is None else f"{v:.{nd}f}{unit}"  # noqa: E731
    rows = [{"method": LABELS.get(m, m), "tok/s": f(r["tokens_per_s"]), "speedup": f(r["speedup"], unit="×"),
             "τ": f(r["tau"]),
             "identical": None if r["identical"] is None else f"{100 * r['identical']:.0f}%",
             "draft ms": f(r["draft_ms"], 1), "verify ms": f(r["verify_ms"], 1)} for m, r in result["methods"].items()]
    bars = {LABELS.get(m, m): r["speedup"] or 0.0 for m, r in result["methods"].items()}
    note = (f"{result.get('model')} on {result.get('device')} · {len(prompts)} prompts · "
            f"{int(max_new_tokens)} new tokens max · greedy. Speedup = tokens/s ÷ autoregressive tokens/s, same run."
            + (f" {line[0].upper()}{line[1:]}." if (line := prefill_line(result, LABELS)) else ""))
    return (pd.DataFrame(rows), bench_bars_html(bars, LABELS["ar"]), message_html(note, "info"),
            gr.DownloadButton(value=_write_json(result, "specdemo-bench-"), interactive=True))
