"""A QuotaExceeded whose quota wait ran into the request's deadline (answered 504 /
DEADLINE_EXCEEDED) says which bound set that deadline and its budget, at both front doors, for
calls and for streams, as a DeadlineExceeded does: the 504 body and the SSE ``ragguard-error``
event (``deadline_set_by``, ``deadline_s``), the gRPC trailers (``ragguard-deadline-set-by``,
``ragguard-deadline-s``), and the error itself (``set_by``, ``deadline_s``). A real uvicorn server
(httpx client) and a real grpc.aio server (grpc.aio client) on loopback.

Two waits run into a deadline:

- the door's admission: the tenant's only slot is held, and the request queues for it until the
  client's deadline passes (the door admits before the tenant's ``timeout_s`` applies, so the
  client's is the one it can run into);
- the token quota of a generation stream the handler opens (after the door admitted it, and for a
  stream after its first item): the tenant's tokens are spent, and the wait for them would outlast
  the deadline set by the tenant's ``timeout_s``, the client, or the handler's own ``deadline``.

The Guard runs on a FakeClock: the slot holder sleeps on it once the other request queues, so the
queued request's deadline timer fires at once; a token refusal needs no time at all.
"""

from __future__ import annotations

import asyncio
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
from ragguard import FakeClock, GenerationPolicy, Policy, StagePolicy, TenantQuota
from ragguard.asgi import RagguardMiddleware
from ragguard.grpc import GuardServerInterceptor, RemoteDeadlineExceeded, client_interceptors
from ragguard.httpx import GuardTransport
from ragguard.httpx import RemoteDeadlineExceeded as HttpRemoteDeadlineExceeded

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

HANDLER_S = 0.05
QUEUED_S = 1.0  # the queued request's client deadline
TOKEN_CASES = [
    # tenant, the client's budget (s), the handler's own deadline? -> what set the deadline, its budget (s)
    ("acme", 9.0, False, "tenant", 0.3),  # the tenant's timeout_s cut the client's 9 s
    ("acme", 9.0, True, "handler", HANDLER_S),  # the handler's own deadline, shorter still
    ("roomy", 1.0, False, "client", 1.0),  # the client's, shorter than the tenant's 5 s
]


def make_guard() -> tuple[ragguard.Guard, FakeClock]:
    clock = FakeClock()
    metered = {"token_quota": 50, "max_wait_s": 60.0}
    tenants = {
        "tight": TenantQuota(max_concurrency=1, max_wait_s=60.0),
        "acme": TenantQuota(timeout_s=0.3, **metered),
        "roomy": TenantQuota(timeout_s=5.0, **metered),
    }
    generation = GenerationPolicy(estimate_tokens=40, first_item_s=None, idle_s=None, total_s=None)
    policy = Policy(stages={"generation": StagePolicy(generation=generation)}, tenants=tenants)
    return ragguard.Guard(policy, clock=clock), clock


def handlers(guard: ragguard.Guard, clock: FakeClock) -> Run:
    """``await run(mode)``: ``hold`` the tight tenant's slot until another request queues for it;
    ``warm``: spend 40 of the tenant's 50 tokens; ``tokens``/``own``: open a generation stream
    whose tokens cannot come in time (``own``: under the handler's own shorter deadline)."""

    @guard.guard("generation")
    async def model(n: int) -> AsyncIterator[str]:
        for i in range(n):
            yield f"w{i}"

    async def run(mode: str) -> None:
        if mode == "hold":
            for _ in range(500):  # bounded: 5 s
                if guard.quotas.waiting("tight"):
                    break
                await asyncio.sleep(0.01)
            await clock.sleep(30)  # now the clock moves: the queued request's deadline passes
        elif mode == "warm":
            assert len([w async for w in model(40)]) == 40
        elif mode == "own":
            async with guard.deadline(HANDLER_S):
                [w async for w in model(1)]
        else:
            [w async for w in model(1)]

    return run


async def held(guard: ragguard.Guard) -> bool:
    """Whether the tight tenant's slot is taken within 5 s (the holder's request arrived)."""
    for _ in range(500):
        if guard.quotas.in_flight("tight"):
            return True
        await asyncio.sleep(0.01)
    return False


