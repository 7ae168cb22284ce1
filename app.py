"""Gradio entry point (Hugging Face Spaces runs `python app.py`; locally: `make run` or `python app.py`).

Host and port come from GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (Gradio reads them itself; defaults 127.0.0.1:7860).
"""
from specdemo.app.page import build_demo, launch_kwargs

demo = build_demo()

if __name__ == "__main__":
    demo.launch(**launch_kwargs())
