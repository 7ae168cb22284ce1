"""The Gradio page: layout and event handlers.  Decoding lives in session.py, HTML in render.py, charts in plots.py.

The page never decodes by itself: it streams `session.run_race`'s records into the panes, the summary and the plots.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from types import SimpleNamespace

import gradio as gr
import pandas as pd

from specdemo import ASSETS
from specdemo.app import calm_trackers, model_thread, quiet_queue
from specdemo.app.drawn import DRAWN, mark_drawn, same_machine
from specdemo.app.plots import DEPTHS, SERIES_COLOURS, plots, series
from specdemo.app.public import public_mode
from specdemo.app.render import (
    bench_bars_html,
    header_html,
    lanes_html,
    message_html,
    modes_html,
    pane_html,
    show_step,
    step_lane,
    summary_html,
)
from specdemo.app.request import (
    MAX_NEW_TOKENS,
    MODES,
    RaceRequest,
    UserError,
    race_all_request,
    race_request,
)
from specdemo.app.session import (
    DEFAULT_MODE_ORDER,
    GATE,
    MAX_WAITING,
    MODELS,
    ZERO_GPU,
    RaceRecord,
    availability,
    bench_on_device,
    explain_error,
    load_model,
    model_name,
    race_all_api,
    race_api,
    record_json,
    run_race,
    throttled,
)
from specdemo.app.user_store import (
    MAX_FILES,
    MAX_TEXT_BYTES,
    UserStoreError,
    build_user_store,
)
from specdemo.drafters import (
    LABELS,
    REGISTRY,
    all_knobs,
    knobs,
    options,
)
from specdemo.drafters.rest.datastore import DatastoreError
from specdemo.sampling import SamplingConfig
from specdemo.target import (
    EMBEDDED,
)

MODEL_CHOICES = (
    EMBEDDED,
    "HuggingFaceTB/SmolLM2-360M-Instruct",
    "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "Qwen/Qwen2.5-1.5B-Instruct",
)
# Every event that touches a model shares one concurrency id.  Gradio lets enough of them in for the gate's line
# (session.GATE serialises the model work itself and refuses the overflow with a message); its own queue is only a
# backstop, since a request it refuses reaches a scripted client as an error without a message.
MODEL_WORK = "model"
# The page's updates while racing: the text at most every TEXT_EVERY seconds of racing, the plots at most every
# PLOT_EVERY (each redraw re-embeds four charts, the browser's most expensive work).  A browser on this machine draws
# them on the cores the race is timed on, so the race waits until the page reports each one drawn (app/drawn.py); the
# wait is charged to no run and the summary shows it.
TEXT_EVERY = 0.5
PLOT_EVERY = 5.0
MODEL_WORK_LIMIT = MAX_WAITING + 2
QUEUE_SIZE = 4 * MAX_WAITING


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


# ----------------------------------------------------------------------------------------------------------- models


# ------------------------------------------------------------------------------------------------------ the race loop


# ---------------------------------------------------------------------------------------------------------- render


# -------------------------------------------------------------------------------------------- step-by-step view


# ----------------------------------------------------------------------------------------------------- handlers

_STOPS: dict[str, threading.Event] = {}


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "default"


def _options(method: str, values: tuple) -> dict:
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


def on_generate(model: str, method: str, prompt: str, max_new_tokens: float, temperature: float, top_p: float,
                top_k: float, seed: float, *knobs, request: gr.Request | None = None):
    """The page's Generate: stream the race into both panes, the summary and (throttled) the plots."""
    try:
        options = _with_user_store({method: _options(method, knobs)}, model, request)[method]
        req = race_request(prompt, method or "pld", model or EMBEDDED, max_new_tokens, temperature, top_p, top_k, seed,
                           options)
    except UserError as exc:
        yield _refused(str(exc))
        return
    yield from _stream(req, request)


def on_race_all(model: str, prompt: str, max_new_tokens: float, temperature: float, top_p: float, top_k: float,
                seed: float, *knobs, request: gr.Request | None = None):
    """The page's Race all: AR and every method available for the model, one lane each, each with its settings."""
    try:
        req = race_all_request(prompt, model or EMBEDDED, max_new_tokens, temperature, top_p, top_k, seed,
                               _with_user_store({m: _options(m, knobs) for m in MODES}, model, request))
    except UserError as exc:
        yield _refused(str(exc))
        return
    yield from _stream(req, request)


