"""The launched app over HTTP: `/race` and `/race_all` through gradio_client, the page's script and queue."""
from __future__ import annotations

import socket

import pytest

from specdemo import ASSETS
from specdemo.app.clocks.gate import Gate
from specdemo.app.clocks.quiet_queue import POLL_S, PROGRESS_POLL_S, RACING_POLL_S, quiet
from specdemo.app.page.handlers import on_race
from specdemo.app.page.layout import MODEL_WORK, MODEL_WORK_LIMIT, QUEUE_SIZE
from specdemo.app.racing import GATE, MAX_WAITING, run_race
from specdemo.app.request import RaceRequest
from specdemo.drafters import REGISTRY, all_knobs

REGISTRY_NAMES = [m.name for m in REGISTRY]
SHORT = "Say hi."
PROMPT = ("Summarise this paragraph in one sentence:\nThe Eiffel Tower is a wrought-iron lattice tower on the Champ de "
          "Mars in Paris, France. It is named after the engineer Gustave Eiffel, whose company designed and built it.")


@pytest.fixture(autouse=True, scope="module")
def shared_model(embedded):
    from specdemo.app.models import MODELS

    MODELS.put("embedded", embedded)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app(embedded):
    from specdemo.app.page import build_demo, launch_kwargs

    demo = build_demo()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True,
                            **launch_kwargs())
    yield demo, url
    demo.close()


@pytest.fixture(scope="module")
def client(app):
    from gradio_client import Client

    return Client(app[1], verbose=False)


def test_the_drawn_endpoint_releases_a_waiting_race(app):
    import httpx

    from specdemo.app.clocks.drawn import DRAWN

    token = DRAWN.expect()
    reply = httpx.post(app[1] + "gradio_api/run/drawn", json={"data": [token]}, timeout=30)
    assert reply.status_code == 200
    assert DRAWN.wait(token, timeout=5.0)


def test_the_page_carries_the_early_script_before_gradios_modules(app):
    import httpx

    html = httpx.get(app[1], timeout=30).text
    script = html.find("sdCalmedFrames")
    assert 0 < script < html.find('<script type="module"')  # runs before Gradio's modules capture the frame function
    assert html.count("sdCalmedFrames") == (ASSETS / "calm_trackers.js").read_text().count("sdCalmedFrames")
    config = httpx.get(app[1] + "config", timeout=30)
    assert config.status_code == 200 and "sdCalmedFrames" not in config.text  # only the page itself is changed


def test_the_default_model_loads_before_the_server_starts(monkeypatch):
    """Loading measures the cost curve that sizes the trees: it must not wait for the first visit, when the browser
    rendering the new page shares the cores with the measurement."""
    from specdemo.app.page import layout
    from specdemo.precision import default_precision, model_spec

    asked = []
    monkeypatch.setattr(layout.MODELS, "get", lambda name: asked.append(name))
    layout.build_demo("embedded")
    assert asked == [model_spec("embedded", default_precision())]  # at the precision the picker starts at


def test_the_queue_polls_every_50_ms_and_slower_while_model_work_holds_the_gate(app, client):
    demo, _ = app
    assert demo._queue.sleep_when_free == POLL_S >= 0.02
    assert demo._queue.progress_update_sleep_when_free == PROGRESS_POLL_S
    with GATE.turn():
        assert demo._queue.sleep_when_free == RACING_POLL_S > POLL_S
    assert demo._queue.sleep_when_free == POLL_S
    assert client.predict("Hi", "pld", "embedded", 4, api_name="/race")["status"] == "done"
    assert demo._queue.sleep_when_free == POLL_S  # the race let go of the gate when it ended


def test_quieting_a_queue_that_gradio_renamed_fails_loudly():
    import gradio as gr

    with gr.Blocks() as demo:
        gr.Button()
    demo.queue()
    del demo._queue.sleep_when_free
    with pytest.raises(RuntimeError, match="sleep_when_free"):
        quiet(demo)


def test_model_work_goes_through_the_gate(app):
    demo, _ = app
    assert demo._queue.max_size == QUEUE_SIZE and QUEUE_SIZE > MODEL_WORK_LIMIT > MAX_WAITING
    deps = {d.api_name: d for d in demo.fns.values()}
    for name in ("race", "generate"):
        assert deps[name].concurrency_id == MODEL_WORK and deps[name].concurrency_limit == MODEL_WORK_LIMIT


@pytest.mark.parametrize("args, expect", [
    (("", "pld"), "prompt is empty"),
    (("x" * 20_000, "pld"), "characters"),
    (("Hello", "pld", "no-such-org/no-such-model-xyz"), "Cannot load model"),
    (("Hello", "medusa"), "Unknown mode"),
    (("Hello", "pld", "embedded", 64, 0.0, 1.0, 0, 2**70), "Seed must be an integer from 0 to 9223372036854775807"),
    (("Hello", "pld", "embedded", 64, 0.0, 1.0, 0, 0, {"warp": 3}), "Its options: num_tokens"),
    (("Hello", "rest", "embedded", 64, 0.0, 0.0), "Top-p must be a number above 0 and at most 1"),
])
def test_errors_come_back_as_messages(client, args, expect):
    out = client.predict(*args, api_name="/race")
    assert out["status"] == "error" and expect in out["message"]
    assert set(out) >= {"ar", "spec", "summary", "model", "method"}


