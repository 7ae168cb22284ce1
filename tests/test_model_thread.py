"""All of the app's model work runs on one thread (app/clocks/model_thread.py): libgomp keeps a team of workers per calling
thread, and more teams than cores make every op sleep and wake its workers (measured: AR ~25% slower in the app)."""
from __future__ import annotations

import threading

import pytest

from specdemo.app import models, racing
from specdemo.app.clocks import model_thread
from specdemo.app.request import RaceRequest


def _where() -> str:
    return threading.current_thread().name


def test_call_runs_on_the_model_thread_returns_and_raises():
    assert not model_thread.on_model_thread()
    name = model_thread.call(_where)
    assert name.startswith(model_thread.NAME) and name != _where()
    assert model_thread.call(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(ZeroDivisionError):
        model_thread.call(lambda: 1 / 0)
    assert model_thread.call(_where) == name  # the same thread every time


def test_nested_calls_run_inline_instead_of_waiting_on_themselves():
    def outer():
        return _where(), model_thread.call(_where), model_thread.call(lambda: model_thread.call(_where))

    first, second, third = model_thread.call(outer)
    assert first == second == third


def test_iterate_makes_advances_and_closes_on_the_model_thread():
    seen: list[tuple[str, object]] = []

    def numbers():
        seen.append(("made", _where()))
        try:
            for i in range(5):
                seen.append((i, _where()))
                yield i
        finally:
            seen.append(("closed", _where()))

    assert list(model_thread.iterate(numbers)) == [0, 1, 2, 3, 4]
    assert {where for _, where in seen} == {model_thread.call(_where)}
    assert [what for what, _ in seen] == ["made", 0, 1, 2, 3, 4, "closed"]

    seen.clear()
    it = model_thread.iterate(numbers)
    assert next(it) == 0
    it.close()  # a stopped race: the generator's own cleanup runs, on the model thread
    assert [what for what, _ in seen] == ["made", 0, "closed"]
    assert {where for _, where in seen} == {model_thread.call(_where)}


def test_iterate_passes_errors_and_a_none_item_through():
    def items():
        yield None
        raise ValueError("boom")

    it = model_thread.iterate(items)
    assert next(it) is None
    with pytest.raises(ValueError, match="boom"):
        next(it)


def test_a_race_loads_and_decodes_every_step_on_the_model_thread(embedded, monkeypatch):
    """Through run_race as the page and /race use it: the model's cost curve, each lane's every step."""
    threads: set[str] = set()
    real_generate = racing.generate

    def spying_generate(*args, **kwargs):
        for ev in real_generate(*args, **kwargs):
            threads.add(_where())
            yield ev

    monkeypatch.setattr(racing, "generate", spying_generate)
    monkeypatch.setattr(models, "measure_cost_curves", lambda target: threads.add(_where()))
    models.MODELS.put("embedded", embedded)
    records = list(racing.run_race(RaceRequest("Count from one to five.", ("pld",), max_new_tokens=8)))
    assert records[-1].status == "done", records[-1].message
    assert threads == {model_thread.call(_where)}
