"""The apps behind both front doors for the tests of what a 504 / DEADLINE_EXCEEDED tells of the
request's deadline: ``run(mode)`` (an async function of the test) is what a call does, and what a
stream does after its first item."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import httpx
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from grpc import aio
from grpc_helpers import serving_methods

import ragguard
from ragguard.asgi import RagguardMiddleware
from ragguard.grpc import GuardServerInterceptor

Run = Callable[[str], Awaitable[None]]

WORDS = {"tenant": "the tenant's timeout_s", "client": "the client", "handler": "the handler"}
"""How a detail says what set the deadline."""


def http_app(guard: ragguard.Guard, run: Run) -> Any:
    """``/call/{mode}`` runs ``mode`` and answers ``{}``; ``/stream/{mode}`` sends an SSE event
    ``first``, runs ``mode``, then ``[DONE]``."""
    app = FastAPI()

    @app.get("/call/{mode}")
    async def call(mode: str) -> dict[str, Any]:
        await run(mode)
        return {}

    @app.get("/stream/{mode}")
    async def stream(mode: str) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            yield "data: first\n\n"
            await run(mode)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app.add_middleware(RagguardMiddleware, guard=guard)
    return app


async def answer_504(
    client: httpx.AsyncClient, kind: str, mode: str, headers: dict[str, str]
) -> dict[str, Any]:
    """GET ``/{kind}/{mode}``: a call's 504 body, or a stream's ``ragguard-error`` event (status 504)
    sent after its first event."""
    reply = await client.get(f"/{kind}/{mode}", headers=headers)
    if kind == "call":
        assert reply.status_code == 504, reply.text
        return dict(reply.json())
    assert reply.status_code == 200 and reply.text.startswith("data: first"), reply.text
    body = sse_error(reply.text)
    assert body["status"] == 504, body
    return body


def sse_error(text: str) -> dict[str, Any]:
    """The data of the ``ragguard-error`` event of an SSE body."""
    for block in text.split("\n\n"):
        lines = block.splitlines()
        if lines and lines[0] == "event: ragguard-error":
            return dict(json.loads(lines[1].removeprefix("data: ")))
    raise AssertionError(f"no ragguard-error event in {text!r}")


@asynccontextmanager
async def grpc_server(guard: ragguard.Guard, run: Run) -> AsyncIterator[str]:
    """A guarded server of ``t.S``: ``Call`` runs the request's mode; ``Stream`` sends ``first``,
    runs it, then ``unreachable``. Yields its target."""

    async def call(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        await run(request.decode())
        return b""

    async def stream(request: bytes, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        yield b"first"
        await run(request.decode())
        yield b"unreachable"

    methods = {
        "Call": grpc.unary_unary_rpc_method_handler(call),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
    }
    async with serving_methods("t.S", methods, [GuardServerInterceptor(guard=guard)]) as target:
        yield target


async def rpc(channel: aio.Channel, kind: str, mode: str, got: list[bytes], **options: Any) -> None:
    """Make a ``call`` or ``stream`` of ``mode`` on ``t.S``; a stream's messages go to ``got``."""
    if kind == "call":
        await channel.unary_unary("/t.S/Call")(mode.encode(), **options)
    else:
        async for item in channel.unary_stream("/t.S/Stream")(mode.encode(), **options):
            got.append(item)