# session -> (model, folder) of the datastore built in "Your datastore" (local mode): that model's REST races use it
_USER_STORES: dict[str, tuple[str, str]] = {}


def _with_user_store(options: dict[str, dict], model: str | None, request: gr.Request | None) -> dict[str, dict]:
    store = _USER_STORES.get(_session(request))
    if store and "rest" in options and store[0] == model_name(model):
        options["rest"] = {**options["rest"], "datastore": store[1]}
    return options


def on_build_store(model: str, files: list[str] | None, folder: str | None, request: gr.Request | None = None,
                   progress=gr.Progress(track_tqdm=True)) -> str:
    """Your datastore: build a REST datastore for the loaded model from uploads or a folder (local mode only)."""
    if public_mode():
        return message_html("Building datastores is off in the public mode.", "error")
    inputs = list(files or []) + ([folder.strip()] if folder and folder.strip() else [])
    if not inputs:
        return message_html("Upload files or archives, or name a folder on this machine, then press Build.", "error")
    name = model_name(model)
    try:
        with GATE.turn():  # tokenising and sorting compete with a running race for the cores
            target = load_model(name)
            progress(0, desc="reading the files")
            out, manifest, corpus = build_user_store(target, inputs)
    except (UserStoreError, DatastoreError) as exc:
        return message_html(str(exc), "error")
    except Exception as exc:  # noqa: BLE001 — every failure becomes a message
        return message_html(explain_error(exc), "error")
    _USER_STORES[_session(request)] = (name, str(out))
    skipped = f" Skipped: {corpus.skipped_text()}." if corpus.skipped else ""
    return message_html(f"Built a datastore of {manifest['tokens']:,} tokens from {len(corpus.files)} file(s) "
                        f"({corpus.bytes / 1e6:.1f} MB) for {target.name}. REST races on this model now retrieve from "
                        f"it (Generate with REST, or Race all).{skipped}", "info")


def on_reset_store(request: gr.Request | None = None) -> str:
    _USER_STORES.pop(_session(request), None)
    return message_html("REST uses the model's default datastore again.", "info")


def _refused(message: str) -> tuple:
    gr.Warning(message)
    return tuple(message_html(message, "error") if name == "message" else gr.skip() for name in RACE_OUTPUTS)


# what _stream yields, in order (the page's race outputs; _wire lists the components in the same order)
RACE_OUTPUTS = ("ar_pane", "spec_pane", "summary", "message", "curve_plot", "hist_plot", "time_plot", "record_state",
                "step", "tree_view", "explanation", "step_text", "export_btn", "pair", "lanes", "depth_plot",
                "step_lane")


def _stream(req: RaceRequest, request: gr.Request | None):
    """Stream a race (of one method, or race all) into the page: text at most every TEXT_EVERY seconds of racing,
    plots every PLOT_EVERY, and everything at the end.  A browser on this machine is waited for after each update
    until it misses one (app/drawn.py)."""
    stop = _STOPS.setdefault(_session(request), threading.Event())
    stop.clear()
    last_plot, first = 0.0, True
    wait_for_page = same_machine(getattr(getattr(request, "client", None), "host", None))
    acked = 0
    skip = gr.skip()
    try:
        for rec in throttled(run_race(req, None if ZERO_GPU else stop), TEXT_EVERY):
            final = not rec.active
            now = time.monotonic()
            plot_now = final or now - last_plot > PLOT_EVERY
            if plot_now:
                last_plot = now
            if final and rec.status == "error":
                gr.Warning(rec.message)
            lane = step_lane(rec)
            token = DRAWN.expect() if wait_for_page and not final else None
            every = req.race_all
            out = dict(
                ar_pane=skip if every else pane_html(rec, "ar"),
                spec_pane=skip if every else pane_html(rec, "spec"),
                summary=summary_html(rec, token, acked),
                message=(message_html(rec.message, "error" if rec.status == "error" else "info")
                         if final or rec.message else ""),
                record_state=rec if final else skip,
                step=_step_slider(rec, lane) if final else skip,
                export_btn=(gr.DownloadButton(value=_write_json(record_json(rec), "specdemo-run-"), interactive=True)
                            if final and lane and rec.runs[lane].events else skip),
                pair=gr.Row(visible=not every) if first else skip,
                lanes=gr.HTML(lanes_html(rec), visible=every) if every or first else skip,
                step_lane=(gr.Dropdown(choices=[(LABELS.get(rec.lanes[k], k), k) for k in rec.spec_lanes],
                                       value=lane, visible=every) if final else skip),
            )
            out.update(zip(("tree_view", "explanation", "step_text"),
                           show_step(rec, 1, lane) if final else (skip,) * 3))
            out.update(zip(("curve_plot", "hist_plot", "time_plot", "depth_plot"),
                           plot_updates(rec) if plot_now else (skip,) * 4))
            yield tuple(out[k] for k in RACE_OUTPUTS)
            first = False
            if token is not None:
                if DRAWN.wait(token):
                    acked += 1
                else:
                    wait_for_page = False
    finally:
        _STOPS.pop(_session(request), None)


