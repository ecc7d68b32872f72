"""A real uvicorn server on 127.0.0.1 in a thread, and a FastAPI RAG-shaped app to put behind it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

import ragguard
from ragguard import (
    BreakerOpen,
    DeadlineExceeded,
    InvalidInput,
    NoDeploymentAvailable,
    QuotaExceeded,
    StageTimeout,
    VectorStoreUnavailable,
)
from wire._http import serving

ERRORS: dict[str, Callable[[], Exception]] = {
    "quota": lambda: QuotaExceeded("acme", 2.5, "rate"),
    "quota_deadline": lambda: QuotaExceeded("acme", 0.4, "deadline"),
    "breaker": lambda: VectorStoreUnavailable("vector_store", 1.2501),
    "breaker_half_open": lambda: BreakerOpen("rerank", 0.0, state="half_open"),
    "breaker_forced": lambda: BreakerOpen("embed", None, state="forced_open"),
    "no_deployment": lambda: NoDeploymentAvailable("chat", 7.5, out={"a": "open", "b": "limits"}),
    "deadline": lambda: DeadlineExceeded("embed", 0.5),
    "stage_timeout": lambda: StageTimeout("rerank", 0.8),
    "invalid": lambda: InvalidInput("query must not be empty"),
    "runtime": lambda: RuntimeError("plain bug"),
}


class Gate:
    """Lets a test hold requests inside an endpoint (across the server's thread) and let them go."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.cancelled = threading.Event()
        self.finished = threading.Event()

    async def wait(self, timeout_s: float = 10.0) -> None:
        """Park the calling endpoint until released (polling: the server loop must keep running)."""
        self.entered.set()
        try:
            for _ in range(int(timeout_s / 0.005)):
                if self.release.is_set():
                    return
                await asyncio.sleep(0.005)
        except BaseException:
            self.cancelled.set()
            raise
        finally:
            self.finished.set()


def wait_for(event: threading.Event, timeout_s: float = 5.0) -> bool:
    return event.wait(timeout_s)


async def eventually(predicate: Callable[[], bool], within_s: float = 5.0) -> bool:
    """Poll ``predicate`` every 10 ms for at most ``within_s`` seconds."""
    for _ in range(int(within_s / 0.01)):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()


@contextmanager
def running(app: Any, **options: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port from a thread; yields the base URL."""
    settings = {"log_level": "warning", "timeout_graceful_shutdown": 2, "lifespan": "auto"}
    with serving(app, **(settings | options)) as (url, _):
        yield url


def rag_app(guard: ragguard.Guard, gate: Gate) -> FastAPI:
    """A FastAPI app shaped like a RAG service, with no ragguard status mapping of its own."""
    app = FastAPI()

    @guard.guard("search", fallback=lambda query: [f"keyword hit for {query}"])
    async def vector_search(query: str) -> list[str]:
        return [f"vector hit for {query}"]

    @app.get("/whoami")
    async def whoami() -> dict[str, Any]:
        return {"tenant": ragguard.current_tenant(), "remaining": ragguard.remaining()}

    @app.get("/search")
    async def search(q: str) -> dict[str, Any]:
        hits = await vector_search(q)
        return {"hits": hits, "degraded": list(ragguard.degraded())}

    @app.get("/raise/{name}")
    async def fail(name: str) -> dict[str, Any]:
        raise ERRORS[name]()

    @app.get("/hold")
    async def hold() -> dict[str, Any]:
        await gate.wait()
        return {"tenant": ragguard.current_tenant()}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return guard.status()

    @app.post("/echo")
    async def echo(body: dict[str, Any]) -> dict[str, Any]:
        return {"size": len(body["text"]), "tenant": ragguard.current_tenant()}

    @app.get("/stream")
    async def stream(
        fail: str = "", hold: bool = False, media: str = "text/event-stream"
    ) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            for i in range(2):
                yield f"data: token {i} for {ragguard.current_tenant()}\n\n"
            if hold:
                await gate.wait()
            if fail:
                raise ERRORS[fail]()
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type=media)

    return app
