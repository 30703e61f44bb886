"""ASGI middleware: refuse a request body over the limit (413) as it arrives, without reading the rest.

Why not FastAPI's `await request.body()`: that reads the whole body first, so a chunked 300 MiB upload (no
Content-Length) took 450 MB of server memory before the 413. Here a declared Content-Length over the limit
is refused before any byte is read, and a chunked body is counted chunk by chunk and refused at the first
byte over the limit; a body within the limit is buffered (at most the limit) and replayed to the app.
"""

from __future__ import annotations

import json

Scope = dict
Message = dict


class BodyLimit:
    """Wrap an ASGI app so that no HTTP request body over `max_bytes` reaches it (413 instead)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _reply(send, 400, "Content-Length is not a number")
                return
            if int(declared) > self.max_bytes:
                await _reply(send, 413, f"request body of {int(declared)} bytes exceeds the {self.max_bytes}-byte limit")
                return
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await _reply(send, 413, f"request body exceeds the {self.max_bytes}-byte limit")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _reply(send, status: int, detail: str) -> None:
    payload = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})