COLOUR_JS = '(v) => { document.body.classList.toggle("sd-by-source", v === "by source"); return v; }'


def _step_slider(rec: RaceRecord | None, lane: str | None) -> gr.Slider:
    """Step by step's slider at step 1, sized to the steps of `lane` (as step_lane resolves it)."""
    key = step_lane(rec, lane)
    n = len(rec.runs[key].events) if key else 0
    return gr.Slider(minimum=1, maximum=max(n, 2), value=1, step=1, interactive=n > 1)


def _on_step_lane(rec: RaceRecord | None, lane: str | None) -> tuple:
    """Step by step switched to another lane of a race all: its first step, the slider sized to its steps."""
    return (_step_slider(rec, lane), *show_step(rec, 1, lane))


def _next_step(k: float, rec: RaceRecord | None, lane: str | None) -> int:
    key = step_lane(rec, lane)
    return min(int(k) + 1, len(rec.runs[key].events)) if key else 1


def generate_event(request: gr.Request, *inputs):
    """on_generate as an event: Gradio injects the request only into a parameter it can see by position."""
    yield from on_generate(*inputs, request=request)


def race_all_event(request: gr.Request, *inputs):
    yield from on_race_all(*inputs, request=request)


def on_stop(request: gr.Request | None = None) -> None:
    if (flag := _STOPS.get(_session(request))) is not None:
        flag.set()


def on_load_model(model: str, current: str | None):
    """Load (or fetch from cache) the model; refresh the header and which modes can run on it."""
    try:
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
        if not methods:
            raise UserError("Pick at least one method to compare with autoregressive decoding.")
        chosen = [(c, p) for c, p in EXAMPLES if c in (prompt_labels or [])]
        if not chosen:
            raise UserError("Pick at least one example prompt.")
        prompts = [{"id": c, "prompt": p} for c, p in chosen]

        def report(i: int, n: int, pid: str = "", method: str = "", *_) -> None:
            progress(i / max(n, 1), desc=f"{pid} · {LABELS.get(method, method)}")

        with GATE.turn():
            target = load_model(model)
            result = model_thread.call(bench_on_device, target, list(methods), prompts, int(max_new_tokens),
                                       sampling=SamplingConfig(), progress=None if ZERO_GPU else report)
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


# -------------------------------------------------------------------------------------------------------- layout

