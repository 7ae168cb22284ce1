"""Serve the page with `assets/calm_trackers.js` inline at the top of <head>, so it runs before Gradio's modules.

The script slows Gradio's status-tracker frame loop, which otherwise keeps an idle page drawing 60 frames a second
on the cores the race is timed on.  Gradio captures `requestAnimationFrame` when its modules load, and its `head`
and `js` options run later, so the script has to be in the HTML itself: this ASGI middleware adds it to the page's
HTML response (only that one; everything else passes through untouched).
"""
from __future__ import annotations

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specdemo import ASSETS

SCRIPT = b"<script>" + (ASSETS / "calm_trackers.js").read_bytes() + b"</script>"


class CalmTrackers:
    """Insert SCRIPT right after <head> in the HTML page Gradio serves at its root."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"].rstrip("/") != "":
            await self.app(scope, receive, send)
            return
        start: Message = {}
        chunks: list[bytes] = []

        async def send_with_script(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            body = b"".join(chunks)
            html = any(k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in headers)
            encoded = any(k.lower() == b"content-encoding" for k, _ in headers)
            if html and not encoded:
                body = body.replace(b"<head>", b"<head>" + SCRIPT, 1)
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_with_script)


def middleware() -> list[Middleware]:
    """For `launch(app_kwargs={"middleware": ...})`."""
    return [Middleware(CalmTrackers)]
