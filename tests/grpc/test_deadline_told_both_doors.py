"""A 504 / DEADLINE_EXCEEDED says which bound set the request's deadline (the client's, the
tenant's ``timeout_s``, the handler's own ``deadline(...)``) and its budget in seconds, at both
front doors, for calls and for streams: a real uvicorn server (httpx client) and a real grpc.aio
server (stock grpcio client) on loopback.

The Guard runs on a FakeClock: what hangs sleeps on it, so the deadline's timer fires at once.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi import FastAPI
from grpc import aio
from grpc_helpers import serving_methods
from told_helpers import WORDS, Run, answer_504, grpc_server, http_app, rpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))  # the HTTP tests' uvicorn runner
from http_helpers import running

import ragguard
from ragguard import FakeClock, Policy, TenantQuota
from ragguard.asgi import RagguardMiddleware
from ragguard.breakers import EmbeddingTimeoutBreaker
from ragguard.grpc import RemoteDeadlineExceeded, client_interceptors
from ragguard.httpx import GuardTransport
from ragguard.httpx import RemoteDeadlineExceeded as HttpRemoteDeadlineExceeded
from ragguard.outcomes import Kind, classify

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

HANDLER_S = 0.05
CASES = [
    # tenant, the client's budget (s), what hangs -> what set the deadline, its budget (s)
    ("acme", 9.0, "stage", "tenant", 0.3),  # the tenant's timeout_s cut the client's 9 s
    ("acme", 9.0, "code", "tenant", 0.3),  # ... and bounds unguarded handler code too
    ("acme", 9.0, "own", "handler", HANDLER_S),  # the handler's own deadline, shorter still
    ("roomy", 1.0, "stage", "client", 1.0),  # the client's, shorter than the tenant's 5 s
    ("plain", 2.0, "code", "client", 2.0),  # no tenant timeout_s: the client's
]


def make_guard() -> tuple[ragguard.Guard, FakeClock]:
    clock = FakeClock()
    tenants = {"acme": TenantQuota(timeout_s=0.3), "roomy": TenantQuota(timeout_s=5.0)}
    return ragguard.Guard(Policy(tenants=tenants), clock=clock), clock


def hangs(guard: ragguard.Guard, clock: FakeClock) -> Run:
    """``await hang(mode)``: a guarded stage that hangs, unguarded code that hangs, or the stage
    under the handler's own shorter deadline."""

    @guard.guard("search")
    async def search() -> str:
        await clock.sleep(30)
        return "unreachable"

    async def hang(mode: str) -> None:
        if mode == "stage":
            await search()
        elif mode == "code":
            await clock.sleep(30)
        else:
            async with guard.deadline(HANDLER_S):
                await search()

    return hang


def check(told: dict[str, Any], detail: str, set_by: str, budget_s: float) -> None:
    assert told["set_by"] == set_by, (told, detail)
    # the client's budget is what was left when the request arrived, as its transport rounds it
    # (grpc's timeout field has 8 digits and a unit: 1 s may arrive as 1.009 s)
    assert budget_s - 0.5 < told["deadline_s"] <= budget_s * 1.02, (told, detail)
    assert f"set by {WORDS[set_by]}" in detail, detail
    assert len(detail) < 300


# --- HTTP -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["call", "stream"])
async def test_http_504_says_what_set_the_deadline(kind: str) -> None:
    guard, clock = make_guard()
    with running(http_app(guard, hangs(guard, clock))) as url:
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            for tenant, client_s, mode, set_by, budget_s in CASES:
                headers = {"x-tenant-id": tenant, "x-request-timeout-ms": str(int(client_s * 1000))}
                body = await answer_504(client, kind, mode, headers)
                assert body["error"] == "DeadlineExceeded", body
                told = {"set_by": body["deadline_set_by"], "deadline_s": body["deadline_s"]}
                check(told, body["detail"], set_by, budget_s)


# --- gRPC -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["call", "stream"])
async def test_grpc_deadline_exceeded_says_what_set_the_deadline(kind: str) -> None:
    guard, clock = make_guard()
    async with grpc_server(guard, hangs(guard, clock)) as target, aio.insecure_channel(target) as channel:
        for tenant, client_s, mode, set_by, budget_s in CASES:
            got: list[bytes] = []
            with pytest.raises(aio.AioRpcError) as info:
                await rpc(channel, kind, mode, got, timeout=client_s, metadata=(("x-tenant-id", tenant),))
            error = info.value
            assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED, error
            assert got == ([] if kind == "call" else [b"first"])
            trailers = dict(error.trailing_metadata() or ())
            told = {
                "set_by": trailers["ragguard-deadline-set-by"],
                "deadline_s": float(trailers["ragguard-deadline-s"]),
            }
            check(told, error.details() or "", set_by, budget_s)


