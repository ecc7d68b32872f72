"""A service whose status ``ragguard top`` watches (run as a script by test_top).

Usage: python _status_worker.py FALLBACKS_PER_S
Serves ``ragguard_tools.status.serve`` on a free 127.0.0.1 port, prints its URL (one line), then calls
a guarded stage whose dependency refuses every call, so its fallback serves about
FALLBACKS_PER_S calls a second, until it is killed.
"""

from __future__ import annotations

import asyncio
import sys

from ragguard import Guard
from ragguard_tools import status


async def main(per_s: float) -> None:
    g = Guard()

    async def cached(texts: list[str]) -> list[float]:
        return [0.0]

    @g.guard("embedding", fallback=cached)
    async def embed(texts: list[str]) -> list[float]:
        raise ConnectionRefusedError

    server = status.serve(0, g)
    print(server.url, flush=True)
    while True:
        await embed(["x"])
        await asyncio.sleep(1 / per_s)


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1])))
