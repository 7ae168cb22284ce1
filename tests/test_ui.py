"""The demo: rendering (no model), the race loop in-process, and the launched app through gradio_client."""
from __future__ import annotations

import socket
import threading

import pytest

from specdemo import ASSETS
from specdemo.app.page.handlers import RACE_OUTPUTS, on_race, options_of
from specdemo.app.plots import PLOTS
from specdemo.app.racing import lane_style, run_race
from specdemo.app.record import LaneStyle, RaceRecord, TextBuilder, record_json
from specdemo.app.render import (
    explain_step,
    pane_html,
    show_step,
    spans_html,
    summary_html,
    tree_html,
)
from specdemo.app.request import MAX_SEED, RaceRequest, UserError, race_request
from specdemo.drafters import REGISTRY, all_knobs, check_options, options
from specdemo.engine import StepEvent
from specdemo.tree import DraftTree

REGISTRY_NAMES = [m.name for m in REGISTRY]
SHORT = "Say hi."  # in-process loop tests: a short prompt keeps the prefill cheap
PROMPT = ("Summarise this paragraph in one sentence:\nThe Eiffel Tower is a wrought-iron lattice tower on the Champ de "
          "Mars in Paris, France. It is named after the engineer Gustave Eiffel, whose company designed and built it.")



@pytest.fixture(autouse=True, scope="module")
def shared_model(embedded):
    """The app uses the session's embedded model instead of loading a second copy."""
    from specdemo.app.models import MODELS

    MODELS.put("embedded", embedded)


# ------------------------------------------------------------------------------------------ rendering, no model

VOCAB = {1: "Hi", 2: " <b>", 3: "&", 4: "\n", 5: "  x", 6: " y", 7: " z", 8: " q", 9: "!"}


def fake_record() -> RaceRecord:
    """Two spec steps: step 0 drafts a tree (accepts 2 of it, then the target disagrees), step 1 drafts nothing."""
    decode = lambda ids: "".join(VOCAB[i] for i in ids)  # noqa: E731
    rec = RaceRecord(RaceRequest("p", ("pld",), max_new_tokens=8))
    rec.set_lanes({"pld": lane_style("pld")})
    rec.token_text = dict(VOCAB)
    rec.prompt_tail = [9]
    tree = DraftTree([2, 3, 6, 8], [-1, 0, 1, -1], ["prompt"] * 4)  # chain 2→3→6 and a sibling 8
    spec = [StepEvent(0, [2, 3, 4], [True, True, False], ["prompt", "prompt", None], tree, [0, 1], 0.001, 0.05, 5, 3),
            StepEvent(1, [5], [False], [None], DraftTree.empty(), [], 0.0, 0.04, 8, 4, "length")]
    ar = [StepEvent(i, [t], [False], [None], DraftTree.empty(), [], 0.0, 0.04, 5 + i, i + 1,
                    "length" if i == 3 else None) for i, t in enumerate([2, 3, 4, 5])]
    for key, events in (("ar", ar), ("pld", spec)):
        tb = TextBuilder(decode)
        rec.pieces[key] = tb.pieces
        for ev in events:
            tb.add(ev.tokens, ev.step, ev.from_draft, ev.sources)
            rec.add(key, ev, tb.text)
    rec.status = "done"
    return rec


def test_spans_are_escaped_shaded_per_step_and_keep_whitespace():
    rec = fake_record()
    html = spans_html(rec, "pld")
    assert "<b>" not in html and "&lt;b&gt;" in html and "&amp;" in html
    assert 'class="sd-acc sd-s0"' in html and 'class="sd-own"' in html
    assert "accepted 2 of 4 drafted · source: prompt" in html
    assert "\n" in html and "  x" in html  # newlines and indentation are kept (the pane is white-space: pre-wrap)
    assert "nothing was drafted" in html  # step 2's token came from the target alone
    ar = spans_html(rec, "ar")
    assert "sd-acc" not in ar and "&lt;b&gt;" in ar


def test_panes_and_summary():
    rec = fake_record()
    assert "Press Generate" in pane_html(None, "ar")
    spec = pane_html(rec, "pld")
    assert "<b>4</b> tokens" in spec and "<b>2</b> forwards" in spec and "Prompt lookup" in spec
    s = summary_html(rec)
    # speedup (4 / 0.091 s) / (4 / 0.16 s), τ 4 tokens / 2 forwards
    assert "identical" in s and "1.76×" in s and ">2.00<" in s and 'data-status="done"' in s
    assert "Forwards saved" in s and "4 → 2" in s


