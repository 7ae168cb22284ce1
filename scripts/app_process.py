"""The app in its own process on a free loopback port, for the scripts that measure it from outside."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def app_process(env: dict | None = None, start_timeout: float = 600) -> Iterator[tuple[str, subprocess.Popen]]:
    """(url, process) of `python app.py` once it accepts connections; terminated on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    full_env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port), **(env or {})}
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=full_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + start_timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"the app did not start (exit code {proc.poll()})") from None
                time.sleep(1)
        yield f"http://127.0.0.1:{port}/", proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
