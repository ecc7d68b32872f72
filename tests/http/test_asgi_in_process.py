"""RagguardMiddleware called in-process (no server) on asyncio and on trio: the disconnect watcher
has one implementation per event loop library, and both must cancel the app and give the slot back."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import ragguard
from ragguard import FakeClock, Policy, TenantQuota
from ragguard.asgi import RagguardMiddleware

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def scope(tenant: bytes = b"acme") -> dict[str, Any]:
    headers = [(b"x-tenant-id", tenant)]
    return {"type": "http", "method": "GET", "path": "/", "root_path": "", "headers": headers}


class Client:
    """The server's side of one request: the body, then a disconnect when ``leave()`` is called."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = anyio.Event()
        self.read = False

    async def receive(self) -> dict[str, Any]:
        if not self.read:
            self.read = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


async def test_a_disconnect_cancels_the_app_and_frees_the_slot() -> None:
    guard = ragguard.Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=1)}), clock=FakeClock())
    entered = anyio.Event()
    outcome: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        entered.set()
        try:
            await anyio.sleep(30)
        except BaseException:
            outcome.append("cancelled")
            raise

    client = Client()
    middleware = RagguardMiddleware(app, guard=guard)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(middleware, scope(), client.receive, client.send)
            await entered.wait()
            assert guard.quotas.in_flight("acme") == 1
            client.gone.set()
    assert outcome == ["cancelled"]
    assert guard.quotas.in_flight("acme") == 0


async def test_a_finished_request_leaves_nothing_running() -> None:
    guard = ragguard.Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=1)}), clock=FakeClock())

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "http.request"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": ragguard.current_tenant().encode()})

    client = Client()
    with anyio.fail_after(5):
        await RagguardMiddleware(app, guard=guard)(scope(), client.receive, client.send)
    assert [m["type"] for m in client.sent] == ["http.response.start", "http.response.body"]
    assert client.sent[1]["body"] == b"acme"
    assert guard.quotas.in_flight("acme") == 0