def test_a_deadline_says_who_set_it_and_refuses_an_unknown_source() -> None:
    error = ragguard.DeadlineExceeded("search", 0.1, "", 0.3, set_by="tenant")
    assert "the request's 0.300s, set by the tenant's timeout_s" in str(error)
    restored = pickle.loads(pickle.dumps(error))
    assert restored.set_by == "tenant" and str(restored) == str(error)
    with pytest.raises(ragguard.ConfigError, match="set_by"):
        ragguard.deadline(1.0, set_by="the moon")


# --- the gRPC client interceptor reads it back --------------------------------------------------


@pytest.mark.parametrize("kind", ["call", "stream"])
async def test_grpc_client_error_says_what_set_the_servers_deadline(kind: str) -> None:
    guard, clock = make_guard()
    async with grpc_server(guard, hangs(guard, clock)) as target:
        async with aio.insecure_channel(target, interceptors=client_interceptors()) as channel:
            for tenant, client_s, mode, set_by, budget_s in CASES:
                with pytest.raises(RemoteDeadlineExceeded) as info:
                    await rpc(channel, kind, mode, [], timeout=client_s, metadata=(("x-tenant-id", tenant),))
                error = info.value
                told = {"set_by": error.set_by, "deadline_s": error.deadline_s}
                check(told, error.details() or "", set_by, budget_s)


JUNK: list[tuple[tuple[str | None, str | None], tuple[str | None, float | None]]] = [
    # (ragguard-deadline-set-by, ragguard-deadline-s) a server sends -> what the error says
    (("client", "0.250"), ("client", 0.25)),
    (("the moon", "1.5"), (None, 1.5)),  # an unknown word
    (("CLIENT", "nan"), (None, None)),  # words are exact; NaN is no budget
    (("tenant", "inf"), ("tenant", None)),
    (("handler", "1e400"), ("handler", None)),  # a float's infinity
    (("handler", "1e300"), ("handler", None)),  # finite, past ten years
    (("client", "-1"), ("client", None)),
    (("client", "9" * 400), ("client", None)),  # huge, and past 64 characters
    (("x" * 10_000, "1.0"), (None, 1.0)),  # a 10 KB word
    (("client", "1" * 10_000), ("client", None)),  # a 10 KB number
    (("", ""), (None, None)),
    ((None, None), (None, None)),  # a server that says nothing
    (("client", "0x10"), ("client", None)),
]


