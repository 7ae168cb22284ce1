"""The Gradio page: its layout and the wiring of its events to the handlers (handlers.py), plus `/race` and
`/race_all` (api.py).  Everything a race shows comes from one record: the panes, the summary, the plots (one chart per
entry of the plot registry) and the step-by-step view.
"""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import torch

from specdemo import ASSETS
from specdemo.app.api import api_markdown, race_all_api, race_api
from specdemo.app.clocks import calm_trackers, quiet_queue
from specdemo.app.clocks.drawn import mark_drawn
from specdemo.app.models import MODELS
from specdemo.app.page import handlers as h
from specdemo.app.page.examples import EXAMPLES, HOW_TO_READ, MODEL_CHOICES
from specdemo.app.plots import PLOTS
from specdemo.app.public import public_mode
from specdemo.app.racing import MAX_WAITING, ZERO_GPU
from specdemo.app.render import header_html, modes_html, pane_html, summary_html
from specdemo.app.request import MAX_NEW_TOKENS, RACE_ALL, modes
from specdemo.app.user_store import MAX_FILES, MAX_TEXT_BYTES
from specdemo.drafters import LABELS, all_knobs, knobs
from specdemo.precision import PRECISIONS, default_precision, model_spec
from specdemo.target import EMBEDDED

# Every event that touches a model shares one concurrency id.  Gradio lets enough of them in for the gate's line
# (racing.GATE serialises the model work itself and refuses the overflow with a message); its own queue is only a
# backstop, since a request it refuses reaches a scripted client as an error without a message.
MODEL_WORK = "model"
MODEL_WORK_LIMIT = MAX_WAITING + 2
QUEUE_SIZE = 4 * MAX_WAITING
COLOUR_JS = '(v) => { document.body.classList.toggle("sd-by-source", v === "by source"); return v; }'


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
            ui.precision = gr.Radio(list(PRECISIONS), value=default_precision(), label="Precision (CPU)",
                                    elem_id="sd-precision",
                                    info="the linears' weights: fp32 · bf16 · int4 (the embedded GGUF's own 4-bit "
                                         "blocks); each mode stays identical to AR at the same precision",
                                    visible=not torch.cuda.is_available())
            ui.mode = gr.Radio([(LABELS.get(m, m), m) for m in modes()], value=None, label="Speculative mode",
                               elem_id="sd-mode")
            ui.modes_box = gr.HTML(modes_html({}, LABELS), padding=False)
            _settings(ui)
            with gr.Row():
                ui.gen_btn = gr.Button("Generate", variant="primary", elem_id="sd-generate", scale=3)
                ui.all_btn = gr.Button("Race all", elem_id="sd-race-all", scale=2)
                ui.stop_btn = gr.Button("Stop", variant="stop", elem_id="sd-stop", scale=1)


def _settings(ui: SimpleNamespace) -> None:
    """Decoding settings, and each method's knobs (shown for the selected mode)."""
    with gr.Accordion("Settings", open=False, elem_id="sd-settings"):
        with gr.Row():
            ui.max_new = gr.Slider(1, MAX_NEW_TOKENS, value=128, step=1, label="Max new tokens")
            ui.seed = gr.Number(0, precision=0, label="Seed", minimum=0)
        with gr.Row():
            ui.temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature", info="0 = greedy")
            ui.top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p")
            ui.top_k = gr.Slider(0, 200, value=0, step=1, label="Top-k", info="0 = off")
        ui.sliders, ui.groups = {}, {}
        for m in modes():
            if not (ks := list(knobs(m))):
                continue
            with gr.Group(visible=False) as ui.groups[m]:
                gr.Markdown(f"**{LABELS.get(m, m)} settings**", padding=True)
                with gr.Row():
                    for k in ks:
                        ui.sliders[k] = gr.Slider(k.minimum, k.maximum, value=k.value, step=1, label=k.label,
                                                  info=k.info)
        ui.knob_inputs = [ui.sliders[k] for k in all_knobs()]  # the order handlers.options_of reads them in


def _race_view(ui: SimpleNamespace) -> None:
    """Messages, the summary, the colour switch, and the two panes of a race (or the lanes of a race all)."""
    ui.message = gr.HTML("", padding=False, elem_id="sd-message")
    ui.summary = gr.HTML(summary_html(None), padding=False, elem_id="sd-summary")
    ui.colour = gr.Radio(["by step", "by source"], value="by step", label="Colour accepted drafts",
                         info="by source: where each accepted draft came from (the prompt, a datastore, a draft head "
                              "…), or the target's own token", elem_id="sd-colour")
    with gr.Row(equal_height=True) as ui.pair:
        ui.ar_pane = gr.HTML(pane_html(None, "ar"), padding=False, elem_id="sd-ar")
        ui.spec_pane = gr.HTML(pane_html(None, "spec"), padding=False, elem_id="sd-spec")
    ui.lanes = gr.HTML("", padding=False, elem_id="sd-lanes", visible=False)


