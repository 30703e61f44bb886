"""ASGI middleware: refuse a request body over the size limit (413) or not complete in time (408), as it arrives.

Why not FastAPI's `await request.body()`: that reads the whole body first, so a chunked 300 MiB upload (no
Content-Length) took 450 MB of server memory before the 413. Here a declared Content-Length over the limit
is refused before any byte is read, and a chunked body is counted chunk by chunk and refused at the first
byte over the limit; a body within the limit is buffered (at most the limit) and replayed to the app.

Why a deadline: a client that sends its body slowly (one byte a second, or a Content-Length of 1000 and then 10
bytes and silence) held its connection and its buffer for as long as it liked; uvicorn bounds the wait for the
next request on a kept-alive connection, not the wait for a body. The whole body must arrive within
`timeout_s` of the request's headers (10 s by default: 1 MiB at 100 kB/s), else the answer is 408 and the
connection is closed. (uvicorn has no such limit for the headers either; see the README's service section.)
"""

from __future__ import annotations

import asyncio
import json

Scope = dict
Message = dict


class Refusal(Exception):
    """A request answered by the middleware itself: its status and one-line detail."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class BodyLimit:
    """Wrap an ASGI app so that no HTTP request body over `max_bytes` (413), or slower than `timeout_s` in all
    (408), reaches it."""

    def __init__(self, app, max_bytes: int, timeout_s: float = 10.0):
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await asyncio.wait_for(self._read(scope, receive), timeout=self.timeout_s)
        except Refusal as refusal:
            await _reply(send, refusal.status, refusal.detail)
            return
        except asyncio.TimeoutError:
            await _reply(send, 408, f"the request body was not complete within {self.timeout_s:g} s of its headers "
                                    f"(the service's body time limit): send the whole body at once, then retry")
            return
        if body is None:  # the client went away
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive) -> bytes | None:
        """The whole body (None if the client disconnected first); Refusal when it is over the size limit."""
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                raise Refusal(400, "Content-Length is not a number")
            if int(declared) > self.max_bytes:
                raise Refusal(413, f"request body of {int(declared)} bytes exceeds the {self.max_bytes}-byte limit")
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                raise Refusal(413, f"request body exceeds the {self.max_bytes}-byte limit")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _reply(send, status: int, detail: str) -> None:
    payload = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})
