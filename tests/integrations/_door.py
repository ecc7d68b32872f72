"""What the integration tests share: a sleep that records its waits, a bounded wait for a
condition, and a front door (uvicorn serving an ASGI app behind RagguardMiddleware) that a client
leaves after the first chunk of a streamed response (served with ``wire.serving``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from ragguard import Guard
from ragguard.asgi import RagguardMiddleware, primed


class Sleeps:
    """A Guard's ``sleep``: records each wait (seconds) and yields to the loop once instead."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await asyncio.sleep(0)


def deployment_breaker(create: Any, model: str | None) -> Any:
    """The breaker of the deployment a wrapped client's ``create`` (or a guarded runnable) calls
    ``model`` on: its stage's key for the client's endpoint and the model."""
    where = getattr(create, "__ragguard_deployment__")  # noqa: B009 - the protocol's name
    guard, stage, key = where(model)
    return guard().breaker(stage, key)


async def eventually(check: Any, *, within_s: float = 5.0) -> None:
    """Wait (polling every 10 ms, at most ``within_s``) until ``check()`` is true; assert it."""
    for _ in range(int(within_s / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    assert check()


def streaming_app(guard: Guard, open_stream: Callable[[], Any], text: Callable[[Any], str]) -> FastAPI:
    """An app behind RagguardMiddleware whose ``GET /answer`` streams ``text(item)`` of each item
    of ``await open_stream()`` (a guarded stream), as a RAG service's answer endpoint does."""
    app = FastAPI()
    app.add_middleware(RagguardMiddleware, guard=guard)

    @app.get("/answer")
    async def answer() -> StreamingResponse:
        items = await primed(await open_stream())

        async def body() -> AsyncIterator[str]:
            async with aclosing(items):
                async for item in items:
                    yield text(item)

        return StreamingResponse(body(), media_type="text/plain")

    return app


async def leave_after_first_chunk(url: str, path: str = "/answer", tenant: str = "acme") -> bytes:
    """Stream ``GET path`` of the front door at ``url`` with httpx, read the first chunk, then
    close the connection (the client goes away mid-stream); returns that chunk."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        async with client.stream("GET", path, headers={"x-tenant-id": tenant}) as reply:
            assert reply.status_code == 200, await reply.aread()
            async for chunk in reply.aiter_raw():
                return chunk
    raise AssertionError("the stream sent nothing")