def _controls(ui: SimpleNamespace, default_model: str) -> None:
    """Prompt and examples on the left; model, mode, settings and the race buttons on the right."""
    with gr.Row(equal_height=False):
        with gr.Column(scale=5):
            ui.prompt = gr.Textbox(value=EXAMPLES[0][1], label="Prompt", lines=7, max_lines=14,
                                   placeholder="Ask something, or pick an example below", elem_id="sd-prompt")
            gr.Examples([[p] for _, p in EXAMPLES], inputs=[ui.prompt], example_labels=[c for c, _ in EXAMPLES],
                        label="Examples")
            gr.Markdown(HOW_TO_READ, elem_classes=["sd-howto"])
        with gr.Column(scale=4):
            with gr.Row():
                ui.model = gr.Dropdown(list(MODEL_CHOICES), value=default_model, allow_custom_value=True,
                                       label="Model", info="embedded = SmolLM2-135M-Instruct, offline; or a hub id"
                                       + ("" if public_mode() else " or local folder"), scale=4)
                ui.load_btn = gr.Button("Load", scale=1, min_width=70, size="md", elem_id="sd-load")
            ui.mode = gr.Radio([(LABELS.get(m, m), m) for m in MODES], value=None, label="Speculative mode",
                               elem_id="sd-mode")
            ui.modes_box = gr.HTML(modes_html({}), padding=False)
            with gr.Accordion("Settings", open=False, elem_id="sd-settings"):
                with gr.Row():
                    ui.max_new = gr.Slider(1, MAX_NEW_TOKENS, value=128, step=1, label="Max new tokens")
                    ui.seed = gr.Number(0, precision=0, label="Seed", minimum=0)
                with gr.Row():
                    ui.temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature", info="0 = greedy")
                    ui.top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p")
                    ui.top_k = gr.Slider(0, 200, value=0, step=1, label="Top-k", info="0 = off")
                ui.sliders = {}
                ui.groups = {}
                for m in MODES:
                    ks = list(knobs(m))
                    if not ks:
                        continue
                    with gr.Group(visible=False) as ui.groups[m]:
                        gr.Markdown(f"**{LABELS.get(m, m)} settings**", padding=True)
                        with gr.Row():
                            for k in ks:
                                ui.sliders[k] = gr.Slider(k.minimum, k.maximum, value=k.value, step=1,
                                                          label=k.label, info=k.info)
                ui.knob_inputs = [ui.sliders[k] for k in all_knobs()]  # the order _options() reads them in
            with gr.Row():
                ui.gen_btn = gr.Button("Generate", variant="primary", elem_id="sd-generate", scale=3)
                ui.all_btn = gr.Button("Race all", elem_id="sd-race-all", scale=2)
                ui.stop_btn = gr.Button("Stop", variant="stop", elem_id="sd-stop", scale=1)


def _race_view(ui: SimpleNamespace) -> None:
    """Messages, the summary, the colour switch, and the two panes of a race (or the lanes of a race all)."""
    ui.message = gr.HTML("", padding=False, elem_id="sd-message")
    ui.summary = gr.HTML(summary_html(None), padding=False, elem_id="sd-summary")
    ui.colour = gr.Radio(["by step", "by source"], value="by step", label="Colour accepted drafts",
                         info="by source: the prompt, the datastore, head 1…k, adaptive tokens, or the target's own",
                         elem_id="sd-colour")
    with gr.Row(equal_height=True) as ui.pair:
        ui.ar_pane = gr.HTML(pane_html(None, "ar"), padding=False, elem_id="sd-ar")
        ui.spec_pane = gr.HTML(pane_html(None, "spec"), padding=False, elem_id="sd-spec")
    ui.lanes = gr.HTML("", padding=False, elem_id="sd-lanes", visible=False)