def test_a_finished_race_says_what_a_verification_costs_here():
    rec = fake_record()
    rec.started, rec.ended = 100.0, 101.0
    rec.device, rec.precision, rec.verify_costs = "cpu", "int4", {4: 1.87, 16: 5.2}
    line = "(cpu, int4): 4 drafts 1.87 plain steps · 16 drafts 5.20 plain steps — why the speedup stays below τ"
    assert line in summary_html(rec)
    rec.status = "running"
    assert "plain steps" not in summary_html(rec)  # the costs explain a result: they come with the end
    rec.status, rec.verify_costs = "done", {}
    assert "plain steps" not in summary_html(rec)  # no curve measured for this model: nothing to say


def test_a_difference_shows_where_and_how_near_a_tie_it_was():
    rec = fake_record()
    ar = rec.runs["ar"]
    for i, ev in enumerate(ar.events):
        ev.margins = [0.5 + i]  # AR chose token i with a top-2 logit gap of 0.5 + i
    rec.runs["pld"].events[1].tokens = [6]  # the drafted run's 4th token now differs from AR's
    rec.add("pld", rec.runs["pld"].events.pop(), "")
    s = summary_html(rec)
    assert "✗ differ at token 3" in s and "top-2 logit gap 3.5" in s
    assert rec.summaries["pld"].as_json()["tie_gap"] == 3.5
    assert "token lists compared" in s
    rec.caveat = "bfloat16 (too large for fp32 on this GPU): output may differ from plain decoding at near-ties"
    assert "may differ from plain decoding at near-ties" in summary_html(rec)  # a half-precision model says so


def test_tree_view_marks_accepted_rejected_and_the_targets_token():
    rec = fake_record()
    html = tree_html(rec, 0, "pld")
    assert html.count('class="sd-t sd-t-acc') == 2  # the accepted chain 2 → 3
    assert html.count("sd-t-rej") == 1 and "␣y" in html  # the drafted " y" the target rejected (whitespace visible)
    assert html.count("sd-t-other") == 1  # the sibling branch " q", never reached
    assert html.count('class="sd-t sd-t-own"') == 1 and "★ ↵" in html  # the target's own token, a newline
    assert 'data-node="root"' in html and ">!<" in html  # the tree hangs off the prompt's last token
    assert html.count('class="sd-e-acc"') == 3  # root → 2 → 3 → the target's own token
    assert "&lt;b&gt;" in html and "source: prompt" in html
    text = explain_step(rec, 0, "pld")
    assert "proposed 4 tokens" in text and "2 branches" in text and "first 2" in text and "3 tokens for one" in text
    assert "had no guess" in explain_step(rec, 1, "pld") and "max-new-tokens" in explain_step(rec, 1, "pld")
    tree, expl, so_far = show_step(rec, 99)  # clamped to the last step
    assert "Step 2 of 2" in expl and "sd-now" in so_far


def test_a_64_node_tree_is_drawn_without_overlaps():
    import random
    import re

    from specdemo.app.tree_svg import BOX_H, BOX_W, tree_svg

    rng = random.Random(0)
    parents = [-1] + [rng.randrange(-1, i) for i in range(1, 64)]
    sources = [rng.choice(["datastore", "prompt", "head1", "head3", "adaptive"]) for _ in parents]
    probe = [False] * 60 + [True] * 4  # leaves hung last: probes never have draft children
    parents[60:] = [59, 59, 58, 58]
    tree = DraftTree(list(range(100, 164)), parents, sources, probe, [rng.random() for _ in parents])
    accepted = tree.path_to(57)
    svg = tree_svg(tree, accepted, 999, 7, {i: f"t{i}" for i in range(1000)})
    boxes = [(float(x), float(y)) for x, y in re.findall(r'<rect x="([\d.]+)" y="([\d.]+)"', svg)]
    assert len(boxes) == 64 + 2  # every node, the root and the target's own token
    assert len(set(boxes)) == len(boxes)  # no two boxes in one place
    width, height = map(float, re.search(r'width="([\d.]+)" height="([\d.]+)"', svg).groups())
    assert all(x + BOX_W <= width and y + BOX_H <= height for x, y in boxes)
    assert svg.count('class="sd-t sd-t-acc') == len(accepted) and svg.count("sd-t-probe") == 4
    assert svg.count("drafter's estimate") == 64 and 'data-src="datastore"' in svg and 'data-src="head3"' in svg


