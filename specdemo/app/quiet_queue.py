"""Gradio's queue, told to poll less often: left as it is, its idle loops wake the server about 900 times a second.

Gradio 6's Queue looks for new events every 1 ms while it has nothing to start (`sleep_when_free`; 50 ms on Windows),
also during a race, when its one slot is taken, and for progress updates every 10 ms.  On the 2-core machine the race
is timed on, each wake-up takes a core from one of torch's two threads in the middle of a step, and a step waits for
its slowest thread: AR steps in the app's process ran about 8% slower with the 1 ms poll than with a 50 ms one
(alternated on one launched app, docs/benchmarks.md).  A queued event now starts up to 50 ms later, which nobody
sees next to a race; the app's progress bars (datastore builds) update ten times a second.
"""
from __future__ import annotations

import gradio as gr

POLL_S = 0.05  # Queue.sleep_when_free: the wait between two looks for an event to start
PROGRESS_POLL_S = 0.1  # Queue.progress_update_sleep_when_free: the wait between two looks for progress to send


def quiet(demo: gr.Blocks) -> gr.Blocks:
    """Slow the polling of `demo`'s queue (call after `demo.queue(...)`, which makes a new one).  Fails loudly if a
    Gradio upgrade renames what it sets, rather than silently polling a thousand times a second again."""
    queue = demo._queue
    for name, value in (("sleep_when_free", POLL_S), ("progress_update_sleep_when_free", PROGRESS_POLL_S)):
        if not isinstance(getattr(queue, name, None), float):
            raise RuntimeError(f"gradio {gr.__version__}: Queue.{name} is gone; see specdemo/app/quiet_queue.py")
        setattr(queue, name, value)
    return demo
