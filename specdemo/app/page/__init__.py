"""The page: layout and wiring (layout.py), event handlers (handlers.py), what it offers to start from (examples.py).
The only part of the package that imports gradio."""
from specdemo.app.page.examples import EXAMPLES
from specdemo.app.page.layout import build_demo, launch_kwargs

__all__ = ["EXAMPLES", "build_demo", "launch_kwargs"]