def test_spans_name_their_source_with_the_drafters_colours():
    rec = fake_record()
    html = spans_html(rec, "pld")
    colour = {s.name: s for s in __import__("specdemo.drafters", fromlist=["sources"]).sources("pld")}["prompt"].colour
    assert f'data-src="prompt" style="--sd-src-light:{colour}' in html and 'data-src="own"' in html
    rec.runs["pld"].events[0].tree.sources[0] = "nowhere"
    rec.pieces["pld"][0].source = "nowhere"  # a source the drafter did not declare shows as a plain accepted draft
    assert 'data-src="draft"' in spans_html(rec, "pld")


def test_export_has_spec_bench_fields():
    data = record_json(fake_record())
    for method in ("ar", "pld"):
        run = data["runs"][method]
        assert {"new_tokens", "wall_time", "accept_lengths", "decoding_steps", "text"} <= set(run)
    assert data["runs"]["pld"]["accept_lengths"] == [3, 1] and data["runs"]["ar"]["new_tokens"] == 4
    assert data["summary"]["identical"] and data["settings"]["max_new_tokens"] == 8 and data["method"] == "pld"


def test_plot_frames_have_fixed_types():
    rec = fake_record()
    curve, hist, times, depth = (p.frame(rec, "pld") for p in PLOTS)
    assert set(curve["run"]) == {"Autoregressive", "Prompt lookup"} and curve["compute (s)"].dtype.kind == "f"
    assert list(hist["tokens per step"]) == ["1", "3"] and list(hist["steps"]) == [1, 1]
    assert len(times) == 4 and set(times["phase"]) == {"draft", "verify"}
    # acceptance by depth: step 1 accepted 2 drafts, step 2 none -> half the steps reach 1 and 2, none 3
    assert list(depth["share of steps"])[:3] == [0.5, 0.5, 0.0] and set(depth["run"]) == {"Prompt lookup"}
    for plot in PLOTS:  # before any race: empty frames of the declared types
        frame = plot.frame(None, None)
        assert len(frame) == 0 and list(frame.columns) == list(plot.dtypes)
        assert len(plot.title) <= 26  # fits its chart's box
    colours = PLOTS[0].colours(rec)
    assert colours["Prompt lookup"] == lane_style("pld").colour and colours["Autoregressive"] == "#9ca3af"


def test_knobs_become_drafter_options():
    values = tuple(k.value for k in all_knobs())
    assert options_of("pld", values) == {"num_tokens": 10, "max_ngram": 3}
    assert options_of("rest", values) == {"max_suffix": 16}  # budget 0 = leave REST's own (cost-based) default
    assert "budget" not in options_of("s4c", values)  # 0 = the drafter's device default (11 nodes on CPU)
    assert options_of("s4c", tuple(9 if k.option == "budget" else k.value for k in all_knobs()))["budget"] == 9


# ------------------------------------------------------------------------------------- input checks at the edge

