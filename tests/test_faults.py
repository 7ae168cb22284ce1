"""One race, end to end, with drafters made up in the test: a drafter registered at runtime races and renders with its
own name, colours and sources (no other file touched); a drafter that raises mid-race, or runs out of memory, ends
that one race with a message naming what failed, and the next request is served; a request is prepared once and its
options are checked once."""
from __future__ import annotations

import os
import sys
import types

import pytest
import torch

from specdemo.app import racing
from specdemo.app.api import race_all_api, race_api
from specdemo.app.page.handlers import RACE_OUTPUTS, on_race
from specdemo.app.racing import run_race
from specdemo.app.render import lanes_html, pane_html, summary_html
from specdemo.app.request import RaceRequest
from specdemo.drafters import DraftSource, Method, all_knobs, register, unregister
from specdemo.engine import Drafter, GenerationConfig, generate
from specdemo.tree import DraftTree

PROMPT = "Count from one to ten."
GUESS = DraftSource("toy-guess", "a toy's guess", "#123456", "#654321")


@pytest.fixture(scope="module", autouse=True)
def shared_model(embedded):
    from specdemo.app.models import MODELS

    MODELS.put("embedded", embedded)


@pytest.fixture(scope="module")
def reference(embedded) -> list[int]:
    """The greedy answer: the toy drafter proposes its next tokens, so its drafts get accepted."""
    ids = embedded.encode_prompt(PROMPT)
    return [t for ev in generate(embedded, ids, None, GenerationConfig(max_new_tokens=24)) for t in ev.tokens]


class ToyDrafter(Drafter):
    name = "toy"

    def __init__(self, reference: list[int], fail_at: int | None, error: type[BaseException]):
        self.reference, self.fail_at, self.error, self.calls = reference, fail_at, error, 0

    def propose(self, state) -> DraftTree:
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.error("the toy broke")
        done = len(state.generated)
        return DraftTree.chain(self.reference[done: done + 3], GUESS.name)


def toy_module(name: str, reference: list[int], fail_at: int | None = None,
               error: type[BaseException] = RuntimeError) -> types.ModuleType:
    """A drafter package as the registry expects one, made in memory."""
    from specdemo.drafters import Option

    mod = types.ModuleType(name)
    mod.OPTIONS = (Option("depth", "int", 1, 8, help="ignored"),)
    mod.KNOBS = ()
    mod.SOURCES = (GUESS,)
    mod.make = lambda target, **options: ToyDrafter(reference, fail_at, error)
    mod.unavailable_reason = lambda target: None
    sys.modules[name] = mod
    return mod


@pytest.fixture()
def toy(reference):
    """Registers `toy` (and unregisters it after); the test picks how it fails."""
    made = []

    def make(fail_at: int | None = None, error: type[BaseException] = RuntimeError) -> str:
        toy_module("specdemo_test_toy", reference, fail_at, error)
        register(Method("toy", "Toy", "proposes the reference answer", 9, "#0ea5e9", "specdemo_test_toy"))
        made.append("toy")
        return "toy"

    yield make
    for name in made:
        unregister(name)
    sys.modules.pop("specdemo_test_toy", None)


def test_a_registered_drafter_races_and_renders_with_its_own_name_and_colours(toy):
    toy()
    rec = list(run_race(RaceRequest(PROMPT, ("toy",), max_new_tokens=16)))[-1]
    assert rec.status == "done", rec.message
    assert rec.summaries["toy"].identical and rec.runs["toy"].tau > 1.5
    pane = pane_html(rec, "toy")
    assert "Toy" in pane and 'data-src="toy-guess" style="--sd-src-light:#123456;--sd-src-dark:#654321"' in pane
    assert "a toy&#x27;s guess" in pane  # the legend names the declared source
    assert "identical" in summary_html(rec)
    every = list(run_race(RaceRequest(PROMPT, ("pld", "toy"), max_new_tokens=8, race_all=True)))[-1]
    assert '<div class="sd-lane" data-lane="toy">' in lanes_html(every)
    from specdemo.app.plots import PLOTS

    assert PLOTS[0].colours(every)["Toy"] == "#0ea5e9"