@pytest.mark.parametrize("kind", ["call", "stream"])
async def test_grpc_client_ignores_junk_in_the_deadline_trailers(kind: str) -> None:
    """A server that is not ragguard, or is hostile, may put anything in those trailers: the
    error says None for what it cannot read, and nothing raises but the RemoteDeadlineExceeded."""

    async def abort(context: aio.ServicerContext[Any, Any], request: bytes) -> None:
        by, seconds = JUNK[int(request)][0]
        told = (("ragguard-deadline-set-by", by), ("ragguard-deadline-s", seconds)) if by is not None else ()
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "junk", trailing_metadata=told)

    async def call(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        await abort(context, request)
        return b""

    async def stream(request: bytes, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        yield b"first"
        await abort(context, request)

    methods = {
        "Call": grpc.unary_unary_rpc_method_handler(call),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
    }
    # a client that takes 64 KB of metadata (grpc's default refuses more than 8 KB at random)
    roomy = [("grpc.max_metadata_size", 64 * 1024), ("grpc.absolute_max_metadata_size", 64 * 1024)]
    async with serving_methods("t.S", methods) as target:
        async with aio.insecure_channel(target, options=roomy, interceptors=client_interceptors()) as channel:
            for i, (_, said) in enumerate(JUNK):
                with pytest.raises(RemoteDeadlineExceeded) as info:
                    await rpc(channel, kind, str(i), [], timeout=10)
                error = info.value
                assert (error.set_by, error.deadline_s) == said, (i, error.trailing_metadata())
                assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED


# --- the httpx transport reads it back ----------------------------------------------------------


async def test_httpx_transport_error_says_what_set_the_servers_deadline() -> None:
    """A 504 through GuardTransport raises RemoteDeadlineExceeded, which carries what the body
    said; the client's own deadline goes out through the transport (what is left of it)."""
    guard, clock = make_guard()
    with running(http_app(guard, hangs(guard, clock))) as url:
        async with httpx.AsyncClient(base_url=url, transport=GuardTransport()) as client:
            for tenant, client_s, mode, set_by, budget_s in CASES:
                with ragguard.deadline(client_s), pytest.raises(HttpRemoteDeadlineExceeded) as info:
                    await client.get(f"/call/{mode}", headers={"x-tenant-id": tenant})
                error = info.value
                assert error.response.status_code == 504 and isinstance(error, httpx.HTTPStatusError)
                body = error.response.json()  # the body was read, and is whole
                assert (error.set_by, error.deadline_s) == (body["deadline_set_by"], body["deadline_s"])
                told = {"set_by": error.set_by, "deadline_s": error.deadline_s}
                check(told, body["detail"], set_by, budget_s)
                # the request's own deadline (the transport sent it) ran out there: not the
                # server's slowness; a bound of the server's own cut it: a timeout, as any 504
                assert error.request_deadline is (set_by == "client")
                assert classify(error).kind is (Kind.DEADLINE if set_by == "client" else Kind.TIMEOUT)


async def test_httpx_transport_a_timeout_field_the_caller_set_keeps_the_504_a_timeout() -> None:
    """Only the deadline the transport sent makes a 504 the request's deadline: a breaker counts
    the 504 of a timeout field the caller set itself (no ragguard deadline), and of a tenant's
    timeout_s, and not the one of the request's deadline."""
    guard, clock = make_guard()
    breaker = EmbeddingTimeoutBreaker(minimum_calls=10, window_size=10, clock=FakeClock())
    with running(http_app(guard, hangs(guard, clock))) as url:
        async with httpx.AsyncClient(base_url=url, transport=GuardTransport()) as client:
            own = {"x-tenant-id": "plain", "x-request-timeout-ms": "2000"}
            with pytest.raises(HttpRemoteDeadlineExceeded) as info:
                await breaker.call(client.get, "/call/stage", headers=own)
            assert (info.value.set_by, info.value.request_deadline) == ("client", False)
            with ragguard.deadline(2.0), pytest.raises(HttpRemoteDeadlineExceeded) as info:
                await breaker.call(client.get, "/call/stage", headers={"x-tenant-id": "plain"})
            assert (info.value.set_by, info.value.request_deadline) == ("client", True)
            with ragguard.deadline(2.0), pytest.raises(HttpRemoteDeadlineExceeded) as info:
                await breaker.call(client.get, "/call/stage", headers={"x-tenant-id": "acme"})
            assert (info.value.set_by, info.value.request_deadline) == ("tenant", False)
    metrics = breaker.metrics()
    assert (metrics.calls, metrics.failed_calls) == (2, 2)  # the request's deadline is not counted


async def test_a_chained_service_answers_the_504_of_its_dependency_in_general_words() -> None:
    """Service A calls B through GuardTransport and lets B's 504 escape: A answers 504 itself,
    naming no upstream URL, host or port, whether the request's deadline (sent on by A) or B's
    own bound (the tenant's timeout_s there) ran out at B."""
    guard, clock = make_guard()
    up = FastAPI()
    with running(http_app(guard, hangs(guard, clock))) as down_url:

        @up.get("/ask")
        async def ask() -> dict[str, Any]:
            async with httpx.AsyncClient(base_url=down_url, transport=GuardTransport()) as down:
                await down.get("/call/stage")  # the tenant goes on from A's request
            return {}

        up.add_middleware(RagguardMiddleware, guard=ragguard.Guard(Policy()))
        with running(up) as up_url:
            async with httpx.AsyncClient(base_url=up_url, timeout=20) as http:
                for tenant, outcome in (("plain", "deadline"), ("acme", "timeout")):
                    headers = {"x-tenant-id": tenant, "x-request-timeout-ms": "9000"}
                    reply = await http.get("/ask", headers=headers)
                    assert reply.status_code == 504, reply.text
                    assert reply.json()["outcome"] == outcome, reply.text
                    assert "127.0.0.1" not in reply.text and down_url not in reply.text, reply.text
