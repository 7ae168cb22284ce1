"""Gradio entry point (Hugging Face Spaces runs `python app.py`; locally: `make run` or `python app.py`).

Host and port come from GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (Gradio reads them itself; defaults 127.0.0.1:7860).
REST's default datastore is built here, before the server starts, when the set-up has not built it yet (a Space has
no `make setup`): offline work never runs inside a request.
"""
from specdemo.app.models import MODELS
from specdemo.app.page import build_demo, launch_kwargs
from specdemo.offline.build_datastore import ensure_default
from specdemo.target import EMBEDDED

ensure_default(MODELS.get(EMBEDDED))  # a no-op when current
demo = build_demo()

if __name__ == "__main__":
    demo.launch(**launch_kwargs())
