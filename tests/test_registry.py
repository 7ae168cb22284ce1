"""The drafter registry and contract: a drafter registered at run time is everywhere the built-in ones are (methods,
labels, options, knobs, sources, make), renamed options keep working with a deprecation warning, and every built-in
drafter declares the sources it drafts from."""
from __future__ import annotations

import sys
import types
import warnings

import pytest

import specdemo.drafters as registry
from specdemo.drafters import (
    BY_NAME,
    DEFAULT_METHOD,
    LABELS,
    METHODS,
    REGISTRY,
    DraftSource,
    Knob,
    Method,
    Option,
)
from specdemo.engine import Drafter
from specdemo.tree import DraftTree

TOY_SOURCE = DraftSource("toy", "the toy", "#ffffff", "#000000")


class ToyDrafter(Drafter):
    name = "toy"

    def __init__(self, width: int):
        self.width = width

    def propose(self, state) -> DraftTree:
        return DraftTree.chain([1] * self.width, TOY_SOURCE.name)


def toy_module() -> types.ModuleType:
    """A drafter package as a test writes one: make, unavailable_reason, OPTIONS, KNOBS, SOURCES."""
    mod = types.ModuleType("toy_drafter")
    mod.made = []

    def make(target, width: int = 2) -> ToyDrafter:
        mod.made.append(width)
        return ToyDrafter(width)

    mod.make = make
    mod.unavailable_reason = lambda target: None if target == "ok" else "needs an ok target"
    mod.OPTIONS = (Option("width", "int", 1, 8, help="chain length", aliases=("length",)),)
    mod.KNOBS = (Knob("toy", "width", "Width", 0, 8, 0, "chain length · 0 = default", zero_keeps_default=True),)
    mod.SOURCES = (TOY_SOURCE, registry.PROMPT)
    return mod


@pytest.fixture
def toy(monkeypatch):
    mod = toy_module()
    monkeypatch.setitem(sys.modules, "toy_drafter", mod)
    registry.register(Method("toy", "Toy", "a chain of ones", 9, "#123456", "toy_drafter"))
    yield mod
    registry.unregister("toy")


def test_a_registered_drafter_is_everywhere(toy):
    # the views imported before registering see it
    assert REGISTRY[-1].name == "toy" and "toy" in METHODS and METHODS[-1] == "toy"
    assert LABELS["toy"] == "Toy" and BY_NAME["toy"].module == "toy_drafter"
    assert registry.module("toy") is toy
    assert [o.name for o in registry.options("toy")] == ["width"]
    assert registry.knobs("toy")[0].option == "width" and registry.all_knobs()[-1].method == "toy"
    assert registry.sources("toy") == (TOY_SOURCE, registry.PROMPT)
    everything = registry.all_sources()
    assert everything["toy"] is TOY_SOURCE and list(everything).count("prompt") == 1
    assert list(everything)[-1] == "toy"  # registry order: the built-in ones' sources first
    assert registry.by_default_rank()[-1] == "toy"
    drafter = registry.make_drafter("toy", None, width="3")  # checked: a string from a form becomes an int
    assert isinstance(drafter, ToyDrafter) and toy.made == [3]
    assert drafter.propose(None).sources == ["toy"] * 3
    with pytest.raises(ValueError, match="width=9 is not allowed"):
        registry.make_drafter("toy", None, width=9)
    assert registry.unavailable_reason("toy", "ok") is None and registry.unavailable_reason("toy", "x")
    assert registry.note("toy", "ok") is None  # `note` is optional


def test_build_drafter_takes_checked_options_as_they_are(toy):
    """The request edge checks once (check_options); build_drafter does not check again."""
    checked = registry.check_options("toy", {"width": "4"})
    assert checked == {"width": 4}
    registry.build_drafter("toy", None, checked)
    registry.build_drafter("toy", None, {"width": 99})  # out of range, but not re-checked
    assert toy.made == [4, 99]
    assert registry.build_drafter("ar", None, {}) is None


def test_unregister_removes_every_trace(toy):
    registry.unregister("toy")
    try:
        assert "toy" not in METHODS and "toy" not in LABELS and "toy" not in BY_NAME
        assert "toy" not in registry.all_sources()
        with pytest.raises(ValueError, match="Unknown method 'toy'"):
            registry.make_drafter("toy", None)
    finally:
        registry.register(Method("toy", "Toy", "a chain of ones", 9, "#123456", "toy_drafter"))