# (race_request arguments, a piece of the message): each names the allowed range or the valid names
BAD_INPUTS = [
    (dict(seed=2**70), "Seed must be an integer from 0 to 9223372036854775807"),
    (dict(seed=-1), "Seed must be an integer from 0"),
    (dict(seed=1.5), "Seed must be an integer"),
    (dict(seed="abc"), "Seed must be an integer"),
    (dict(temperature=-0.1), "Temperature must be a number from 0 to 2"),
    (dict(temperature=float("nan")), "Temperature must be a number"),
    (dict(temperature="hot"), "Temperature must be a number"),
    (dict(top_p=0), "Top-p must be a number above 0 and at most 1"),
    (dict(top_p=1.5), "Top-p must be a number above 0 and at most 1"),
    (dict(top_k=-3), "Top-k must be an integer from 0 to 1000"),
    (dict(top_k=2.5), "Top-k must be an integer"),
    (dict(max_new_tokens=0), "Max new tokens must be an integer from 1 to 512"),
    (dict(max_new_tokens=10**9), "Max new tokens must be an integer from 1 to 512"),
    (dict(max_new_tokens=True), "Max new tokens must be an integer"),
    (dict(method="medusa"), "Unknown mode 'medusa'. Choose one of: rest, s4c, sdsat, pld"),
    (dict(method=7), "Mode must be text"),
    (dict(prompt=["a"]), "Prompt must be text"),
    (dict(prompt="x" * 20_000), "this demo takes up to 16,000"),
    (dict(model="m" * 300), "this demo takes up to 256"),
    (dict(options="budget=3"), "options must be a dict"),
    (dict(options={"warp": 1}), "Prompt lookup has no option 'warp'. Its options: num_tokens (an integer from 1 to 64)"),
    (dict(options={"num_tokens": 0}), "option num_tokens=0 is not allowed: give an integer from 1 to 64"),
    (dict(options={"num_tokens": "many"}), "give an integer from 1 to 64"),
    (dict(options={"adaptive": "maybe"}), "give true or false"),
    (dict(method="rest", options={"scoring": "vibes"}), "give one of 'acceptance', 'count'"),
    (dict(method="rest", options={"budget": 10**6}), "give an integer from 1 to 256"),
    (dict(method="s4c", options={"budget": "huge"}), "give an integer from 1 to 256 or 'auto'"),
    (dict(method="s4c", options={"tree": 3}), "give one of 's4c', 'chain', 'eagle'"),
    (dict(method="sdsat", options={"branching": "4,x"}), "give integers from 1 to 64, comma-separated"),
    (dict(method="sdsat", options={"k": float("inf")}), "give an integer from 1 to 16"),
]


@pytest.mark.parametrize("kwargs, expect", BAD_INPUTS)
def test_bad_input_is_refused_with_the_allowed_range(kwargs, expect):
    args = dict(prompt="Hello", method="pld") | kwargs
    with pytest.raises(UserError) as info:
        race_request(**args)
    assert expect in str(info.value)


def test_good_input_is_normalised():
    req = race_request("Hi", " REST ", "", 16.0, "0.5", 0.9, 40.0, "", {"budget": "12", "use_context": "false",
                                                                          "datastore": "none"})
    assert req.method == "rest" and req.model == "embedded" and req.max_new_tokens == 16
    assert (req.sampling.temperature, req.sampling.top_p, req.sampling.top_k, req.sampling.seed) == (0.5, 0.9, 40, 0)
    assert req.options == {"rest": {"budget": 12, "use_context": False, "datastore": "none"}}
    assert race_request("Hi", seed=MAX_SEED).sampling.seed == MAX_SEED


def test_every_knob_is_a_declared_option_in_range():
    for method in REGISTRY:
        declared = {o.name: o for o in options(method.name)}
        for knob in all_knobs():
            if knob.method == method.name:
                opt = declared[knob.option]
                for v in (max(knob.minimum, 1), knob.maximum, knob.value or knob.maximum):
                    assert opt.check(v) == v
    with pytest.raises(ValueError, match="takes no options"):
        check_options("ar", {"budget": 3})


KNOBS = tuple(k.value for k in all_knobs())


def generate(mode="pld", prompt=SHORT, max_new_tokens=8, seed=0, request=None, user_store=None, precision="fp32"):
    """The page's Generate (or Race all, with mode "all") as its handler sees it."""
    return list(on_race(request, mode, "embedded", precision, prompt, max_new_tokens, 0.0, 1.0, 0, seed, user_store,
                        *KNOBS))


def test_the_precision_picker_loads_and_races_the_model_at_that_precision(embedded):
    from specdemo.app.page.handlers import on_load_model

    if not __import__("specdemo.precision", fromlist=["x"]).int4_available():
        pytest.skip("no int4 CPU kernel on this CPU")
    header = on_load_model("embedded", "int4", "pld")[0]
    assert "int4 weights" in header
    final = generate(precision="int4", max_new_tokens=24)[-1]
    rec = final[4]
    assert rec.precision == "int4" and rec.status == "done"
    tokens = [run.tokens for run in rec.runs.values()]
    assert len(tokens) == 2 and tokens[0] == tokens[1]  # AR and prompt lookup at int4: the same text
    bad = generate(precision="int3")
    assert len(bad) == 1 and "fp32, bf16, int4" in bad[0][3]


def test_page_handler_shows_a_bad_input_message():
    out = generate(prompt="Hello", max_new_tokens=64, seed=2**70)
    assert len(out) == 1 and "Seed must be an integer from 0 to 9223372036854775807" in out[0][3]


