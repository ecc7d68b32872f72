"""A real uvicorn + Starlette server on 127.0.0.1, in a thread, with the scripted faults of
:mod:`._faults` applied to its routes (status, headers, body, delay, stalls, error events, TCP
resets through the connection's own socket)."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ._faults import Fault, Faults, placed

__all__ = ["HttpWire", "serving", "sse"]


def sse(data: Any, event: str | None = None) -> str:
    """One server-sent event: ``data`` as JSON (a str as it is)."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n"


class HttpWire:
    """A wire server: ``app`` (Starlette) served by uvicorn; ``faults`` scripted per route.

    Subclasses add routes with :meth:`route` and implement them with :meth:`answer` (a plain
    response, the fault applied) and :meth:`stream` (an SSE stream, the fault applied)."""

    error_body: Callable[[int], Any] = staticmethod(lambda status: {"error": {"status": status}})

    def __init__(self) -> None:
        self.faults = Faults()
        self.app = Starlette()
        self.server: uvicorn.Server | None = None
        self.requests: list[dict[str, Any]] = []
        # per stream served, when it ended: "complete" (every scripted event sent) or "closed" (the
        # client went away first: the upstream call was cancelled)
        self.stream_ends: list[str] = []
        self.url = ""

    def route(self, path: str, name: str, handler: Callable[..., Any], methods: list[str]) -> None:
        async def endpoint(request: Request) -> Response:
            body = await request.body()
            payload = json.loads(body) if body else {}
            self.requests.append(
                {
                    "route": name,
                    "headers": dict(request.headers),
                    "query": dict(request.query_params),
                    "json": payload,
                }
            )
            fault = self.faults.take(name)
            return await handler(request, payload, fault)

        self.app.add_route(path, endpoint, methods=methods)

    # -- applying faults ---------------------------------------------------------------------

    async def answer(
        self, request: Request, fault: Fault | None, ok: Any, headers: dict[str, str] | None = None
    ) -> Response:
        """``ok`` (JSON) as the answer, unless ``fault`` changes it."""
        extra = dict(headers or {})
        if fault is not None:
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.reset:
                self.reset(request)
            extra.update(fault.headers)
            if fault.status is not None:
                body = fault.body if fault.body is not None else self.error_body(fault.status)
                return self._response(body, fault.status, extra)
        return self._response(ok, 200, extra)

    def _response(self, body: Any, status: int, headers: dict[str, str]) -> Response:
        if isinstance(body, (bytes, str)):
            return Response(body, status_code=status, headers=headers)
        return Response(json.dumps(body), status_code=status, headers=headers, media_type="application/json")

    async def stream(
        self,
        request: Request,
        fault: Fault | None,
        events: list[str],
        headers: dict[str, str] | None = None,
        *,
        preamble: int = 0,
    ) -> Response:
        """An SSE stream of ``events``, unless ``fault`` changes it (a status instead, a delay
        before the head, a stall, an error event, a reset mid-stream; ``preamble``: the events
        before the first token, for a fault ``after_tokens``)."""
        fault = placed(fault, preamble)
        extra = dict(headers or {})
        if fault is not None:
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.reset and fault.reset_after is None:
                self.reset(request)
            extra.update(fault.headers)
            if fault.status is not None:
                body = fault.body if fault.body is not None else self.error_body(fault.status)
                return self._response(body, fault.status, extra)

        async def chunks() -> AsyncIterator[str]:
            end = "closed"
            try:
                async for event in events_of():
                    yield event
                end = "complete"
            finally:
                self.stream_ends.append(end)

        async def events_of() -> AsyncIterator[str]:
            for i, event in enumerate(events):
                if fault is not None:
                    if fault.stall_after is not None and i == fault.stall_after:
                        await asyncio.sleep(fault.stall_s)
                    if fault.event is not None and i == fault.event_after:
                        yield self.error_event(fault.event)
                        return
                    if fault.reset_after is not None and i == fault.reset_after:
                        await asyncio.sleep(0.05)  # let the events sent so far reach the client
                        self.reset(request)
                        await asyncio.sleep(1.0)
                        return
                yield event
                await asyncio.sleep(0)

        return StreamingResponse(chunks(), media_type="text/event-stream", headers=extra)

    def error_event(self, event: dict[str, Any]) -> str:
        """The SSE event carrying ``event`` (an error mid-stream); subclasses say how."""
        return sse(event)

    def reset(self, request: Request) -> None:
        """Reset the TCP connection of ``request`` (RST, not FIN): SO_LINGER 0, then abort."""
        assert self.server is not None
        client = request.scope.get("client")
        for protocol in list(self.server.server_state.connections):
            if getattr(protocol, "client", None) == tuple(client or ()):
                transport = protocol.transport  # type: ignore[attr-defined]
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                transport.abort()
                return
        raise RuntimeError(f"no connection for {client}")

    # -- running -----------------------------------------------------------------------------

    @contextmanager
    def running(self) -> Iterator[str]:
        """Serve on a free loopback port from a thread; yields the base URL."""
        with serving(self.app) as (url, server):
            self.server = server
            self.url = url
            yield url


@contextmanager
def serving(app: Any, **options: Any) -> Iterator[tuple[str, uvicorn.Server]]:
    """Serve the ASGI ``app`` with uvicorn on a free loopback port from a thread; yields the base
    URL and the server. ``options`` are uvicorn's (they replace these defaults)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings: dict[str, Any] = {"log_level": "critical", "timeout_graceful_shutdown": 1, "lifespan": "off"}
    config = uvicorn.Config(app, loop="asyncio", http="h11", **(settings | options))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(1000):
            if server.started or not thread.is_alive():
                break
            time.sleep(0.01)
        if not server.started:
            raise RuntimeError("uvicorn did not start within 10 s")
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
