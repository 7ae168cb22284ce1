"""The race scheduler and the text bookkeeping: pure logic, light fake events (no model)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from specdemo.app.racing import Race
from specdemo.app.record import Piece, Run, TextBuilder, groups_of
from specdemo.metrics import summarize


@dataclass
class Ev:
    step: int
    tokens: list[int]
    draft_s: float = 0.0
    verify_s: float = 1.0
    finish_reason: str | None = None
    from_draft: list[bool] = field(default_factory=list)
    sources: list[str | None] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)


def stream(costs: list[float], tokens_per_step: int = 1, start: int = 0):
    """A fake generate(): one event per cost, the last one finished; token t was chosen with a top-2 gap of t / 10."""
    for i, c in enumerate(costs):
        tokens = list(range(start + i * tokens_per_step, start + (i + 1) * tokens_per_step))
        yield Ev(i, tokens, 0.1 * c, 0.9 * c, "length" if i == len(costs) - 1 else None,
                 margins=[t / 10 for t in tokens])


def test_always_advances_the_run_with_less_compute():
    race = Race({"ar": stream([1.0] * 6), "spec": stream([2.5, 2.5, 1.0], tokens_per_step=2)})
    order, spent = [], {"ar": 0.0, "spec": 0.0}
    for name, ev in race:
        behind = min((n for n in spent if n not in race.done or n == name), key=lambda n: spent[n])
        assert spent[name] <= spent[behind] + 1e-9  # never advance the run that is ahead
        spent[name] += ev.draft_s + ev.verify_s
        order.append(name)
    assert order == ["ar", "spec", "ar", "ar", "spec", "ar", "ar", "ar", "spec"]
    assert race.done == {"ar", "spec"}
    assert race.compute["ar"] == pytest.approx(6.0) and race.compute["spec"] == pytest.approx(6.0)


def test_ties_go_to_the_first_named_and_finished_runs_drop_out():
    race = Race({"a": stream([1, 1]), "b": stream([1, 1, 1, 1])})
    assert [n for n, _ in race] == ["a", "b", "a", "b", "b", "b"]


def test_generator_ending_without_a_finished_event_drops_out():
    def cut():
        yield Ev(0, [1], 0.0, 1.0)  # no finish_reason, then stops

    race = Race({"a": cut(), "b": stream([1, 1, 1])})
    assert [n for n, _ in race] == ["a", "b", "b", "b"]
    assert race.done == {"a", "b"} and race.advance() is None


def test_closing_the_race_closes_its_generators():
    closed = []

    def gen(name):
        try:
            for i in range(100):
                yield Ev(i, [i], 0.0, 1.0)
        finally:
            closed.append(name)

    it = iter(Race({"a": gen("a"), "b": gen("b")}))
    next(it), next(it), next(it)
    it.close()
    assert sorted(closed) == ["a", "b"]


def test_errors_propagate():
    def bad():
        raise RuntimeError("boom")
        yield  # pragma: no cover

    with pytest.raises(RuntimeError, match="boom"):
        list(Race({"a": bad()}))


def test_run_statistics():
    run = Run("spec")
    for ev in stream([1.0, 1.0, 2.0], tokens_per_step=3):
        run.add(ev)
    assert run.n_tokens == 9 and run.forwards == 3 and run.tau == 3.0
    assert run.tokens_per_s == pytest.approx(9 / 4.0)
    assert run.accept_lengths == [3, 3, 3]
    assert run.curve == [(0.0, 0), (pytest.approx(1.0), 3), (pytest.approx(2.0), 6), (pytest.approx(4.0), 9)]
    assert run.done and run.finish_reason == "length"
    assert Run("empty").tokens_per_s == 0.0 and Run("empty").tau == 0.0


def test_summary():
    ar, spec = Run("ar"), Run("spec")
    for ev in stream([1.0] * 6):
        ar.add(ev)
    for ev in stream([1.5, 1.5], tokens_per_step=3):
        spec.add(ev)
    s = summarize(ar, spec)
    assert s.identical and s.complete and s.first_difference is None and s.tie_gap is None
    assert s.speedup == pytest.approx((6 / 3.0) / (6 / 6.0))
    assert s.tau == 3.0 and s.forwards_saved == 4

    other = Run("spec")
    for ev in stream([1.0, 1.0], tokens_per_step=3, start=1):
        other.add(ev)
    s = summarize(ar, other)
    assert not s.identical and s.first_difference == 0
    assert s.tie_gap == 0.0  # AR's gap where the runs part: AR's token 0 was chosen with a gap of 0 / 10
    longer = Run("ar")
    for ev in stream([1.0] * 4, tokens_per_step=2):
        longer.add(ev)
    assert summarize(ar, longer).first_difference == 6 and summarize(ar, longer).tie_gap is None  # AR ended there


def test_summary_while_running_compares_the_common_prefix():
    ar, spec = Run("ar"), Run("spec")
    ar.add(Ev(0, [0]))
    for ev in stream([1.0, 1.0], tokens_per_step=3):
        spec.add(ev)
    s = summarize(ar, spec)
    assert s.identical and not s.complete
    assert summarize(Run("ar"), Run("spec")).speedup is None


def byte_decode(vocab: dict[int, bytes]):
    return lambda ids: b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")


def test_text_builder_credits_multibyte_characters_to_the_token_that_completes_them():
    vocab = {1: b"caf", 2: b"\xc3", 3: b"\xa9", 4: b" \xf0\x9f", 5: b"\x8e\x89!"}  # "café 🎉!" split mid-character
    tb = TextBuilder(byte_decode(vocab))
    tb.add([1, 2], 0, [False, True], [None, "ctx"])
    assert tb.text == "caf" and [p.text for p in tb.pieces] == ["caf", ""]
    tb.add([3, 4, 5], 1, [True, True, False], ["ctx", "ctx", None])
    assert tb.text == "café 🎉!"
    assert [p.text for p in tb.pieces] == ["caf", "", "é", "", " 🎉!"]
    assert "".join(p.text for p in tb.pieces) == tb.text


def test_text_builder_trims_when_decoding_rewrites_earlier_text():
    def decode(ids):  # a clean-up rule: "a" followed by "b" becomes "X"
        return "".join({1: "a", 2: "b", 3: "c"}[i] for i in ids).replace("ab", "X")

    tb = TextBuilder(decode)
    tb.add([3, 1], 0, [False, False], [None, None])
    tb.add([2], 1, [False], [None])
    assert tb.text == "cX" and "".join(p.text for p in tb.pieces) == "cX"
    assert [p.text for p in tb.pieces] == ["c", "", "X"]


def test_text_builder_on_the_real_tokenizer(embedded):
    text = "def f(x):\n    return x  # naïve — 世界 🎉\n\tend"
    ids = embedded.tokenizer(text, add_special_tokens=False)["input_ids"]
    tb = TextBuilder(embedded.decode)
    for i, t in enumerate(ids):
        tb.add([t], i, [i % 2 == 0], [None])
    assert tb.text == embedded.decode(ids)
    assert "".join(p.text for p in tb.pieces) == tb.text
    assert len(tb.pieces) == len(ids)


def test_groups_merge_a_steps_drafts_and_keep_its_own_token_apart():
    pieces = [Piece("a", 0, True, "ctx"), Piece("b", 0, True, "ctx"), Piece("c", 0, False, None),
              Piece("d", 1, False, None), Piece("e", 2, True, None), Piece("f", 2, True, "db")]
    assert [(g.text, g.step, g.from_draft, g.source) for g in groups_of(pieces)] == [
        ("ab", 0, True, "ctx"), ("c", 0, False, None), ("d", 1, False, None), ("ef", 2, True, "db")]