def _plots(ui: SimpleNamespace) -> None:
    """One chart per entry of the plot registry, two to a row: a chart's legend lists every lane in one line, and a
    race of every method needs half the page's width for it.  The charts start with no value: one that starts from
    an empty frame stays blank through its first update (Gradio 6.31 embeds it only on the second)."""
    chart = {"line": gr.LinePlot, "bar": gr.BarPlot}
    for row in range(0, len(PLOTS), 2):
        with gr.Row():
            for plot in PLOTS[row: row + 2]:
                setattr(ui, plot.name, chart[plot.kind](None, x=plot.x, y=plot.y, color=plot.color,
                                                        title=plot.title, label=plot.title, elem_classes=["sd-plot"],
                                                        **plot.options))


def _steps(ui: SimpleNamespace) -> None:
    gr.Markdown("Walk through a speculative run one verification step at a time: the tree the drafter proposed, the "
                "path the target accepted, and the token that stopped it.")
    with gr.Row():
        ui.step_lane = gr.Dropdown([], label="Lane", visible=False, scale=2, elem_id="sd-step-lane")
        ui.prev_btn = gr.Button("◀ Previous step", size="sm", scale=1)
        ui.step = gr.Slider(1, 2, value=1, step=1, label="Step", interactive=False, scale=6)
        ui.next_btn = gr.Button("Next step ▶", size="sm", variant="primary", scale=1, elem_id="sd-next")
    ui.explanation = gr.Markdown(elem_id="sd-explain")
    with gr.Row():
        ui.tree_view = gr.HTML(padding=False, scale=3)
        ui.step_text = gr.HTML(padding=False, scale=2)


def _user_store(ui: SimpleNamespace) -> None:
    gr.Markdown(f"REST retrieves its drafts from a datastore. Build one from your own text for the loaded model: "
                f"text files (.txt, .md, .py, .jsonl with `text` or `conversations`), .zip / .tar.gz archives of "
                f"them, or a folder on this machine. Up to {MAX_TEXT_BYTES >> 20} MB of text and {MAX_FILES:,} files; "
                f"binary and empty files are skipped. REST races on this model then use it.")
    with gr.Row():
        ui.store_files = gr.File(file_count="multiple", type="filepath", label="Files or archives",
                                 elem_id="sd-store-files")
        ui.store_folder = gr.Textbox(label="or a folder on this machine", placeholder="~/my-notes",
                                     elem_id="sd-store-folder")
    with gr.Row():
        ui.store_btn = gr.Button("Build datastore", variant="primary", elem_id="sd-store-build")
        ui.store_reset = gr.Button("Use the default datastore")
    ui.store_status = gr.HTML(padding=False, elem_id="sd-store-status")


def _bench(ui: SimpleNamespace) -> None:
    gr.Markdown("Runs `specdemo.bench` (AR first, then each method, after a warm-up) on the chosen example prompts. "
                "Greedy; speedup is measured here, against AR in the same run.")
    with gr.Row():
        ui.bench_methods = gr.CheckboxGroup([], label="Methods")
        ui.bench_prompts = gr.CheckboxGroup([c for c, _ in EXAMPLES], value=[c for c, _ in EXAMPLES[:3]],
                                            label="Prompts")
        ui.bench_tokens = gr.Slider(8, 256, value=48, step=8, label="Max new tokens")
    ui.bench_btn = gr.Button("Run benchmark", variant="primary")
    ui.bench_note = gr.HTML(padding=False)
    with gr.Row():
        ui.bench_table = gr.Dataframe(h.empty_bench_table(), interactive=False, label="Results", scale=3)
        ui.bench_plot = gr.HTML("", padding=False, scale=2)
    ui.bench_json = gr.DownloadButton("Download bench JSON", interactive=False)


def _tabs(ui: SimpleNamespace) -> None:
    """Live plots, step by step, your datastore (local mode), export, benchmark and API."""
    with gr.Tabs():
        with gr.Tab("Live plots"):
            _plots(ui)
        with gr.Tab("Step by step", elem_id="sd-steps"):
            _steps(ui)
        if not public_mode():
            with gr.Tab("Your datastore", elem_id="sd-user-store"):
                _user_store(ui)
        with gr.Tab("Export"):
            gr.Markdown("The last race as JSON: Spec-Bench fields (`new_tokens`, `wall_time`, `accept_lengths`) "
                        "per run, plus method, model, settings and the summary. `wall_time` is each run's own "
                        "compute time.")
            ui.export_btn = gr.DownloadButton("Download run JSON", interactive=False)
        with gr.Tab("Benchmark"):
            _bench(ui)
        with gr.Tab("API"):
            gr.Markdown(api_markdown())


