"""Both front doors answer what the Guard's own classifier said about the call (issue 30): a FastAPI
app behind the ASGI middleware (uvicorn, httpx client) and a grpc.aio server with the interceptor
(stock grpcio client), each with a Guard built with ``classifier=``.

The doors see only the error that leaves the handler; they read the outcome the guarded call's chain
recorded on it, so their answer agrees with what the retry, the breaker and the fallback of the
same call did. The errors are the user's own classes, which ragguard's process-wide classifier reads
otherwise (a ValueError is the caller's error, a ConnectionError the dependency's failure): on main
the doors answered 500/UNKNOWN for the first two and 502/UNAVAILABLE for the third.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi import FastAPI
from grpc import aio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))  # the HTTP tests' uvicorn runner
from http_helpers import running

from ragguard import BreakerPolicy, Guard, Policy, RetryPolicy, StagePolicy
from ragguard.asgi import RagguardMiddleware
from ragguard.grpc import GuardServerInterceptor
from ragguard.outcomes import Kind, Outcome

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class Busy(ValueError):
    """The Guard's classifier: the dependency failed (retried, counted, 502 / UNAVAILABLE)."""


class Crowded(ValueError):
    """The Guard's: the dependency rejected the call asking for 2 s (503 + Retry-After: 2)."""


class Refused(ConnectionError):
    """The Guard's: the caller's bad request (not retried, not counted; 400 / INVALID_ARGUMENT)."""


OUTCOMES: dict[type[BaseException], Outcome] = {
    Busy: Outcome.of(Kind.FAILURE, reason="connection"),
    Crowded: Outcome.of(Kind.REJECTION, retry_after_s=2.0, reason="status", status=429),
    Refused: Outcome.of(Kind.CALLER_ERROR, reached=False, reason="request", status=400),
}
ERRORS = {"busy": Busy, "crowded": Crowded, "refused": Refused}


class Service:
    """One guarded stage whose dependency fails with the error the request names, and what the
    stage's layers did about it."""

    def __init__(self) -> None:
        self.asked: list[str] = []  # the Guard's classifier, by error class
        never_opens = BreakerPolicy(kind="generic", minimum_calls=1000, window_size=1000)
        retry = RetryPolicy(attempts=3, initial_backoff_s=0.0, jitter_s=0.0, retry_on=("connection",))
        stage = StagePolicy(timeout_s=10.0, idempotent=True, retry=retry, breaker=never_opens)
        self.guard = Guard(Policy(stages={"search": stage}), classifier=self.classify)
        self.calls = 0

        @self.guard.guard("search")
        async def search(what: str) -> str:
            self.calls += 1
            raise ERRORS[what](f"{what} (the store's own words)")

        self.search = search

    def classify(self, exc: BaseException) -> Outcome | None:
        self.asked.append(type(exc).__name__)
        return OUTCOMES.get(type(exc))

    @property
    def counted(self) -> int:
        breaker = self.guard.stage("search").breaker
        assert breaker is not None
        return int(breaker.metrics().failed_calls)  # type: ignore[attr-defined]


@dataclass
class Reply:
    code: str  # a grpc.StatusCode name (HTTP statuses translated)
    wait: float | None  # the Retry-After told (seconds)


HTTP_CODES = {400: "INVALID_ARGUMENT", 500: "UNKNOWN", 502: "UNAVAILABLE", 503: "UNAVAILABLE"}


@asynccontextmanager
async def door(kind: str, service: Service) -> AsyncIterator[Any]:
    """``ask(what)`` through the ``kind`` door in front of ``service``."""
    if kind == "http":
        app = FastAPI()

        @app.get("/search/{what}")
        async def endpoint(what: str) -> dict[str, str]:
            return {"hits": await service.search(what)}

        with running(RagguardMiddleware(app, guard=service.guard)) as url:
            async with httpx.AsyncClient(base_url=url) as client:

                async def ask_http(what: str) -> Reply:
                    reply = await client.get(f"/search/{what}")
                    wait = reply.headers.get("retry-after")
                    return Reply(HTTP_CODES[reply.status_code], None if wait is None else float(wait))

                yield ask_http
        return
    server = aio.server(interceptors=[GuardServerInterceptor(guard=service.guard)])

    async def handler(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        return (await service.search(request.decode())).encode()

    methods = {"Search": grpc.unary_unary_rpc_method_handler(handler)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Store", methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            rpc = channel.unary_unary("/t.Store/Search")

            async def ask_grpc(what: str) -> Reply:
                try:
                    await rpc(what.encode(), timeout=20)
                except aio.AioRpcError as exc:
                    wait = dict(exc.trailing_metadata() or ()).get("retry-after")
                    return Reply(exc.code().name, None if wait is None else float(wait))
                return Reply("OK", None)

            yield ask_grpc
    finally:
        await server.stop(None)


CASES = {
    # what the Guard's classifier said -> the door's answer (HTTP: 502 / 503 + Retry-After: 2 / 400),
    # the dependency's calls (retried or not), the attempts the breaker counted
    "busy": (Reply("UNAVAILABLE", None), 3, 3),  # a failure: retried, each attempt counted
    "crowded": (Reply("UNAVAILABLE", 2.0), 1, 0),  # a rejection: not retried (retry_on), not counted
    "refused": (Reply("INVALID_ARGUMENT", None), 1, 0),  # the caller's: never retried nor counted
}


@pytest.mark.parametrize("what", list(CASES))
@pytest.mark.parametrize("kind", ["http", "grpc"])
async def test_the_door_the_retry_and_the_breaker_agree_with_the_guards_own(kind: str, what: str) -> None:
    service = Service()
    async with door(kind, service) as ask:
        reply = await ask(what)
    answer, calls, counted = CASES[what]
    assert reply == answer
    assert (service.calls, service.counted) == (calls, counted)
    assert service.asked == [ERRORS[what].__name__] * calls  # once per attempt: not the door, not the breaker