# --------------------------------------------------------------------------------------------- the race loop

def test_run_race_streams_and_stops_within_one_step(embedded):
    stop = threading.Event()
    seen = []
    for rec in run_race(RaceRequest(SHORT, ("pld",), max_new_tokens=16), stop):
        seen.append((rec.status, sum(r.forwards for r in rec.runs.values())))
        if rec.status == "running" and seen[-1][1] == 2:
            stop.set()
    assert seen[-1][0] == "stopped" and seen[-1][1] <= 3  # at most one more step ran after Stop
    assert "Stopped" in rec.message


def test_page_handler_throttles_and_ends_with_the_whole_run(embedded, monkeypatch):
    import gradio as gr

    import specdemo.app.page.handlers as handlers

    monkeypatch.setattr(handlers, "TEXT_EVERY", 0.0)
    every = generate()
    monkeypatch.setattr(handlers, "TEXT_EVERY", 3600.0)
    few = generate()
    assert len(few) == 3 < len(every)  # throttled: the start, the first step (a status change), the end
    assert "racing" in every[2][0] or "racing" in every[2][1]
    for outs in (every, few):
        final = dict(zip(RACE_OUTPUTS, outs[-1]))
        rec = final["record_state"]
        assert isinstance(rec, RaceRecord) and rec.status == "done" and rec.summaries["pld"].identical
        assert final["ar_pane"] == pane_html(rec, "ar") and final["spec_pane"] == pane_html(rec, "pld")
        assert 'data-status="done"' in final["summary"] and "page and bookkeeping" in final["summary"]
        assert not any(isinstance(final[p.name], type(gr.skip())) for p in PLOTS)  # the plots redrawn
        assert f"<b>{rec.runs['pld'].n_tokens}</b> tokens" in final["spec_pane"] and rec.runs["pld"].n_tokens == 8


def test_the_plots_draw_while_racing(embedded, monkeypatch):
    """Every plot update mid-race carries the race so far (the first as soon as the first steps are in)."""
    import specdemo.app.page.handlers as handlers

    monkeypatch.setattr(handlers, "TEXT_EVERY", 0.0)
    monkeypatch.setattr(handlers, "PLOT_EVERY", 0.0)
    outs = [dict(zip(RACE_OUTPUTS, o)) for o in generate(max_new_tokens=12)]
    mid = [o for o in outs[:-1] if not isinstance(o["curve_plot"], type(__import__("gradio").skip()))]
    assert mid, "no plot update before the end"
    for o in mid:
        for p in PLOTS:
            frame = o[p.name].value if hasattr(o[p.name], "value") else o[p.name]["value"]
            data = frame["data"] if isinstance(frame, dict) else frame
            assert len(data) > 0, f"{p.name} is empty mid-race"


def _local_request(host: str = "127.0.0.1"):
    from types import SimpleNamespace

    return SimpleNamespace(client=SimpleNamespace(host=host), session_hash=f"drawn-{host}")


def test_the_race_waits_for_a_local_page_to_draw_each_update(embedded, monkeypatch):
    import re

    import specdemo.app.page.handlers as handlers
    from specdemo.app.clocks.drawn import mark_drawn

    monkeypatch.setattr(handlers, "TEXT_EVERY", 0.0)
    outs = []
    for out in on_race(_local_request(), "pld", "embedded", "fp32", SHORT, 8, 0.0, 1.0, 0, 0, None, *KNOBS):
        outs.append(out)
        token = re.search(r'data-update="(\w+)"', out[2])
        assert (token is None) == (out is outs[-1] and "done" in out[2])  # every update but the last asks for one
        if token:
            mark_drawn(token.group(1))
    assert len(outs) > 3 and f'data-drawn="{len(outs) - 1}"' in outs[-1][2]


