"""All of the app's model work on one long-lived thread: loads, cost curves, every race step, benchmarks.

torch's CPU build parallelises an op with GNU OpenMP, which keeps one team of worker threads per thread that calls
into it, for as long as that thread lives.  While the threads it manages outnumber the cores, its workers stop
spinning between ops and sleep at once instead (libgomp's "throttled" spin count), so every op of every step pays for
futex wake-ups.  A server that loads its model on the main thread and runs each race step on whichever worker thread
Gradio picks has two teams or more: on the 2-core machine its AR decoded ~25% slower than the bench's, which calls
torch from one thread only (perf sched: the decoding threads switched ~7,000 times a second against ~130, and the
cores sat idle a third of the time in between).  One thread for all of it keeps one team, as in the bench.
"""
from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")
NAME = "specdemo-model"

_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=NAME)  # its one worker lives as long as the app
_END = object()


def on_model_thread() -> bool:
    return threading.current_thread().name.startswith(NAME)


def call(fn: Callable[..., T], *args, **kwargs) -> T:
    """`fn(*args, **kwargs)` on the model thread, waiting for it (inline when already there, so nesting is safe).
    The caller's context variables go along (Gradio's progress tracking reads them)."""
    if on_model_thread():
        return fn(*args, **kwargs)
    return _executor.submit(contextvars.copy_context().run, fn, *args, **kwargs).result()


def iterate(make: Callable[[], Iterator[T]]) -> Iterator[T]:
    """The iterator `make()` returns, made and advanced on the model thread, one item per hand-off; closing this one
    (a stopped race, a watcher gone) closes it there too."""
    it = call(make)
    try:
        while (item := call(next, it, _END)) is not _END:
            yield item
    finally:
        if hasattr(it, "close"):
            call(it.close)