def _tabs(ui: SimpleNamespace) -> None:
    """Live plots, step by step, export, benchmark and API."""
    with gr.Tabs():
        with gr.Tab("Live plots"):
            with gr.Row():
                ui.curve_plot = gr.LinePlot(plots(None)[0], x="compute (s)", y="tokens", color="run",
                                            title="Tokens vs own compute time", label="Tokens vs compute time",
                                            x_axis_format="~r", y_axis_format="~r", color_map=SERIES_COLOURS)
                ui.hist_plot = gr.BarPlot(plots(None)[1], x="tokens per step", y="steps",
                                          title="Tokens per step (accepted + 1)", y_axis_format="~r",
                                          label="Accepted lengths", y_lim=[0, None])
                ui.time_plot = gr.BarPlot(plots(None)[2], x="step", y="ms", color="phase",
                                          title="Draft vs verify ms per step",
                                          label="Draft vs verify", y_lim=[0, None], y_axis_format="d",
                                          color_map={"draft": "#f59e0b", "verify": "#6366f1"})
                ui.depth_plot = gr.LinePlot(plots(None)[3], x="accepted drafts ≥", y="share of steps", color="run",
                                            title="Acceptance by depth", label="Acceptance by depth",
                                            y_lim=[0, 1], y_axis_format="~r", color_map=SERIES_COLOURS,
                                            sort=[str(d + 1) for d in range(DEPTHS)])
        with gr.Tab("Step by step", elem_id="sd-steps"):
            gr.Markdown("Walk through the speculative run one verification step at a time: the tree the drafter "
                        "proposed, the path the target accepted, and the token that stopped it.")
            with gr.Row():
                ui.step_lane = gr.Dropdown([], label="Lane", visible=False, scale=2, elem_id="sd-step-lane")
                ui.prev_btn = gr.Button("◀ Previous step", size="sm", scale=1)
                ui.step = gr.Slider(1, 2, value=1, step=1, label="Step", interactive=False, scale=6)
                ui.next_btn = gr.Button("Next step ▶", size="sm", variant="primary", scale=1, elem_id="sd-next")
            ui.explanation = gr.Markdown(elem_id="sd-explain")
            with gr.Row():
                ui.tree_view = gr.HTML(padding=False, scale=3)
                ui.step_text = gr.HTML(padding=False, scale=2)
        if not public_mode():
            with gr.Tab("Your datastore", elem_id="sd-user-store"):
                gr.Markdown(f"REST retrieves its drafts from a datastore. Build one from your own text for the loaded "
                            f"model: text files (.txt, .md, .py, .jsonl with `text` or `conversations`), .zip / "
                            f".tar.gz archives of them, or a folder on this machine. Up to "
                            f"{MAX_TEXT_BYTES >> 20} MB of text and {MAX_FILES:,} files; binary and empty files are "
                            f"skipped. REST races on this model then use it.")
                with gr.Row():
                    ui.store_files = gr.File(file_count="multiple", type="filepath", label="Files or archives",
                                             elem_id="sd-store-files")
                    ui.store_folder = gr.Textbox(label="or a folder on this machine", placeholder="~/my-notes",
                                                 elem_id="sd-store-folder")
                with gr.Row():
                    ui.store_btn = gr.Button("Build datastore", variant="primary", elem_id="sd-store-build")
                    ui.store_reset = gr.Button("Use the default datastore")
                ui.store_status = gr.HTML(padding=False, elem_id="sd-store-status")
        with gr.Tab("Export"):
            gr.Markdown("The last race as JSON: Spec-Bench fields (`new_tokens`, `wall_time`, `accept_lengths`) "
                        "per run, plus method, model, settings and the summary. `wall_time` is each run's own "
                        "compute time.")
            ui.export_btn = gr.DownloadButton("Download run JSON", interactive=False)
        with gr.Tab("Benchmark"):
            gr.Markdown("Runs `specdemo.bench` (AR first, then each method, after a warm-up) on the chosen example "
                        "prompts. Greedy; speedup is measured here, against AR in the same run.")
            with gr.Row():
                ui.bench_methods = gr.CheckboxGroup([], label="Methods")
                ui.bench_prompts = gr.CheckboxGroup([c for c, _ in EXAMPLES], value=[c for c, _ in EXAMPLES[:3]],
                                                    label="Prompts")
                ui.bench_tokens = gr.Slider(8, 256, value=48, step=8, label="Max new tokens")
            ui.bench_btn = gr.Button("Run benchmark", variant="primary")
            ui.bench_note = gr.HTML(padding=False)
            with gr.Row():
                ui.bench_table = gr.Dataframe(interactive=False, label="Results", scale=3)
                ui.bench_plot = gr.HTML("", padding=False, scale=2)
            ui.bench_json = gr.DownloadButton("Download bench JSON", interactive=False)
        with gr.Tab("API"):
            gr.Markdown(API_DOC)


