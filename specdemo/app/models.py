"""The app's loaded models, and which methods can run on each.

Loading is the slow part and memory the limit, so the few most recently used targets stay loaded; what a drafter
loads for a model (heads, adapters, datastores) lives on its Target, so dropping the target frees all of it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from specdemo.app.clocks import model_thread
from specdemo.app.public import check_model
from specdemo.budget import measure_cost_curves
from specdemo.precision import join_spec, split_spec
from specdemo.drafters import LABELS, REGISTRY, load_artifacts, note, unavailable_reason
from specdemo.target import ModelLoadError, Target, UnsupportedForTree, load_target


def model_name(name: str | None) -> str:
    """A model field as the cache keys it: stripped, empty meaning the embedded model, "@fp32" dropped."""
    return join_spec(*split_spec(name))


class ModelCache:
    """Loaded targets by name, the most recent few kept."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._targets: OrderedDict[str, Target] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return model_name(name) in self._targets

    def get(self, name: str) -> Target:
        """The loaded target `name` (loading it on the model thread, like all model work)."""
        return model_thread.call(self._get, model_name(name))

    def _get(self, name: str) -> Target:
        with self._lock:
            if name in self._targets:
                self._targets.move_to_end(name)
                return self._targets[name]
            self._make_room()
            target = _load(name)
            _prepare(target)
            self._targets[name] = target
            return target

    def put(self, name: str, target: Target) -> None:
        """Share an already loaded target (tests, or a host app that loaded it)."""
        model_thread.call(self._put, name, target)

    def _put(self, name: str, target: Target) -> None:
        with self._lock:
            if name not in self._targets:
                self._make_room()
            _prepare(target)
            self._targets[name] = target

    def _make_room(self) -> None:
        """Drop the least recently used targets until one more fits."""
        while len(self._targets) >= self.keep:
            self._targets.popitem(last=False)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def _load(name: str) -> Target:
    """Load `name`; any failure, also one halfway through (a broken download, a full disk, a model without tree
    support), becomes a ModelLoadError that names the model and what went wrong, and nothing is cached."""
    base, precision = split_spec(name)
    try:
        return load_target(base, precision=precision)
    except (ModelLoadError, UnsupportedForTree):
        raise
    except Exception as exc:  # noqa: BLE001 — the page shows the message and keeps serving
        raise ModelLoadError(f"Loading {name} failed: {type(exc).__name__}: {str(exc)[:300]}") from exc


def _prepare(target: Target) -> None:
    """What a loaded model needs before its first race, done once here and not inside a request: its verification
    cost curves (a race's first step would measure them) and what each available drafter keeps on it."""
    measure_cost_curves(target)
    load_artifacts(target)


MODELS = ModelCache()


def load_model(name: str) -> Target:
    """The model `name`, from the cache or loaded; the public mode's rules are checked before anything is fetched."""
    if name not in MODELS:
        check_model(split_spec(name)[0])
    return MODELS.get(name)


def availability(target: Target) -> dict[str, str | None]:
    """Per method: None when usable on this model, else the reason (with the command that fixes it); and under
    "METHOD:note" anything the drafter wants said about this model."""
    out = {}
    for m in (m.name for m in REGISTRY):
        try:
            out[m] = unavailable_reason(m, target)
        except Exception as exc:  # a half-written drafter module must not take the page down
            out[m] = f"{LABELS.get(m, m)} failed to report its status: {type(exc).__name__}: {exc}"
        if (text := note(m, target)) is not None:
            out[f"{m}:note"] = text
    return out
