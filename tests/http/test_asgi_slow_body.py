"""A client that trickles its request body cannot hold its tenant's slot past the body-read bound
or the deadline: real uvicorn, raw sockets sending one byte every 0.2 s, httpx for the real tenant."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI, Request
from http_helpers import running

import ragguard
from ragguard import Policy, TenantQuota
from ragguard.asgi import RagguardMiddleware

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SLOTS = 5
BODY = 100  # bytes each trickler declares, sent one per 0.2 s: 20 s for the whole body


def slow_app(guard: ragguard.Guard) -> FastAPI:
    app = FastAPI()

    @app.post("/upload")
    async def upload(request: Request) -> dict[str, Any]:
        data = await request.body()
        return {"size": len(data), "tenant": ragguard.current_tenant()}

    @app.get("/whoami")
    async def whoami() -> dict[str, Any]:
        return {"tenant": ragguard.current_tenant()}

    @app.post("/json")
    async def parsed(body: dict[str, Any]) -> dict[str, Any]:  # FastAPI reads the body itself
        return {"keys": len(body)}

    @app.post("/late")
    async def late(request: Request) -> dict[str, Any]:
        await asyncio.sleep(1.5)  # the app's own time, with the whole body already sent
        return {"size": len(await request.body())}

    return app


class Trickler:
    """A raw HTTP/1.1 client that claims tenant acme and sends its body one byte at a time."""

    def __init__(self, url: str, headers: dict[str, str], path: str = "/upload") -> None:
        self.url = urlsplit(url)
        self.path = path
        self.headers = headers
        self.answer = b""
        self.sent = 0
        self.closed = False
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        reader, writer = await asyncio.open_connection(self.url.hostname, self.url.port)
        fields = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
        head = (
            f"POST {self.path} HTTP/1.1\r\nhost: {self.url.netloc}\r\n"
            f"content-type: application/json\r\ncontent-length: {BODY}\r\n{fields}\r\n"
        )
        writer.write(head.encode())
        await writer.drain()
        self.task = asyncio.create_task(self._trickle(reader, writer))

    async def _trickle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reading = asyncio.create_task(self._read(reader))
        try:
            while self.sent < BODY and not self.answer:
                writer.write(b"x")
                await writer.drain()
                self.sent += 1
                await asyncio.wait({reading}, timeout=0.2)
        except ConnectionError:
            pass  # the server closed the connection while a byte was on its way
        try:
            await asyncio.wait_for(reading, 5)
        finally:
            writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        """Everything the server sends, until it closes the connection."""
        try:
            while chunk := await reader.read(65536):
                self.answer += chunk
        except ConnectionError:
            pass
        self.closed = True

    def status(self) -> int | None:
        if not self.answer.startswith(b"HTTP/1.1 "):
            return None
        return int(self.answer[9:12])


async def _hold_every_slot(url: str, headers: dict[str, str]) -> list[Trickler]:
    tricklers = [Trickler(url, {"x-tenant-id": "acme", **headers}) for _ in range(SLOTS)]
    for trickler in tricklers:
        await trickler.start()
    return tricklers


async def _first_admission(client: httpx.AsyncClient, within_s: float) -> tuple[int, float]:
    """Poll the real acme until it is admitted: (its status, seconds it took)."""
    start = time.monotonic()
    status = 0
    while time.monotonic() - start < within_s:
        status = (await client.get("/whoami", headers={"x-tenant-id": "acme"})).status_code
        if status == 200:
            break
        await asyncio.sleep(0.05)
    return status, time.monotonic() - start


def _guard() -> ragguard.Guard:
    return ragguard.Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=SLOTS)}))


@pytest.mark.parametrize("cancel_on_disconnect", [True, False])
async def test_a_trickled_body_holds_the_slot_no_longer_than_body_timeout(cancel_on_disconnect: bool) -> None:
    guard = _guard()
    app = RagguardMiddleware(
        slow_app(guard), guard=guard, body_timeout_s=1.0, cancel_on_disconnect=cancel_on_disconnect
    )
    with running(app) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            tricklers = await _hold_every_slot(url, {})
            await asyncio.sleep(0.3)
            refused = await client.get("/whoami", headers={"x-tenant-id": "acme"})
            assert refused.status_code == 429  # every slot is held by a trickler, for now
            status, took = await _first_admission(client, within_s=6.0)
            await asyncio.gather(*(t.task for t in tricklers if t.task is not None))
    assert status == 200, f"acme was still refused after {took:.1f}s"
    assert took < 4.0  # the body would have taken 20 s
    assert [t.status() for t in tricklers] == [400] * SLOTS
    assert all(b"body_timeout_s" in t.answer for t in tricklers), tricklers[0].answer
    assert all(t.sent < BODY // 2 and t.closed for t in tricklers), [(t.sent, t.closed) for t in tricklers]


async def test_the_deadline_cuts_a_trickled_body() -> None:
    guard = _guard()
    app = RagguardMiddleware(slow_app(guard), guard=guard)  # the default body_timeout_s is 10 s
    with running(app) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            tricklers = await _hold_every_slot(url, {"x-request-timeout-ms": "800"})
            await asyncio.sleep(0.3)
            assert (await client.get("/whoami", headers={"x-tenant-id": "acme"})).status_code == 429
            status, took = await _first_admission(client, within_s=6.0)
            await asyncio.gather(*(t.task for t in tricklers if t.task is not None))
    assert status == 200, f"acme was still refused after {took:.1f}s"
    assert took < 4.0
    assert [t.status() for t in tricklers] == [504] * SLOTS
    assert all(b"request body" in t.answer and t.closed for t in tricklers)


async def test_a_body_that_arrives_in_time_is_read_whole() -> None:
    guard = _guard()
    app = RagguardMiddleware(slow_app(guard), guard=guard, body_timeout_s=2.0)
    with running(app) as url:
        async with httpx.AsyncClient(base_url=url) as client:

            async def chunks() -> Any:
                for _ in range(5):
                    yield b"y" * 1000
                    await asyncio.sleep(0.05)

            reply = await client.post("/upload", content=chunks(), headers={"x-tenant-id": "acme"})
    assert reply.status_code == 200
    assert reply.json() == {"size": 5000, "tenant": "acme"}


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "soon", 10**6])
def test_body_timeout_must_be_positive_seconds(bad: Any) -> None:
    with pytest.raises(ragguard.ConfigError) as info:
        RagguardMiddleware(slow_app(_guard()), body_timeout_s=bad)
    assert info.value.field == "body_timeout_s"


async def test_time_the_app_spends_elsewhere_does_not_count() -> None:
    guard = _guard()
    app = RagguardMiddleware(slow_app(guard), guard=guard, body_timeout_s=1.0)
    with running(app) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            reply = await client.post("/late", content=b"z" * 3000, headers={"x-tenant-id": "acme"})
    assert (reply.status_code, reply.json()) == (200, {"size": 3000})


async def test_fastapi_answers_its_own_400_for_a_body_parameter_cut_short() -> None:
    guard = _guard()
    app = RagguardMiddleware(slow_app(guard), guard=guard, body_timeout_s=0.5)
    with running(app) as url:
        trickler = Trickler(url, {"x-tenant-id": "acme"}, path="/json")
        await trickler.start()
        assert trickler.task is not None
        await trickler.task
    assert trickler.status() == 400 and b"There was an error parsing the body" in trickler.answer
    assert trickler.closed and trickler.sent < BODY // 2


async def test_a_deadline_passing_after_the_body_was_read_keeps_the_connection() -> None:
    # the handler deadline and the body bound agree: only a deadline that passes while the app
    # waits for the body is a cut body (504 "request body", connection closed); one that passes
    # in the app's own work is the handler's 504, on a connection that stays usable
    guard = _guard()
    app = RagguardMiddleware(slow_app(guard), guard=guard)
    with running(app) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            late = await client.post(
                "/late", content=b"z" * 10, headers={"x-tenant-id": "acme", "x-request-timeout-ms": "300"}
            )
            again = await client.get("/whoami", headers={"x-tenant-id": "acme"})
    assert late.status_code == 504
    assert "request body" not in late.json()["detail"]
    assert late.headers.get("connection") != "close"
    assert again.status_code == 200
