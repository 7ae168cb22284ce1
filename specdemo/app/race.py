"""The honest race between two decoders, and the bookkeeping the UI shows. Pure logic: no Gradio, no model code.

Both runs are `engine.generate()` generators in ONE process.  Wall-clock time would be shared between them, so each
run is charged only its own compute (the sum of its steps' `draft_s + verify_s`, which the engine measures around
device-synchronised work), and the scheduler always advances the run that has used the least of it.  At any moment
both runs have spent about the same compute, so the text on screen grows in proportion to each decoder's real speed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol


class Event(Protocol):
    """What the race reads from an engine StepEvent (kept structural so tests can use light fakes)."""

    step: int
    tokens: list[int]
    from_draft: list[bool]
    sources: list[str | None]
    draft_s: float
    verify_s: float
    finish_reason: str | None


@dataclass
class Run:
    """Everything one decoder has done so far."""

    name: str
    events: list = field(default_factory=list)
    compute_s: float = 0.0
    done: bool = False
    curve: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 0)])  # (compute_s, tokens) after each step

    def add(self, event: Event) -> None:
        self.events.append(event)
        self.compute_s += event.draft_s + event.verify_s
        self.curve.append((self.compute_s, self.n_tokens))
        if event.finish_reason is not None:
            self.done = True

    @property
    def tokens(self) -> list[int]:
        return [t for e in self.events for t in e.tokens]

    @property
    def n_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.events)

    @property
    def forwards(self) -> int:
        """Target forward passes: one per step."""
        return len(self.events)

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.compute_s if self.compute_s > 0 else 0.0

    @property
    def tau(self) -> float:
        """Tokens per target forward (Spec-Bench's mean accepted length, bonus token counted; AR = 1)."""
        return self.n_tokens / self.forwards if self.forwards else 0.0

    @property
    def accept_lengths(self) -> list[int]:
        return [len(e.tokens) for e in self.events]

    @property
    def finish_reason(self) -> str | None:
        return self.events[-1].finish_reason if self.events else None


class Race:
    """Interleave named step generators; always advance the unfinished run with the least compute so far.

    Iterating yields `(name, event)`.  Ties go to the run named first.  A generator that ends without a finished
    event (the caller stopped it, or it was empty) simply drops out.  Exceptions from a generator propagate.
    """

    def __init__(self, generators: dict[str, Iterator]):
        self.generators = dict(generators)
        self.runs = {name: Run(name) for name in self.generators}

    def next_name(self) -> str | None:
        live = [r for r in self.runs.values() if not r.done]
        return min(live, key=lambda r: r.compute_s).name if live else None  # min() keeps the first of equals

    def advance(self) -> tuple[str, Event] | None:
        """One step of whichever run is behind; None when every run is done."""
        name = self.next_name()
        if name is None:
            return None
        run = self.runs[name]
        try:
            event = next(self.generators[name])
        except StopIteration:
            run.done = True
            return self.advance()
        run.add(event)
        return name, event

    def __iter__(self) -> Iterator[tuple[str, Event]]:
        try:
            while (item := self.advance()) is not None:
                yield item
        finally:
            self.close()

    def close(self) -> None:
        for gen in self.generators.values():
            close = getattr(gen, "close", None)
            if close:
                close()

    @property
    def finished(self) -> bool:
        return all(r.done for r in self.runs.values())


@dataclass
class Summary:
    """The end-of-race readout: the speculative run against the baseline, both measured here and now."""

    speedup: float | None  # spec tokens/s ÷ baseline tokens/s
    tau: float  # spec tokens per target forward
    forwards: int  # spec target forwards
    baseline_forwards: int
    identical: bool  # token lists equal (over the common prefix while a run is unfinished)
    complete: bool  # both runs reached their end
    first_difference: int | None  # index of the first differing token, if any

    @property
    def forwards_saved(self) -> int:
        return self.baseline_forwards - self.forwards


def summarize(baseline: Run, spec: Run) -> Summary:
    a, b = baseline.tokens, spec.tokens
    n = min(len(a), len(b))
    diff = next((i for i in range(n) if a[i] != b[i]), None)
    complete = baseline.done and spec.done
    if diff is None and complete and len(a) != len(b):
        diff = n
    speedup = spec.tokens_per_s / baseline.tokens_per_s if baseline.tokens_per_s and spec.tokens_per_s else None
    return Summary(speedup, spec.tau, spec.forwards, baseline.forwards, diff is None, complete, diff)


@dataclass
class Piece:
    """The text one committed token added, and where that token came from."""

    text: str
    step: int
    from_draft: bool
    source: str | None


class TextBuilder:
    """Turns committed token ids into per-token text pieces that always concatenate to `decode(all ids)`.

    Decoding tokens one by one breaks multi-byte characters and merged pieces, so this decodes the cumulative ids and
    diffs the text: a token that ends inside an incomplete UTF-8 character adds nothing until the character is
    complete (it is then credited to the token that completes it); if decoding rewrites earlier text (tokenizer clean-up
    rules), earlier pieces are trimmed to the common prefix.
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.pieces: list[Piece] = []
        self.text = ""

    def add(self, tokens: list[int], step: int, from_draft: list[bool], sources: list[str | None]) -> None:
        for tok, fd, src in zip(tokens, from_draft, sources):
            self.ids.append(tok)
            full = self.decode(self.ids)
            if full.endswith("\ufffd"):  # an incomplete character: wait for the bytes that finish it
                self.pieces.append(Piece("", step, fd, src))
                continue
            keep = len(self.text) if full.startswith(self.text) else _common_prefix(self.text, full)
            if keep < len(self.text):
                self._trim(keep)
            self.pieces.append(Piece(full[keep:], step, fd, src))
            self.text = full

    def _trim(self, length: int) -> None:
        total = len(self.text)
        for piece in reversed(self.pieces):
            if total <= length:
                break
            cut = min(len(piece.text), total - length)
            piece.text = piece.text[: len(piece.text) - cut]
            total -= cut
        self.text = self.text[:length]

    def groups(self) -> list[Piece]:
        return self.groups_of(self.pieces)

    @staticmethod
    def groups_of(pieces: list[Piece]) -> list[Piece]:
        """Adjacent pieces of the same step and kind merged (one highlighted span per step's accepted drafts)."""
        out: list[Piece] = []
        for p in pieces:
            if out and out[-1].step == p.step and out[-1].from_draft == p.from_draft:
                last = out[-1]
                out[-1] = Piece(last.text + p.text, last.step, last.from_draft, last.source or p.source)
            else:
                out.append(Piece(p.text, p.step, p.from_draft, p.source))
        return out


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
