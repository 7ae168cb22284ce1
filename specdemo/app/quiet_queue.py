"""Gradio's queue, told to poll less often: left as it is, its idle loops wake the server about 900 times a second.

Gradio 6's Queue looks for an event to start every 1 ms while it has none to start (`sleep_when_free`; 50 ms on
Windows), also during a race, when the model's slot is taken, and for progress updates every 10 ms.  On the 2-core
machine the race is timed on, each wake-up takes a core from one of torch's two threads in the middle of a step, and a
step waits for its slowest thread: AR steps in the app's process ran about 8% slower with the 1 ms poll than with a
50 ms one, and about 5% slower again than with a 0.5 s one (alternated on one launched app, docs/benchmarks.md).

So the queue polls every 50 ms (a click starts at most that much later, which nobody sees) and, while a race or a
bench runs, every 0.5 s: no other model work can start then anyway (it waits at the gate, or is refused with a
message, at most half a second later).  Progress bars (datastore builds) update ten times a second.
"""
from __future__ import annotations

import functools
import inspect
import threading
from contextlib import contextmanager
from importlib.metadata import version
from typing import Any, Callable, Iterator

POLL_S = 0.05  # Queue.sleep_when_free: the wait between two looks for an event to start
RACING_POLL_S = 0.5  # the same while a race or a bench runs
PROGRESS_POLL_S = 0.1  # Queue.progress_update_sleep_when_free: the wait between two looks for progress to send
_NAMES = ("sleep_when_free", "progress_update_sleep_when_free")

_queues: list = []  # the queues quiet() has set (one per built demo; tests build several)
_racing = 0  # races and benches running now, over all demos of this process
_lock = threading.Lock()


def quiet(demo: Any) -> Any:
    """Slow the polling of a gr.Blocks `demo`'s queue; call after `demo.queue(...)`, which makes a new one.  (Typed
    Any: only the page imports gradio.)  Fails loudly if a Gradio upgrade renames what it sets, rather than silently
    polling a thousand times a second again."""
    queue = demo._queue
    for name in _NAMES:
        if not isinstance(getattr(queue, name, None), float):
            raise RuntimeError(f"gradio {version('gradio')}: Queue.{name} is gone; see specdemo/app/quiet_queue.py")
    with _lock:
        _queues.append(queue)
        _set(queue)
    return demo


def _set(queue) -> None:
    queue.sleep_when_free = RACING_POLL_S if _racing else POLL_S
    queue.progress_update_sleep_when_free = PROGRESS_POLL_S


@contextmanager
def racing() -> Iterator[None]:
    """The queues poll every RACING_POLL_S while the block runs (nested and concurrent uses count)."""
    global _racing
    with _lock:
        _racing += 1
        for queue in _queues:
            _set(queue)
    try:
        yield
    finally:
        with _lock:
            _racing -= 1
            for queue in _queues:
                _set(queue)


def while_racing(fn: Callable) -> Callable:
    """`fn` (a generator function, as the race handlers are, or a plain one) run inside `racing()`; its name,
    signature and type hints are kept, so Gradio builds the same API from it."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def wrapped_gen(*args, **kwargs):
            with racing():
                yield from fn(*args, **kwargs)
        return wrapped_gen

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with racing():
            return fn(*args, **kwargs)
    return wrapped