def _wire_race(ui: SimpleNamespace, model_work: dict) -> None:
    """Generate, Race all, Enter in the prompt, Stop, the colour switch and step by step."""
    race_outputs = [getattr(ui, name) for name in h.RACE_OUTPUTS]
    settings = [ui.model, ui.precision, ui.prompt, ui.max_new, ui.temperature, ui.top_p, ui.top_k, ui.seed, ui.user_store,
                *ui.knob_inputs]
    # no progress overlay: the panes show the race's state, and Gradio's animated timers on every output would keep
    # the browser drawing (on the cores the race runs on) for the whole race
    race_work = dict(model_work, show_progress="hidden")
    events = [ui.gen_btn.click(h.on_race, [ui.mode, *settings], race_outputs, api_visibility="undocumented",
                               api_name="generate", **race_work),
              ui.prompt.submit(h.on_race, [ui.mode, *settings], race_outputs, api_visibility="private", **race_work),
              ui.all_btn.click(h.on_race, [ui.race_all, *settings], race_outputs, api_visibility="private",
                               **race_work)]
    for event in events:
        event.then(h.refresh_plots, [ui.record_state], [getattr(ui, p.name) for p in PLOTS],
                   api_visibility="private", queue=False)
    ui.stop_btn.click(h.on_stop, None, None, api_visibility="private", queue=False,
                      cancels=events if ZERO_GPU else None)
    # colouring is the browser's alone: every span carries its source, the switch flips one class
    ui.colour.change(None, [ui.colour], None, js=COLOUR_JS, api_visibility="private", queue=False)
    step_views = [ui.tree_view, ui.explanation, ui.step_text]
    quick = dict(api_visibility="private", queue=False)
    ui.step.change(h.show_step, [ui.record_state, ui.step, ui.step_lane], step_views, **quick)
    ui.step_lane.change(h.on_step_lane, [ui.record_state, ui.step_lane], [ui.step, *step_views], **quick)
    ui.prev_btn.click(lambda k: max(1, int(k) - 1), [ui.step], [ui.step], **quick)
    ui.next_btn.click(h.next_step, [ui.step, ui.record_state, ui.step_lane], [ui.step], **quick)


def _wire(demo: gr.Blocks, ui: SimpleNamespace) -> None:
    """Every event of the page, and the two API endpoints."""
    load_outputs = [ui.header, ui.mode, ui.modes_box, ui.message, ui.avail_state, ui.bench_methods, ui.gen_btn]
    model_work = dict(concurrency_id=MODEL_WORK, concurrency_limit=MODEL_WORK_LIMIT)
    private = dict(api_visibility="private")
    demo.load(h.on_load_model, [ui.model, ui.precision, ui.mode], load_outputs, **private, **model_work)
    ui.load_btn.click(h.on_load_model, [ui.model, ui.precision, ui.mode], load_outputs, **private, **model_work)
    ui.model.input(h.on_load_model, [ui.model, ui.precision, ui.mode], load_outputs, **private, **model_work)
    ui.precision.input(h.on_load_model, [ui.model, ui.precision, ui.mode], load_outputs, **private, **model_work)
    ui.mode.change(h.on_mode, [ui.mode, ui.avail_state], [ui.gen_btn, ui.message], **private, queue=False)
    for m, g in ui.groups.items():
        ui.mode.change(lambda x, m=m: gr.Group(visible=x == m), [ui.mode], [g], **private, queue=False)
    _wire_race(ui, model_work)
    if not public_mode():
        ui.store_btn.click(h.on_build_store, [ui.model, ui.store_files, ui.store_folder],
                           [ui.store_status, ui.user_store], **private, **model_work)
        ui.store_reset.click(h.on_reset_store, None, [ui.store_status, ui.user_store], **private, queue=False)
    ui.bench_btn.click(h.on_bench, [ui.model, ui.precision, ui.bench_methods, ui.bench_prompts, ui.bench_tokens],
                       [ui.bench_table, ui.bench_plot, ui.bench_note, ui.bench_json], **private, **model_work)
    gr.api(race_api, api_name="race", **model_work)
    gr.api(race_all_api, api_name="race_all", **model_work)
    gr.api(mark_drawn, api_name="drawn", queue=False, api_visibility="undocumented")


def build_demo(default_model: str = EMBEDDED) -> gr.Blocks:
    """The whole page.  Pass `launch_kwargs()` to `launch()` (Gradio 6 takes theme/css there)."""
    # The default model loads before the server starts, on a quiet machine: loading measures the verification cost
    # curve that sizes the drafters' trees (budget.py), and measured while a browser renders the freshly opened page
    # on the same cores it came out up to 1.7x too steep.  On Spaces it has to happen here anyway (ZeroGPU moves
    # weights to the GPU only outside GPU functions).
    try:
        print(f"specdemo: loading {default_model} and measuring its verification costs…", flush=True)
        MODELS.get(model_spec(default_model, default_precision()))
    except Exception as exc:  # noqa: BLE001 — the page still opens and shows the reason
        print(f"specdemo: could not preload {default_model}: {exc}", flush=True)

    with gr.Blocks(title="specdemo · speculative decoding, made visible") as demo:
        ui = SimpleNamespace(avail_state=gr.State({}), record_state=gr.State(None), user_store=gr.State(None),
                             race_all=gr.State(RACE_ALL),
                             header=gr.HTML(header_html(None, "loading model…"), padding=False))
        _controls(ui, default_model)
        _race_view(ui)
        _tabs(ui)
        _wire(demo, ui)
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=1)
    return quiet_queue.quiet(demo)


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
