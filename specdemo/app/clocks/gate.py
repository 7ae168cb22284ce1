"""One piece of model work at a time, first come first served, with a bounded waiting line.

Two races at once on a 2-core machine would each time the other's work, and the honest clocks would lie; so races,
benchmarks and model loads pass through one gate.  At most `max_waiting` requests wait behind the one running; the
next is refused at once with a message (the page and `/race` show it), instead of vanishing in a full queue.
"""
from __future__ import annotations

import itertools
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator


class Busy(Exception):
    """The waiting line is full; the message says so and what to do."""


@dataclass
class Ticket:
    number: int
    joined: float = field(default_factory=time.monotonic)
    started: float | None = None

    @property
    def waited(self) -> float:
        """Seconds between joining the line and starting (so far, while still waiting)."""
        return (self.started or time.monotonic()) - self.joined


class Gate:
    def __init__(self, max_waiting: int, on_hold: Callable[[bool], None] | None = None) -> None:
        """`on_hold(True)` when a piece of work takes the gate, `on_hold(False)` when it lets go (the app slows its
        queue's polling in between: quiet_queue.py)."""
        self.max_waiting = max_waiting
        self.on_hold = on_hold
        self._cond = threading.Condition()
        self._line: list[Ticket] = []  # in arrival order; the head runs (or is about to), the rest wait
        self._running: Ticket | None = None
        self._numbers = itertools.count()

    def join(self) -> Ticket:
        """A place in line, or Busy when `max_waiting` requests already wait."""
        with self._cond:
            if len(self._line) > self.max_waiting:  # the head runs (or is about to); the rest wait, and so would this
                waiting = len(self._line) - 1
                raise Busy(f"The demo is busy: {waiting} requests are already waiting (at most {self.max_waiting}). "
                           f"Please try again in a minute.")
            ticket = Ticket(next(self._numbers))
            self._line.append(ticket)
            return ticket

    def wait(self, ticket: Ticket, timeout: float) -> int:
        """Wait up to `timeout` seconds for `ticket`'s turn; 0 when it has started (it now holds the gate), else how
        many requests are still ahead of it."""
        with self._cond:
            end = time.monotonic() + timeout
            while not (self._running is None and self._line[0] is ticket):
                left = end - time.monotonic()
                if left <= 0:
                    return self._line.index(ticket)
                self._cond.wait(left)
            self._running, ticket.started = ticket, time.monotonic()
            if self.on_hold:
                self.on_hold(True)
            return 0

    def leave(self, ticket: Ticket) -> None:
        """Done (or gone while waiting): the next in line may start."""
        with self._cond:
            if ticket in self._line:
                self._line.remove(ticket)
            if self._running is ticket:
                self._running = None
                if self.on_hold:
                    self.on_hold(False)
            self._cond.notify_all()

    @contextmanager
    def turn(self) -> Iterator[Ticket]:
        """Hold the gate for a block of model work, waiting as long as it takes (Busy when the line is full)."""
        ticket = self.join()
        try:
            while self.wait(ticket, 60.0):
                pass
            yield ticket
        finally:
            self.leave(ticket)

    def waiting(self) -> int:
        with self._cond:
            return max(0, len(self._line) - 1)
