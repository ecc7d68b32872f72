"""A stage timeout inside a request is a 504 from the ASGI middleware (it used to be a 500)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

import ragguard
from ragguard import FakeClock, Policy, StagePolicy
from ragguard.asgi import RagguardMiddleware

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


async def test_a_stage_timeout_is_a_504_naming_the_stage() -> None:
    clock = FakeClock()
    guard = ragguard.Guard(Policy(stages={"embed": StagePolicy(timeout_s=0.5)}), clock=clock)

    @guard.guard("embed")
    async def embed(text: str) -> list[float]:
        await clock.sleep(30)  # the provider hangs; the attempt timer runs on the Guard's clock
        return [0.0]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await embed("q")
        raise AssertionError("unreachable")

    sent: list[dict[str, Any]] = []

    read = False

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await anyio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "root_path": "",
        "headers": [(b"x-tenant-id", b"acme")],
    }
    with anyio.fail_after(5):
        await RagguardMiddleware(app, guard=guard)(scope, receive, send)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 504
    body = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert body["error"] == "StageTimeout" and "embed" in body["detail"]
