"""Per-request cost of RagguardMiddleware, each figure beside its baselines measured in the same run.

    .venv/bin/python benchmarks/http_middleware.py [--requests 5000] [--rounds 7]

Every variant serves the same tiny pure-ASGI app (one JSON response) ``requests`` times per round,
called in-process with a synthetic receive/send (no server, no sockets: the middleware's own cost).
Contenders run interleaved, round by round; the figure is the median over rounds of microseconds
per request, with the spread (min-max) beside it. Variants:

- bare app: the floor.
- by hand: what the middleware does, written inline by a user: read the tenant header, ``async
  with guard.tenant(...)``, catch QuotaExceeded into a 429 (no deadline header, no disconnect
  watching, no degraded header).
- RagguardMiddleware without watching for disconnects (``cancel_on_disconnect=False``).
- RagguardMiddleware as shipped (the disconnect watcher starts only once the app waits or reads:
  this app answers at once, so it pays only for the bookkeeping).
- RagguardMiddleware with the server bound (``max_concurrent_requests=64``: a seat per request,
  docs/http.md), never full here: what the seat costs.

Target (issue 19): the shipped configuration costs at most 1.5x the one without the watcher,
paired per round, printed as a MET/GAP line.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rich.console import Console
from rich.table import Table

import ragguard
from _bench import Target, header, print_targets
from ragguard.asgi import RagguardMiddleware

GUARD = ragguard.Guard(ragguard.Policy(tenants={"acme": ragguard.TenantQuota(max_concurrency=1000)}))
SCOPE: dict[str, Any] = {
    "type": "http",
    "method": "GET",
    "path": "/ask",
    "root_path": "",
    "headers": [(b"host", b"bench"), (b"x-tenant-id", b"acme"), (b"x-request-timeout-ms", b"2000")],
    "asgi": {"version": "3.0", "spec_version": "2.3"},
}
BODY = b'{"answer":"42"}'
START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json"), (b"content-length", b"15")],
}

App = Callable[[Any, Any, Any], Awaitable[None]]


async def app(scope: Any, receive: Any, send: Any) -> None:
    await send(START)
    await send({"type": "http.response.body", "body": BODY, "more_body": False})


def by_hand(inner: App) -> App:
    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        tenant = "default"
        for key, value in scope["headers"]:
            if key == b"x-tenant-id":
                tenant = value.decode("latin-1")
        try:
            async with GUARD.tenant(tenant):
                await inner(scope, receive, send)
        except ragguard.QuotaExceeded as exc:
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"retry-after", str(max(1, round(exc.retry_after_s))).encode())]})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    return wrapped


class Server:
    """The server side of one in-process request: a receive that, once the body is read, waits
    for the response to complete and then reports a disconnect, as uvicorn's does."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.sent = 0

    async def receive(self) -> dict[str, Any]:
        if not hasattr(self, "_read"):
            self._read = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.done.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Any) -> None:
        self.sent += 1
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.done.set()


async def one_round(target: App, requests: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(requests):
        server = Server()
        await target(SCOPE, server.receive, server.send)
    return (time.perf_counter_ns() - start) / requests / 1000.0


async def run(requests: int, rounds: int) -> None:
    variants: dict[str, App] = {
        "bare app": app,
        "by hand: tenant() + 429, inline": by_hand(app),
        "RagguardMiddleware, cancel_on_disconnect=False": RagguardMiddleware(
            app, guard=GUARD, cancel_on_disconnect=False
        ),
        "RagguardMiddleware (as shipped)": RagguardMiddleware(app, guard=GUARD),
        "RagguardMiddleware, max_concurrent_requests=64": RagguardMiddleware(
            app, guard=GUARD, max_concurrent_requests=64
        ),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for target in variants.values():  # warm up
        await one_round(target, 200)
    names = list(variants)
    for round_no in range(rounds):
        shift = round_no % len(names)  # interleaved, in an order that rotates from round to round
        for name in names[shift:] + names[:shift]:
            samples[name].append(await one_round(variants[name], requests))
    floor = statistics.median(samples["bare app"])
    hand = statistics.median(samples["by hand: tenant() + 429, inline"])
    table = Table(title=f"per-request cost, median of {rounds} rounds x {requests} requests (us/request)")
    for column in ("variant", "us/request", "spread", "x bare app", "x by hand"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for name, values in samples.items():
        median = statistics.median(values)
        table.add_row(
            name,
            f"{median:.1f}",
            f"{min(values):.1f}-{max(values):.1f}",
            f"{median / floor:.2f}",
            f"{median / hand:.2f}",
        )
    Console(width=130).print(table)
    shipped = statistics.median(samples["RagguardMiddleware (as shipped)"])
    print(f"middleware over the bare app: +{shipped - floor:.1f} us per request; "
          f"{shipped / hand:.2f}x the hand-written minimum, which maps only 429")
    paired = [
        a / b
        for a, b in zip(
            samples["RagguardMiddleware (as shipped)"],
            samples["RagguardMiddleware, cancel_on_disconnect=False"],
            strict=True,
        )
    ]
    detail = f"rounds {min(paired):.2f}-{max(paired):.2f}"
    print_targets([Target("shipped middleware vs without the disconnect watcher", statistics.median(paired),
                          1.5, detail)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    header()
    asyncio.run(run(args.requests, args.rounds))


if __name__ == "__main__":
    main()