def test_registration_refusals(monkeypatch):
    with pytest.raises(ValueError, match="already registered"):
        registry.register(BY_NAME["pld"])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Method("ar", "AR", "", 0, "#000000", "x"))
    with pytest.raises(ValueError, match="default method"):
        registry.unregister(DEFAULT_METHOD)
    broken = types.ModuleType("broken_drafter")
    broken.make = lambda target: None
    monkeypatch.setitem(sys.modules, "broken_drafter", broken)
    registry.register(Method("broken", "Broken", "", 9, "#000000", "broken_drafter"))
    try:
        with pytest.raises(TypeError, match="lacks unavailable_reason, OPTIONS, KNOBS, SOURCES"):
            registry.options("broken")
    finally:
        registry.unregister("broken")


def test_renamed_options_still_work_with_a_warning(toy):
    with pytest.warns(DeprecationWarning, match="length is now called width"):
        assert registry.check_options("toy", {"length": 5}) == {"width": 5}
    with pytest.raises(ValueError, match="give width only"):
        registry.check_options("toy", {"length": 5, "width": 5})
    # the prompt-lookup graft has one name in every drafter; the former ones still work
    with pytest.warns(DeprecationWarning, match="context is now called prompt_lookup"):
        assert registry.check_options("s4c", {"context": "6"}) == {"prompt_lookup": 6}
    with pytest.warns(DeprecationWarning, match="lookup is now called prompt_lookup"):
        assert registry.check_options("sdsat", {"lookup": 4}) == {"prompt_lookup": 4}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert registry.check_options("s4c", {"prompt_lookup": 0}) == {"prompt_lookup": 0}
    with pytest.raises(ValueError, match="no option 'lookup'"):
        registry.check_options("s4c", {"lookup": 3})  # an alias belongs to its own drafter only


def test_knob_zero_keeps_the_drafters_default():
    budget = registry.knobs("rest")[0]
    assert budget.zero_keeps_default and budget.resolve(0) == (False, None) and budget.resolve(12.0) == (True, 12)
    plain = Knob("pld", "num_tokens", "Draft length", 1, 32, 10)
    assert plain.resolve(0) == (True, 0) and plain.resolve(7) == (True, 7)


def test_built_in_registry():
    assert [m.name for m in REGISTRY] == ["rest", "s4c", "sdsat", "pld"]
    assert DEFAULT_METHOD in BY_NAME and registry.by_default_rank()[0] == "rest"
    assert {m.name: m.colour for m in REGISTRY} == {"rest": "#16a34a", "s4c": "#2563eb", "sdsat": "#ea580c",
                                                    "pld": "#db2777"}
    for m in REGISTRY:
        assert registry.module(m.name).__name__ == m.module
        names = [s.name for s in registry.sources(m.name)]
        assert "prompt" in names and len(set(names)) == len(names)
        assert all(s.colour.startswith("#") and s.dark.startswith("#") for s in registry.sources(m.name))
    assert list(registry.all_sources()) == ["prompt", "datastore", "head1", "head2", "head3", "head4", "adaptive",
                                            "probe"]
    assert registry.all_sources()["head4"].label == "head 4+"
    assert METHODS + ("hf",) == ("ar", "rest", "s4c", "sdsat", "pld", "hf")  # the bench lists methods this way


def test_loading_a_model_builds_its_available_drafters(toy, tiny_llama):
    """What a drafter keeps per model (a datastore, heads, an adapter) loads with the model, not in the first request
    that races it; a drafter whose artifact fails does not stop the model from loading."""
    from specdemo.app.models import ModelCache

    ModelCache(keep=1).put("tiny", tiny_llama)
    assert toy.made == [], "unavailable on this model: not built"
    toy.unavailable_reason = lambda target: None
    ModelCache(keep=1).put("tiny", tiny_llama)
    assert toy.made == [2], "built once, with its defaults"

    def broken(target, width: int = 2):
        raise OSError("the artifact is unreadable")

    toy.make = broken
    cache = ModelCache(keep=1)
    cache.put("tiny", tiny_llama)
    assert "tiny" in cache