def test_a_full_line_is_refused_with_a_message(client, monkeypatch):
    import specdemo.app.racing as racing

    gate = Gate(max_waiting=0)
    holder = gate.join()
    assert gate.wait(holder, 0) == 0  # someone else's race holds the gate; nobody may wait behind it
    monkeypatch.setattr(racing, "GATE", gate)
    out = client.predict("Hello", "pld", api_name="/race")
    assert out["status"] == "error" and "The demo is busy" in out["message"] and "at most 0" in out["message"]
    page = list(on_race(None, "pld", "embedded", "fp32", "Hello", 8, 0.0, 1.0, 0, 0, None, *(k.value for k in all_knobs())))
    assert "The demo is busy" in page[-1][3]


def test_a_queued_race_says_so_and_runs_when_its_turn_comes(embedded, monkeypatch):
    import specdemo.app.racing as racing

    gate = Gate(max_waiting=4)
    holder = gate.join()
    gate.wait(holder, 0)
    monkeypatch.setattr(racing, "GATE", gate)
    stream = run_race(RaceRequest(SHORT, ("pld",), max_new_tokens=4))
    first = next(stream)
    assert first.status == "queued" and "Waiting for 1 request ahead of yours" in first.message
    gate.leave(holder)
    final = list(stream)[-1]
    assert final.status == "done" and final.queue_wait_s > 0 and gate.waiting() == 0


def test_missing_artifact_is_a_message(client, monkeypatch):
    import specdemo.app.racing as ui

    reason = "No datastore for embedded: build it with `python -m specdemo datastore build`."
    monkeypatch.setattr(ui, "unavailable_reason", lambda method, target: reason if method == "rest" else None)
    out = client.predict("Hello", "rest", api_name="/race")
    assert out["status"] == "error" and "unavailable" in out["message"] and "datastore build" in out["message"]


def test_race_api_streams_a_greedy_prompt_lookup_run(client):
    job = client.submit(PROMPT, "pld", "embedded", 32, 0.0, 1.0, 0, 0, {"num_tokens": 10}, api_name="/race")
    updates = list(job)
    running = [u for u in updates if u["status"] == "running"]
    assert len(running) >= 2, "partial results must stream"
    assert any(0 < u["spec"]["new_tokens"] < updates[-1]["spec"]["new_tokens"] for u in running)
    final = updates[-1]
    assert final["status"] == "done", final["message"]
    s = final["summary"]
    assert s["identical"] and s["complete"] and s["tau"] > 1.0 and s["speedup"] > 0
    assert final["ar"]["text"] == final["spec"]["text"] and final["spec"]["new_tokens"] > 0
    spans = final["spec"]["spans"]
    assert any(sp["accepted_draft"] and sp["source"] == "prompt" for sp in spans), "accepted drafts are marked"
    assert "".join(sp["text"] for sp in spans) == final["spec"]["text"]
    run = final["run"]
    assert set(run["runs"]) == {"ar", "pld"}
    assert {"new_tokens", "wall_time", "accept_lengths"} <= set(run["runs"]["pld"])
    assert run["settings"]["options"] == {"num_tokens": 10}


def test_race_all_api_streams_every_available_lane(client, embedded):
    from specdemo.app.models import availability

    job = client.submit(PROMPT, "embedded", 12, 0.0, 1.0, 0, 0, {"pld": {"num_tokens": 10}}, None,
                        api_name="/race_all")
    updates = list(job)
    final = updates[-1]
    assert final["status"] == "done", final["message"]
    avail = availability(embedded)
    expected = {m for m in REGISTRY_NAMES if avail.get(m) is None}
    assert set(final["lanes"]) == {"ar"} | expected and set(final["skipped"]) == set(REGISTRY_NAMES) - expected
    ar = final["lanes"]["ar"]["text"]
    for method in expected:
        lane = final["lanes"][method]
        assert lane["identical"] and lane["text"] == ar and lane["done"] and lane["speedup"] > 0
        assert len(lane["acceptance_by_depth"]) == 8
    assert set(final["run"]["board"]) == expected and final["run"]["settings"]["options"] == {"pld": {"num_tokens": 10}}
    assert any(u["status"] == "running" for u in updates[:-1]), "partial results must stream"


@pytest.mark.parametrize("args, expect", [
    (dict(methods=["warp"]), "Unknown method 'warp'"),
    (dict(options={"rest": 16}), "options must map a method to its options"),
    (dict(options={"rest": {"budget": "abc"}}), "give an integer from 1 to 256"),
    (dict(max_new_tokens=0), "Max new tokens must be an integer from 1 to 512"),
])
def test_race_all_errors_come_back_as_messages(client, args, expect):
    call = dict(prompt=PROMPT, model="embedded", max_new_tokens=8, temperature=0.0, top_p=1.0, top_k=0, seed=0,
                options=None, methods=None) | args
    out = client.predict(*call.values(), api_name="/race_all")
    assert out["status"] == "error" and expect in out["message"], out