def check(set_by: str | None, deadline_s: float | None, detail: str, want_by: str, want_s: float) -> None:
    assert set_by == want_by, (set_by, detail)
    # the client's budget is what was left when the request arrived, as its transport rounds it
    assert deadline_s is not None and want_s - 0.5 < deadline_s <= want_s * 1.02, (deadline_s, detail)
    assert f"set by {WORDS[want_by]}" in detail and "deadline quota" in detail, detail
    assert len(detail) < 300


# --- HTTP -------------------------------------------------------------------------------------


def told_http(body: dict[str, Any], want_by: str, want_s: float) -> None:
    assert body["error"] == "QuotaExceeded", body
    check(body.get("deadline_set_by"), body.get("deadline_s"), body["detail"], want_by, want_s)


def sent(tenant: str, seconds: float) -> dict[str, str]:
    return {"x-tenant-id": tenant, "x-request-timeout-ms": str(int(seconds * 1000))}


async def test_http_a_queue_wait_cut_by_the_clients_deadline_says_so() -> None:
    guard, clock = make_guard()
    with running(http_app(guard, handlers(guard, clock))) as url:
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            holder = asyncio.ensure_future(client.get("/call/hold", headers={"x-tenant-id": "tight"}))
            assert await held(guard)
            reply = await client.get("/call/hold", headers=sent("tight", QUEUED_S))  # queues, then refused
            assert (await holder).status_code == 200
    assert reply.status_code == 504, reply.text
    told_http(reply.json(), "client", QUEUED_S)
    assert guard.quotas.in_flight("tight") == 0 and guard.quotas.waiting("tight") == 0


@pytest.mark.parametrize("kind", ["call", "stream"])
async def test_http_a_token_wait_past_the_deadline_says_what_set_it(kind: str) -> None:
    guard, clock = make_guard()
    with running(http_app(guard, handlers(guard, clock))) as url:
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            for tenant in ("acme", "roomy"):
                assert (await client.get("/call/warm", headers={"x-tenant-id": tenant})).status_code == 200
            for tenant, client_s, own, want_by, want_s in TOKEN_CASES:
                body = await answer_504(client, kind, "own" if own else "tokens", sent(tenant, client_s))
                told_http(body, want_by, want_s)
    assert clock() == 0.0  # refused at once: the wait would outlast the deadline


async def test_httpx_transport_error_says_what_set_the_deadline_a_token_wait_ran_into() -> None:
    """Through GuardTransport, the 504 is a RemoteDeadlineExceeded carrying what the body said
    (the client's deadline goes out through the transport: what is left of it)."""
    guard, clock = make_guard()
    with running(http_app(guard, handlers(guard, clock))) as url:
        async with httpx.AsyncClient(base_url=url, transport=GuardTransport()) as client:
            for tenant in ("acme", "roomy"):
                assert (await client.get("/call/warm", headers={"x-tenant-id": tenant})).status_code == 200
            for tenant, client_s, own, want_by, want_s in TOKEN_CASES:
                path = "/call/own" if own else "/call/tokens"
                with ragguard.deadline(client_s), pytest.raises(HttpRemoteDeadlineExceeded) as info:
                    await client.get(path, headers={"x-tenant-id": tenant})
                error = info.value
                assert error.response.json()["error"] == "QuotaExceeded"
                check(error.set_by, error.deadline_s, error.response.json()["detail"], want_by, want_s)


FORGED = {"nan": float("nan"), "inf": float("inf"), "huge": 1e300, "neg": -1.0}


def forged(junk: str) -> ragguard.QuotaExceeded:
    return ragguard.QuotaExceeded("acme", 0.1, "deadline", deadline_s=FORGED[junk], set_by="tenant acme")


async def test_http_a_forged_telling_is_not_repeated() -> None:
    """What the doors tell is bounded whatever the error holds: a word of SET_BY, a finite
    number; the app's own QuotaExceeded with junk in them tells neither (nor its tenant id)."""
    app = FastAPI()

    @app.get("/forged/{junk}")
    async def raises(junk: str) -> None:
        raise forged(junk)

    with running(RagguardMiddleware(app, guard=ragguard.Guard(Policy()))) as url:
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            for junk in FORGED:
                reply = await client.get(f"/forged/{junk}", headers=sent("acme", 5.0))
                assert reply.status_code == 504
                body = reply.json()
                assert "deadline_set_by" not in body and "deadline_s" not in body, body


