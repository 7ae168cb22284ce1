"""The browser's word that it has drawn an update, for a race watched from the machine that runs it.

On one machine the browser's drawing (parsing the panes' HTML, layout, paint, the charts' rendering) shares the cores
with the decoding steps being timed: each step it overlaps runs slower, and the plain run, with more steps, pays more
often.  So after each update the page's race waits for the page's acknowledgement (`assets/drawn.js` sends it once
the update is painted and the browser is idle, and for an update that redraws the charts once every shown chart has
its marks: the first such update loads the charting module, during which the page looks idle) before the next step.
The wait is wall time charged to neither run; the summary shows it as the page's share.  A page that does not answer
(a background tab, a script) is waited for once, then no more for that race.
"""
from __future__ import annotations

import ipaddress
import secrets
import threading
import time

ACK_TIMEOUT = 2.0  # seconds to wait for one acknowledgement; a page that misses it is not waited for again
# After an acknowledgement the browser is not quite done: it still handles the acknowledgement's own request and
# response and composites its last frame (about 30 ms of CPU on the 2-core dev machine, most of it in the first
# 100 ms).  The race waits this much longer, so that work does not land on the next timed step either.
SETTLE_S = 0.1
MAX_PENDING = 4096  # tokens held for updates not yet waited on (a bound: a race waits on each token it hands out)


class DrawnUpdates:
    """Tokens handed out with updates and set when the page reports them drawn (thread-safe)."""

    def __init__(self) -> None:
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def expect(self) -> str:
        """A fresh token for the next update (unguessable: a visitor cannot release someone else's race)."""
        token = secrets.token_hex(8)
        with self._lock:
            if len(self._events) >= MAX_PENDING:
                self._events.pop(next(iter(self._events)))
            self._events[token] = threading.Event()
        return token

    def mark(self, token: str) -> None:
        """The page drew the update that carried `token`; an unknown token is ignored."""
        with self._lock:
            event = self._events.get(str(token))
        if event is not None:
            event.set()

    def wait(self, token: str, timeout: float | None = None) -> bool:
        """True once the update was drawn, False after `timeout` (ACK_TIMEOUT); the token is spent either way."""
        with self._lock:
            event = self._events.get(token)
        drawn = event is not None and event.wait(ACK_TIMEOUT if timeout is None else timeout)
        with self._lock:
            self._events.pop(token, None)
        if drawn:
            time.sleep(SETTLE_S)
        return drawn

    def __len__(self) -> int:
        return len(self._events)


DRAWN = DrawnUpdates()


def mark_drawn(token: str) -> None:
    """The page's acknowledgement endpoint (`/drawn`, unqueued): `token` came with an update it has now painted."""
    DRAWN.mark(token)


def same_machine(host: str | None) -> bool:
    """Whether a client at `host` runs on this machine (loopback), where its drawing competes with the race."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
