"""Drafters: each proposes a draft tree per step; the engine verifies it.  This file is the one registry.

Adding a drafter is one module or package that keeps the contract (specdemo/drafters/contract.py) and one `Method`
entry: the built-in ones below, or `register(Method(...))` at run time.  The page, the `/race` API, the bench and the
CLI help all read the registry; `REGISTRY`, `METHODS`, `BY_NAME` and `LABELS` are live read-only views, so a module
that imported them sees later registrations (a value copied out of them at import time does not).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from types import MappingProxyType, ModuleType

from specdemo.drafters.contract import (
    PROMPT,
    DrafterUnavailable,
    DraftSource,
    Knob,
    Method,
    Option,
    as_number,
    number_text,
    renamed_options,
)
from specdemo.engine import Drafter
from specdemo.target import Target

__all__ = ["REGISTRY", "METHODS", "BY_NAME", "LABELS", "DEFAULT_METHOD", "PROMPT", "DraftSource", "DrafterUnavailable",
           "Knob", "Method", "Option", "all_knobs", "all_sources", "as_number", "build_drafter", "by_default_rank",
           "check_options", "knobs", "load_artifacts", "make_drafter", "module", "note", "number_text", "options",
           "register", "sources", "unavailable_reason", "unregister"]

BUILT_IN = (  # the order the page shows them in
    Method("rest", "REST", "drafts retrieved from a datastore of text and from the request itself", 0, "#16a34a",
           "specdemo.drafters.rest"),
    Method("s4c", "S4C", "three draft heads on the target's features, a continuous verification tree", 2, "#2563eb",
           "specdemo.drafters.s4c"),
    Method("sdsat", "SDSAT", "adaptive tokens that draft the next tokens inside the verification forward", 3,
           "#ea580c", "specdemo.drafters.sdsat"),
    Method("pld", "Prompt lookup", "copies what followed the last occurrence of the current n-gram", 1, "#db2777",
           "specdemo.drafters.pld"),
)
# What a request that names no method races: prompt lookup needs no artifact, so it runs on any model.  (The page
# instead selects the available method of lowest `default_rank`: see by_default_rank.)
DEFAULT_METHOD = "pld"
REQUIRED = ("make", "unavailable_reason", "OPTIONS", "KNOBS", "SOURCES")  # what a drafter module must define

_entries: list[Method] = []
_by_name: dict[str, Method] = {}
_labels: dict[str, str] = {"ar": "Autoregressive"}  # ar: plain decoding, no drafter
_modules: dict[str, ModuleType] = {}


class _LiveTuple(Sequence):
    """A read-only view that reads as the tuple `make()` returns now (iteration, indexing, `in`, `+`, ==)."""

    def __init__(self, make: Callable[[], tuple]):
        self._make = make

    def __getitem__(self, index):
        return self._make()[index]

    def __len__(self) -> int:
        return len(self._make())

    def __iter__(self) -> Iterator:
        return iter(self._make())

    def __add__(self, other) -> tuple:
        return self._make() + tuple(other)

    def __radd__(self, other) -> tuple:
        return tuple(other) + self._make()

    def __eq__(self, other) -> bool:
        return self._make() == (tuple(other) if isinstance(other, (_LiveTuple, tuple, list)) else other)

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self._make())


REGISTRY: Sequence[Method] = _LiveTuple(lambda: tuple(_entries))
METHODS: Sequence[str] = _LiveTuple(lambda: ("ar",) + tuple(m.name for m in _entries))
BY_NAME = MappingProxyType(_by_name)
LABELS = MappingProxyType(_labels)


def register(method: Method) -> None:
    """Add a drafter to the registry (after the others); its module is imported on first use."""
    if method.name in _by_name or method.name == "ar":
        raise ValueError(f"A method named '{method.name}' is already registered.")
    if not method.name or method.name != method.name.strip().lower():
        raise ValueError(f"Method names are lower-case words, got '{method.name}'.")
    _entries.append(method)
    _by_name[method.name] = method
    _labels[method.name] = method.label


def unregister(name: str) -> None:
    """Remove a registered drafter (tests register toy ones); the request default cannot go."""
    if name == DEFAULT_METHOD:
        raise ValueError(f"'{name}' is the default method and stays registered.")
    method = _by_name.pop(name)
    _entries.remove(method)
    del _labels[name]
    _modules.pop(name, None)


for _method in BUILT_IN:
    register(_method)


def by_default_rank() -> tuple[str, ...]:
    """Method names, lowest `default_rank` first: the page selects the first one available on the loaded model."""
    return tuple(m.name for m in sorted(_entries, key=lambda m: m.default_rank))


def module(method: str) -> ModuleType:
    """The drafter module of a registered method, imported by its `Method.module` path and checked once."""
    if method not in _by_name:
        raise ValueError(f"Unknown method '{method}'. Known: {', '.join(METHODS)}.")
    if method not in _modules:
        mod = importlib.import_module(_by_name[method].module)
        missing = [name for name in REQUIRED if not hasattr(mod, name)]
        if missing:
            raise TypeError(f"The drafter module {mod.__name__} lacks {', '.join(missing)} (see drafters/contract.py).")
        _modules[method] = mod
    return _modules[method]


def options(method: str) -> tuple[Option, ...]:
    return tuple(module(method).OPTIONS)


def knobs(method: str) -> tuple[Knob, ...]:
    return tuple(module(method).KNOBS)


def all_knobs() -> tuple[Knob, ...]:
    """Every method's knobs in registry order (the page's sliders, in the order its handler reads them)."""
    return tuple(k for m in _entries for k in knobs(m.name))


def sources(method: str) -> tuple[DraftSource, ...]:
    """Every source a method's draft nodes can carry."""
    return tuple(module(method).SOURCES)