def _wire(demo: gr.Blocks, ui: SimpleNamespace) -> None:
    """Every event of the page, and the /race endpoint."""
    load_outputs = [ui.header, ui.mode, ui.modes_box, ui.message, ui.avail_state, ui.bench_methods, ui.gen_btn]
    model_work = dict(concurrency_id=MODEL_WORK, concurrency_limit=MODEL_WORK_LIMIT)
    demo.load(on_load_model, [ui.model, ui.mode], load_outputs, api_visibility="private", **model_work)
    ui.load_btn.click(on_load_model, [ui.model, ui.mode], load_outputs, api_visibility="private", **model_work)
    ui.model.input(on_load_model, [ui.model, ui.mode], load_outputs, api_visibility="private", **model_work)
    ui.mode.change(on_mode, [ui.mode, ui.avail_state], [ui.gen_btn, ui.message], api_visibility="private",
                   queue=False)
    for m, g in ui.groups.items():
        ui.mode.change(lambda x, m=m: gr.Group(visible=x == m), [ui.mode], [g], api_visibility="private", queue=False)

    race_outputs = [getattr(ui, name) for name in RACE_OUTPUTS]
    gen_inputs = [ui.model, ui.mode, ui.prompt, ui.max_new, ui.temperature, ui.top_p, ui.top_k, ui.seed,
                  *ui.knob_inputs]
    all_inputs = [ui.model, ui.prompt, ui.max_new, ui.temperature, ui.top_p, ui.top_k, ui.seed, *ui.knob_inputs]
    # no progress overlay: the panes show the race's state, and Gradio's animated timers on every output would keep
    # the browser drawing (on the cores the race runs on) for the whole race
    race_work = dict(model_work, show_progress="hidden")
    run_event = ui.gen_btn.click(generate_event, gen_inputs, race_outputs, api_visibility="undocumented",
                                 api_name="generate", **race_work)
    submit_event = ui.prompt.submit(generate_event, gen_inputs, race_outputs, api_visibility="private", **race_work)
    all_event = ui.all_btn.click(race_all_event, all_inputs, race_outputs, api_visibility="private", **race_work)
    plot_outputs = [ui.curve_plot, ui.hist_plot, ui.time_plot, ui.depth_plot]
    for event in (run_event, submit_event, all_event):  # redraw the plots once more: Gradio shows a re-embedded
        event.then(refresh_plots, [ui.record_state], plot_outputs,  # plot's last update late
                   api_visibility="private", queue=False)
    ui.stop_btn.click(on_stop, None, None, api_visibility="private", queue=False,
                      cancels=[run_event, all_event] if ZERO_GPU else None)
    # colouring is the browser's alone: every span carries its source, the switch flips one class
    ui.colour.change(None, [ui.colour], None, js=COLOUR_JS, api_visibility="private", queue=False)

    step_views = [ui.tree_view, ui.explanation, ui.step_text]
    ui.step.change(show_step, [ui.record_state, ui.step, ui.step_lane], step_views, api_visibility="private",
                   queue=False)
    ui.step_lane.change(_on_step_lane, [ui.record_state, ui.step_lane], [ui.step, *step_views],
                        api_visibility="private", queue=False)
    ui.prev_btn.click(lambda k: max(1, int(k) - 1), [ui.step], [ui.step], api_visibility="private", queue=False)
    ui.next_btn.click(_next_step, [ui.step, ui.record_state, ui.step_lane], [ui.step], api_visibility="private",
                      queue=False)

    if not public_mode():
        ui.store_btn.click(on_build_store, [ui.model, ui.store_files, ui.store_folder], [ui.store_status],
                           api_visibility="private", **model_work)
        ui.store_reset.click(on_reset_store, None, [ui.store_status], api_visibility="private", queue=False)
    ui.bench_btn.click(on_bench, [ui.model, ui.bench_methods, ui.bench_prompts, ui.bench_tokens],
                       [ui.bench_table, ui.bench_plot, ui.bench_note, ui.bench_json], api_visibility="private",
                       **model_work)
    gr.api(race_api, api_name="race", **model_work)
    gr.api(race_all_api, api_name="race_all", **model_work)
    gr.api(mark_drawn, api_name="drawn", queue=False, api_visibility="undocumented")


def build_demo(default_model: str = EMBEDDED) -> gr.Blocks:
    """The whole page.  Pass `launch_kwargs()` to `launch()` (Gradio 6 takes theme/css there)."""
    # The default model loads before the server starts, on a quiet machine: loading measures the verification cost
    # curve that sizes the drafters' trees (budget.py), and measured while a browser renders the freshly opened page
    # on the same cores it came out up to 1.7x too steep, so S4C sent trees half the size the bench sends.  On Spaces
    # it has to happen here anyway (ZeroGPU moves weights to the GPU only outside GPU functions).
    try:
        print(f"specdemo: loading {default_model} and measuring its verification costs…", flush=True)
        MODELS.get(default_model)
    except Exception as exc:  # noqa: BLE001 — the page still opens and shows the reason
        print(f"specdemo: could not preload {default_model}: {exc}", flush=True)

    with gr.Blocks(title="specdemo · speculative decoding, made visible") as demo:
        ui = SimpleNamespace(avail_state=gr.State({}), record_state=gr.State(None),
                             header=gr.HTML(header_html(None, "loading model…"), padding=False))
        _controls(ui, default_model)
        _race_view(ui)
        _tabs(ui)
        _wire(demo, ui)
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=1)
    return quiet_queue.quiet(demo)