def test_an_update_that_redraws_the_charts_says_so_to_a_local_page(embedded, monkeypatch):
    """drawn.js waits for the charts' marks before acknowledging such an update: the first one loads the charting
    module while the page looks idle, and acknowledged then, its drawing would land on the next timed step."""
    import re

    import gradio as gr

    import specdemo.app.page.handlers as handlers
    from specdemo.app.clocks.drawn import mark_drawn

    monkeypatch.setattr(handlers, "TEXT_EVERY", 0.0)
    monkeypatch.setattr(handlers, "PLOT_EVERY", 0.3)
    flags = []
    for out in on_race(_local_request(), "pld", "embedded", "fp32", SHORT, 24, 0.0, 1.0, 0, 0, None, *KNOBS):
        o = dict(zip(RACE_OUTPUTS, out))
        if token := re.search(r'data-update="(\w+)"', o["summary"]):
            flags.append(('data-plots="1"' in o["summary"], not isinstance(o["curve_plot"], type(gr.skip()))))
            mark_drawn(token.group(1))
    assert flags and all(said == plotted for said, plotted in flags)
    assert any(said for said, _ in flags) and not all(said for said, _ in flags)


def test_a_page_that_does_not_answer_is_waited_for_once(embedded, monkeypatch):
    import specdemo.app.clocks.drawn as drawn
    import specdemo.app.page.handlers as handlers

    monkeypatch.setattr(handlers, "TEXT_EVERY", 0.0)
    monkeypatch.setattr(drawn, "ACK_TIMEOUT", 0.05)
    outs = generate(request=_local_request())
    assert sum("data-update" in out[2] for out in outs) == 1 and 'data-drawn="0"' in outs[-1][2]
    remote = generate(request=_local_request("203.0.113.9"))
    assert not any("data-update" in out[2] for out in remote)  # a browser elsewhere does not share the cores


def test_race_all_in_the_page_handler(embedded, monkeypatch):
    import specdemo.app.page.handlers as handlers

    monkeypatch.setattr(handlers, "TEXT_EVERY", 3600.0)
    outs = generate(mode="all")
    final = dict(zip(RACE_OUTPUTS, outs[-1]))
    rec = final["record_state"]
    assert rec.status == "done" and rec.request.race_all and len(rec.runs) >= 3
    assert all(s.identical for s in rec.summaries.values())
    lanes = final["lanes"]["value"] if isinstance(final["lanes"], dict) else final["lanes"].value
    assert lanes.count('class="sd-lane"') == len(rec.runs) and lanes.count("<tr data-lane=") == len(rec.runs)
    assert 'data-lanes="%d"' % len(rec.runs) in final["summary"] and 'data-identical="1"' in final["summary"]
    first = dict(zip(RACE_OUTPUTS, outs[0]))
    assert first["pair"].visible is False  # the two-pane view gives way to the lanes
    assert "<svg" in final["tree_view"]  # Step by step shows a lane of the race all


def test_bench_tab_formats_run_bench_results(monkeypatch, embedded):
    import specdemo.app.page.handlers as handlers

    def fake_run_bench(target, methods, prompts, max_new_tokens, sampling=None, options=None, progress=None,
                       warmup=True):
        assert methods == ["pld"] and [p["id"] for p in prompts] == ["Code"] and max_new_tokens == 16
        progress(0, 2, "Code", "ar")
        row = lambda tps, sp, tau: {"tokens_per_s": tps, "speedup": sp, "tau": tau, "identical": 1.0,  # noqa: E731
                                    "draft_ms": 0.1, "verify_ms": 60.0, "decode_speedup": 2 * sp - 1,
                                    "per_prompt": [{"prefill_s": 0.2, "wall_time": 1.0 / sp}]}
        return {"device": "cpu", "model": target.name,
                "methods": {"ar": row(10.0, 1.0, 1.0), "pld": row(15.0, 1.5, 2.5)}}

    monkeypatch.setattr(handlers, "run_bench", fake_run_bench)
    table, bars, note, download = handlers.on_bench("embedded", "fp32", ["pld"], ["Code"], 16, progress=lambda *a, **k: None)
    assert list(table["method"]) == ["Autoregressive", "Prompt lookup"] and list(table["identical"]) == ["100%", "100%"]
    assert list(table["speedup"]) == ["1.00×", "1.50×"] and list(table["τ"]) == ["1.00", "2.50"]
    assert "1.50×" in bars and "Speedup" in bars and "1 prompts" in note
    assert "Prefill: 20% of AR" in note and "decoding alone: Prompt lookup 2.00x" in note
    assert tuple(table.columns) == handlers.BENCH_COLUMNS  # the headers the page shows before a run (layout.py)
    table, bars, note, download = handlers.on_bench("embedded", "fp32", [], ["Code"], 16, progress=lambda *a, **k: None)
    assert "at least one method" in note and len(table) == 0 and tuple(table.columns) == handlers.BENCH_COLUMNS