def all_sources() -> dict[str, DraftSource]:
    """Every registered method's sources by name, each once, in registry order (the page's legend and colours)."""
    out: dict[str, DraftSource] = {}
    for m in _entries:
        for source in sources(m.name):
            out.setdefault(source.name, source)
    return out


def check_options(method: str, values: dict) -> dict:
    """`values` checked against the method's declared options: former names are renamed (with a
    DeprecationWarning), unknown names and values out of range raise a ValueError that lists what is allowed; the
    result holds the values as `make` takes them, under their current names."""
    if method == "ar":
        if values:
            raise ValueError("Autoregressive decoding takes no options.")
        return {}
    declared = options(method)
    values = renamed_options(declared, values, _labels[method])
    by_name = {o.name: o for o in declared}
    unknown = [name for name in values if name not in by_name]
    if unknown:
        listing = "; ".join(f"{o.name} ({o.allowed()})" for o in declared)
        raise ValueError(f"{_labels[method]} has no option {', '.join(map(repr, unknown))}. Its options: {listing}.")
    try:
        return {name: by_name[name].check(v) for name, v in values.items()}
    except ValueError as exc:
        raise ValueError(f"{_labels[method]}: {exc}") from None


def note(method: str, target: Target) -> str | None:
    fn = getattr(module(method), "note", None)
    return fn(target) if fn else None


def build_drafter(method: str, target: Target, checked: dict) -> Drafter | None:
    """A fresh drafter for `method` on `target` (None for plain AR) from options that `check_options` already
    checked (the request edge): they are not checked again."""
    method = method.lower().strip()
    if method == "ar":
        return None
    return module(method).make(target, **checked)


def make_drafter(method: str, target: Target, **values) -> Drafter | None:
    """A fresh drafter for `method` on `target` (None for plain AR), its options checked against its declarations:
    the path for callers that have not checked them (bench, CLI, scripts)."""
    method = method.lower().strip()
    return build_drafter(method, target, check_options(method, values))


def unavailable_reason(method: str, target: Target) -> str | None:
    """Why `method` cannot run on `target` (with the command that fixes it), or None."""
    method = method.lower().strip()
    if method == "ar":
        return None
    return module(method).unavailable_reason(target)


def load_artifacts(target: Target) -> None:
    """Build each method available on `target` once with its defaults, so what it keeps per model (a datastore, heads,
    an adapter: Target.artifacts) loads with the model and not inside the first request that races it.  A drafter
    that fails here is left to fail, with its message, where a request builds it."""
    for method in (m.name for m in _entries):
        try:
            if unavailable_reason(method, target) is None:
                make_drafter(method, target)
        except Exception:  # noqa: BLE001 — loading the model must not depend on one drafter's artifact
            continue