HOW_TO_READ = """
**How to read the race.** Both decoders get the same prompt and settings. The one that has used less compute so far
always runs next, so each pane grows at its true speed. On the right, **shaded** text is draft tokens the model
accepted: several tokens for the price of one forward pass (the shade alternates per step; hover for details). Plain
text is the model's own token. At the end: speedup, τ (tokens per forward pass) and whether both outputs are
identical, as they must be. **Step by step** below replays every verification.
"""

API_DOC_HEAD = """
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

**`/race_all`** races AR against every method available for the model, each in its own lane, and streams the same
way: `client.submit(prompt, "embedded", 64, 0.0, 1.0, 0, 0, {"rest": {"budget": 16}}, None, api_name="/race_all")`
(options per method; the last argument picks methods, `None` = all). Each dict holds `lanes` (per run: text,
tokens/s, τ, `acceptance_by_depth`; per method also `speedup` and `identical`) and `skipped` (methods that cannot
run on the model, with the reason).

Errors come back as `{"status": "error", "message": ...}`, not as exceptions. Methods (those available for the
model) and the options the page offers (a drafter takes more, see README):
"""


def methods_doc() -> str:
    """Per registered method: name, what it does, and every option with its allowed values (from the drafters' own
    declarations, the same ones requests are checked against)."""
    lines = []
    for m in REGISTRY:
        lines.append(f"- `{m.name}` ({m.label}): {m.summary}")
        lines += [f"    - `{o.name}`: {o.allowed()} · {o.help}" for o in options(m.name)]
    return "\n".join(lines)


API_DOC = API_DOC_HEAD + "\n" + methods_doc() + "\n"


def launch_kwargs() -> dict:
    """theme / css / js / the page's early script for `demo.launch()` (Gradio 6 takes them there, not in Blocks)."""
    return {
        "theme": gr.themes.Soft(primary_hue="indigo", secondary_hue="emerald",
                                font=["ui-sans-serif", "system-ui", "sans-serif"],  # no web-font fetch: works offline
                                font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"]),
        "css_paths": [ASSETS / "style.css"],
        "js": (ASSETS / "drawn.js").read_text(),
        "max_file_size": MAX_TEXT_BYTES,  # the only uploads are "Your datastore"'s, capped there too
        "app_kwargs": {"middleware": calm_trackers.middleware()},
    }


def plot_updates(rec: RaceRecord) -> tuple:
    """The four plots as updates.  Each carries a caption that changes with the data: a changed caption makes Gradio
    re-embed the chart (a bare data swap keeps stale scales); the categorical x axes get their numeric order."""
    lane = step_lane(rec) or "spec"
    curve, hist, times, depth = plots(rec, lane)
    one = rec.runs.get(lane)
    name = series(rec, lane)
    verify = sorted(e.verify_s for e in one.events[1:]) if one else []  # step 1 also reads the prompt
    draft = sorted(e.draft_s for e in one.events[1:]) if one else []
    mid = lambda xs: xs[len(xs) // 2] if xs else 0.0  # noqa: E731
    steps = len(one.events) if one else 0
    return (
        gr.LinePlot(value=curve, caption=" · ".join(f"{series(rec, k)}: {r.n_tokens} tokens in {r.compute_s:.2f} s"
                                                    for k, r in rec.runs.items())),
        gr.BarPlot(value=hist, sort=list(hist["tokens per step"]),
                   caption=f"{name}: {steps} steps · τ = {one.tau if one else 0:.2f} tokens per target forward"),
        gr.BarPlot(value=times, sort=list(dict.fromkeys(times["step"])), x_axis_labels_visible=steps <= 40,
                   x_title=f"step (1 … {steps})" if steps > 40 else "step",
                   caption=f"{name}: median draft {1e3 * mid(draft):.1f} ms · median verify "
                           f"{1e3 * mid(verify):.0f} ms (steps 2+)"),
        gr.LinePlot(value=depth, caption=" · ".join(f"{series(rec, k)}: τ {rec.runs[k].tau:.2f}"
                                                    for k in rec.spec_lanes)),
    )


def refresh_plots(rec: RaceRecord | None) -> tuple:
    return plot_updates(rec) if rec is not None else (gr.skip(),) * 4