@pytest.mark.parametrize("error, words", [(RuntimeError, "RuntimeError: the toy broke"),
                                          (torch.OutOfMemoryError, "Out of memory")])
def test_a_drafter_failing_mid_race_ends_that_race_with_a_message(toy, error, words):
    toy(fail_at=3, error=error)
    final = list(race_api(PROMPT, "toy", "embedded", 16))[-1]
    assert final["status"] == "error" and "Toy failed at step 3" in final["message"] and words in final["message"]
    assert final["ar"]["new_tokens"] > 0  # the steps before the failure are kept
    lanes = list(race_all_api(PROMPT, "embedded", 16, methods=["pld", "toy"]))[-1]
    assert lanes["status"] == "error" and "Toy failed at step 3" in lanes["message"]
    assert racing.GATE.waiting() == 0 and racing.GATE._running is None  # its place in line is free
    again = list(race_api(PROMPT, "pld", "embedded", 8))[-1]  # and the next request is served
    assert again["status"] == "done" and again["summary"]["identical"]


def test_a_model_that_fails_to_load_halfway_is_a_message(monkeypatch):
    from specdemo.app import models

    def broken(name, precision="fp32"):
        raise OSError("disk full while reading model.safetensors")

    monkeypatch.setattr(models, "load_target", broken)
    final = list(race_api(PROMPT, "pld", "some/other-model", 8))[-1]
    assert final["status"] == "error" and "Loading some/other-model failed: OSError: disk full" in final["message"]
    assert "some/other-model" not in models.MODELS
    monkeypatch.undo()
    assert list(race_api(PROMPT, "pld", "embedded", 8))[-1]["status"] == "done"


def test_a_request_is_prepared_once_and_its_options_checked_once(monkeypatch):
    import specdemo.app.request as request

    prepared, checked = [], []
    real_prepare, real_check = racing.prepare, request.check_options
    monkeypatch.setattr(racing, "prepare", lambda req: prepared.append(req) or real_prepare(req))
    monkeypatch.setattr(request, "check_options", lambda m, v: checked.append(m) or real_check(m, v))
    import specdemo.drafters as drafters

    real_registry_check = drafters.check_options
    monkeypatch.setattr(drafters, "check_options", lambda m, v: checked.append(m) or real_registry_check(m, v))
    final = list(race_api(PROMPT, "pld", "embedded", 8, options={"num_tokens": 8}))[-1]
    assert final["status"] == "done" and len(prepared) == 1 and checked == ["pld"]
    prepared.clear(), checked.clear()
    knobs = tuple(k.value for k in all_knobs())
    outs = list(on_race(None, "all", "embedded", "fp32", PROMPT, 8, 0.0, 1.0, 0, 0, None, *knobs))
    rec = dict(zip(RACE_OUTPUTS, outs[-1]))["record_state"]
    assert rec.status == "done" and len(prepared) == 1
    assert sorted(checked) == sorted(m for m in racing.modes())  # each method's options, once


def test_a_conversion_killed_part_way_leaves_no_folder_behind(tmp_path):
    """Each conversion of the embedded model writes its own `<out>.tmp-<pid>` folder, so processes converting at once
    never share one; the next conversion removes those of processes that no longer run and keeps a running one's."""
    import subprocess

    from specdemo.target import remove_stale_conversions

    out = tmp_path / "smollm2-135m-instruct-abc"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for suffix in (f".tmp-{dead.pid}", f".tmp-{os.getpid()}", ".tmp"):
        (tmp_path / (out.name + suffix)).mkdir()
    (tmp_path / "other.tmp-1").mkdir()
    remove_stale_conversions(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name + f".tmp-{os.getpid()}", "other.tmp-1"])
