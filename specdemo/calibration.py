"""From a drafter's raw confidence to the probability that a draft node is accepted.

Drafters already rank their nodes by a confidence of their own: S4C by the heads' path probability, REST by the
retrieved continuations' (smoothed) share, SDSAT by the probes' path probability.  To decide how many nodes a step
should send (budget.cut_to_cost), a rank is not enough: the decision weighs the expected accepted tokens, sum of
P(node accepted), against the measured cost of verifying them, so the confidences must be probabilities.  Raw ones
are not: the heads are over-confident on prose and under-confident on code, a lone retrieved continuation is right
far less often than its share says, and sampling accepts less than greedy decoding.

A calibration is a monotone map per (method, decoding mode, node source, depth) fitted by isotonic regression on
what actually happened to every node of uncut trees on *training* prompts (`python -m specdemo calibrate`, in
calibrate.py), never on the evaluation sets.  It ships as one small JSON per model.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from specdemo import ASSETS as PACKAGE_ASSETS

ASSETS = PACKAGE_ASSETS / "calibration"
FORMAT = "specdemo-calibration"
MAX_DEPTH = 4  # depths past this share one table: few nodes get there
MIN_BIN = 40  # nodes per score bin before the isotonic fit: keeps a bin's rate from being one lucky run
# Node sources renamed since calibrations were fitted (old name -> current): a table fitted under the old name is the
# same nodes' table, so it serves the current name.  (Prompt lookup's grafts were "context" before every drafter
# named them "prompt".)
RENAMED_SOURCES = {"context": "prompt"}


def default_path(model_name: str) -> Path:
    return ASSETS / f"{model_name}.json"


def table_key(source: str | None, depth: int) -> str:
    source = RENAMED_SOURCES.get(source, source)
    return f"{source or 'draft'}|{min(int(depth), MAX_DEPTH)}"


def _current_tables(tables: dict[str, dict]) -> dict[str, dict]:
    """`tables` keyed by current source names; a table stored under both names keeps the current name's."""
    out = {key: t for key, t in tables.items() if key.split("|")[0] not in RENAMED_SOURCES}
    for key, t in tables.items():
        source, _, depth = key.partition("|")
        if source in RENAMED_SOURCES:
            out.setdefault(f"{RENAMED_SOURCES[source]}|{depth}", t)
    return out


def isotonic(x: np.ndarray, y: np.ndarray, min_bin: int = MIN_BIN) -> tuple[list[float], list[float]]:
    """Knots (score, rate) of the non-decreasing fit of outcomes y (0/1) against scores x: scores are pooled into bins
    of >= min_bin nodes, then adjacent violators are merged (weighted by nodes), as isotonic regression does."""
    order = np.argsort(x, kind="stable")
    x, y = np.asarray(x, float)[order], np.asarray(y, float)[order]
    blocks = []  # [sum of x, sum of y, count]
    for s in range(0, len(x), min_bin):
        xs, ys = x[s : s + min_bin], y[s : s + min_bin]
        if blocks and len(xs) < min_bin:  # a short last bin joins its neighbour
            blocks[-1] = [blocks[-1][0] + xs.sum(), blocks[-1][1] + ys.sum(), blocks[-1][2] + len(xs)]
        else:
            blocks.append([xs.sum(), ys.sum(), len(xs)])
    merged: list[list[float]] = []
    for b in blocks:
        merged.append(list(b))
        # merge adjacent violators, and bins of one tied score (a score must map to one rate)
        while len(merged) > 1 and (merged[-2][1] / merged[-2][2] >= merged[-1][1] / merged[-1][2]
                                   or merged[-2][0] / merged[-2][2] >= merged[-1][0] / merged[-1][2]):
            top = merged.pop()
            merged[-1] = [merged[-1][i] + top[i] for i in range(3)]
    return [round(b[0] / b[2], 6) for b in merged], [round(b[1] / b[2], 6) for b in merged]


def fit(rows: list[tuple[str, int, float, bool]]) -> dict[str, dict]:
    """{table key: {"x", "y", "n"}} from (source, depth, raw score, accepted) rows of one method and mode."""
    by_key: dict[str, list[tuple[float, bool]]] = {}
    for source, depth, score, ok in rows:
        by_key.setdefault(table_key(source, depth), []).append((score, ok))
    out = {}
    for key, pts in sorted(by_key.items()):
        xs, ys = isotonic(np.array([p[0] for p in pts]), np.array([p[1] for p in pts], dtype=float))
        out[key] = {"x": xs, "y": ys, "n": len(pts)}
    return out


@dataclass
class Calibrator:
    """Maps a method's raw node scores to acceptance probabilities (one decoding mode)."""

    tables: dict[str, dict]

    def __post_init__(self) -> None:
        self.tables = _current_tables(self.tables)
        # the knots as arrays once: drafters call this a few times per step, and np.interp would convert the
        # lists on every call
        self._knots = {key: (np.asarray(t["x"], float), np.asarray(t["y"], float)) for key, t in self.tables.items()}

    def __call__(self, sources: list[str | None], depths: list[int], scores: list[float]) -> list[float]:
        """Each score through its (source, depth) table; a score without a table stays as it is.  One np.interp
        per table, not per score."""
        out = [float(s) for s in scores]
        groups: dict[str, list[int]] = {}
        for i, (src, d) in enumerate(zip(sources, depths)):
            groups.setdefault(table_key(src, d), []).append(i)
        for key, idx in groups.items():
            knots = self._knots.get(key)
            if knots is not None:
                for i, p in zip(idx, np.interp([out[i] for i in idx], *knots).tolist()):
                    out[i] = p
        return out

    def apply(self, tree):
        """The DraftTree with its raw scores replaced by acceptance probabilities (probe nodes: 0, never accepted)."""
        if not len(tree):
            return tree
        probs = self(tree.sources or [None] * len(tree), tree.depths(), tree.scores)
        return replace(tree, scores=[0.0 if tree.is_probe(i) else p for i, p in enumerate(probs)])


def available(target, method: str) -> bool:
    """Whether the model ships a greedy calibration for `method` (the drafters' default for `dynamic`)."""
    return load(target.name, target.identity, method, sampling=False) is not None


def load(model_name: str, identity: str, method: str, sampling: bool, path: Path | None = None) -> Calibrator | None:
    """The shipped calibration of `method` for this model and decoding mode, or None (no file, another tokenizer,
    no table for the method): the drafter then uses its raw scores and its fixed node budget."""
    path = Path(path or default_path(model_name))
    try:
        data = _read(str(path), path.stat().st_mtime_ns)
    except (OSError, ValueError):
        return None
    if data.get("format") != FORMAT or data.get("tokenizer") != identity:
        return None
    tables = data.get("tables", {}).get("sampling" if sampling else "greedy", {}).get(method)
    return Calibrator(tables) if tables else None


@lru_cache(maxsize=8)
def _read(path: str, mtime_ns: int) -> dict:
    """A calibration file's JSON, read once per version of the file (drafters load it at every request's start)."""
    return json.loads(Path(path).read_text())