# --- gRPC -------------------------------------------------------------------------------------


def told_grpc(error: aio.AioRpcError, want_by: str, want_s: float) -> None:
    assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED, error
    trailers = dict(error.trailing_metadata() or ())
    told_s = trailers.get("ragguard-deadline-s")
    seconds = None if told_s is None else float(told_s)
    details = error.details() or ""
    check(trailers.get("ragguard-deadline-set-by"), seconds, details, want_by, want_s)
    # the client interceptor reads the same trailers onto the error it raises
    assert isinstance(error, RemoteDeadlineExceeded)
    check(error.set_by, error.deadline_s, details, want_by, want_s)


def tenant(name: str) -> tuple[tuple[str, str]]:
    return (("x-tenant-id", name),)


@pytest.mark.parametrize("kind", ["call", "stream"])
async def test_grpc_a_queue_wait_cut_by_the_clients_deadline_says_so(kind: str) -> None:
    guard, clock = make_guard()
    async with grpc_server(guard, handlers(guard, clock)) as target:
        async with aio.insecure_channel(target, interceptors=client_interceptors()) as channel:
            holder = asyncio.ensure_future(rpc(channel, "call", "hold", [], metadata=tenant("tight")))
            assert await held(guard)
            got: list[bytes] = []
            with pytest.raises(aio.AioRpcError) as info:
                await rpc(channel, kind, "hold", got, timeout=5.0, metadata=tenant("tight"))  # queues
            await holder
    assert got == []  # refused before the handler ran
    told_grpc(info.value, "client", 5.0)
    assert guard.quotas.in_flight("tight") == 0 and guard.quotas.waiting("tight") == 0


@pytest.mark.parametrize("kind", ["call", "stream"])
async def test_grpc_a_token_wait_past_the_deadline_says_what_set_it(kind: str) -> None:
    guard, clock = make_guard()
    async with grpc_server(guard, handlers(guard, clock)) as target:
        async with aio.insecure_channel(target, interceptors=client_interceptors()) as channel:
            for name in ("acme", "roomy"):
                await rpc(channel, "call", "warm", [], metadata=tenant(name))
            for name, client_s, own, want_by, want_s in TOKEN_CASES:
                got: list[bytes] = []
                with pytest.raises(aio.AioRpcError) as info:
                    mode = "own" if own else "tokens"
                    await rpc(channel, kind, mode, got, timeout=client_s, metadata=tenant(name))
                told_grpc(info.value, want_by, want_s)
                assert got == ([] if kind == "call" else [b"first"])  # the error came after it
    assert clock() == 0.0


async def test_grpc_a_forged_telling_is_not_repeated() -> None:
    async def raises(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        raise forged(request.decode())

    methods = {"Call": grpc.unary_unary_rpc_method_handler(raises)}
    door = [GuardServerInterceptor(guard=ragguard.Guard(Policy()))]
    async with serving_methods("t.S", methods, door) as target, aio.insecure_channel(target) as channel:
        for junk in FORGED:
            with pytest.raises(aio.AioRpcError) as info:
                await rpc(channel, "call", junk, [], timeout=5.0)
            assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            keys = {key for key, _ in info.value.trailing_metadata() or ()}
            assert not keys & {"ragguard-deadline-set-by", "ragguard-deadline-s"}, keys


def test_the_error_tells_and_keeps_what_set_the_deadline() -> None:
    error = ragguard.QuotaExceeded("acme", 0.25, "deadline", deadline_s=0.3, set_by="tenant")
    assert str(error).endswith("(the request's 0.300s, set by the tenant's timeout_s)")
    restored = pickle.loads(pickle.dumps(error))
    assert (restored.set_by, restored.deadline_s, str(restored)) == ("tenant", 0.3, str(error))
    other = ragguard.QuotaExceeded("acme", 0.25, "rate")
    other.told_by(1.0, "client")  # only a deadline's refusal is told one
    assert (other.set_by, other.deadline_s) == (None, None) and "set by" not in str(other)
