"""Gradio's queue, told to poll less often: left as it is, its idle loops wake the server about 900 times a second.

Gradio 6's Queue looks for an event to start every 1 ms while it has none to start (`sleep_when_free`; 50 ms on
Windows), also during a race, when the model's slot is taken, and for progress updates every 10 ms.  On the 2-core
machine the race is timed on, each wake-up takes a core from one of torch's two threads in the middle of a step, and a
step waits for its slowest thread: AR steps in the app's process ran about 8% slower with the 1 ms poll than with a
50 ms one, and about 5% slower again than with a 0.5 s one (alternated on one launched app, docs/benchmarks.md).

So the queue polls every 50 ms (a click starts at most that much later, which nobody sees) and, while model work
(a race, a bench, a model load) holds the app's gate, every 0.5 s: no other model work can start then anyway (it waits
at the gate, or is refused with a message, at most half a second later).  Progress bars (datastore builds) update ten
times a second.
"""
from __future__ import annotations

import threading
from importlib.metadata import version
from typing import Any

POLL_S = 0.05  # Queue.sleep_when_free: the wait between two looks for an event to start
RACING_POLL_S = 0.5  # the same while model work holds the gate
PROGRESS_POLL_S = 0.1  # Queue.progress_update_sleep_when_free: the wait between two looks for progress to send
_NAMES = ("sleep_when_free", "progress_update_sleep_when_free")

_queues: list = []  # the queues quiet() has set (one per built demo; tests build several)
_held = False  # model work holds the gate (one gate per process: session.GATE)
_lock = threading.Lock()


def quiet(demo: Any) -> Any:
    """Slow the polling of a gr.Blocks `demo`'s queue; call after `demo.queue(...)`, which makes a new one.  (Typed
    Any: only the page imports gradio.)  Fails loudly if a Gradio upgrade renames what it sets, rather than silently
    polling a thousand times a second again."""
    queue = demo._queue
    for name in _NAMES:
        if not isinstance(getattr(queue, name, None), float):
            raise RuntimeError(f"gradio {version('gradio')}: Queue.{name} is gone; "
                               "see specdemo/app/clocks/quiet_queue.py")
    with _lock:
        _queues.append(queue)
        _set(queue)
    return demo


def _set(queue) -> None:
    queue.sleep_when_free = RACING_POLL_S if _held else POLL_S
    queue.progress_update_sleep_when_free = PROGRESS_POLL_S


def hold(busy: bool) -> None:
    """The gate's `on_hold`: model work took it (True) or let it go (False)."""
    global _held
    with _lock:
        _held = busy
        for queue in _queues:
            _set(queue)
