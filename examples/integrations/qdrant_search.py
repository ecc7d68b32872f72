"""Qdrant searches as the vector-store stage, over REST or gRPC, with a keyword fallback.

    .venv/bin/python examples/integrations/qdrant_search.py --url http://127.0.0.1:6333
    .venv/bin/python examples/integrations/qdrant_search.py --host 127.0.0.1 --grpc-port 6334

Each search runs under the stage's timeout and typed breaker, retried after a 429's Retry-After;
when the store is down (refused, 5xx, UNAVAILABLE) or its breaker is open, the keyword search
answers and says so. Needs the ``qdrant`` extra: pip install '/path/to/ragguard[qdrant]'.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from qdrant_client import AsyncQdrantClient

import ragguard
from ragguard.integrations.qdrant import guard_qdrant


def keyword_search(collection_name: str, **search: Any) -> list[str]:
    return [f"keyword hit in {collection_name}"]  # yours: BM25 over the same documents


async def main(client: AsyncQdrantClient, queries: int, deadline_s: float = 1.0) -> None:
    store = guard_qdrant(client, fallback=keyword_search)
    try:
        for i in range(queries):
            async with ragguard.tenant("acme"), ragguard.deadline(deadline_s):
                hits = await store.query_points("docs", query=[0.1, 0.2, 0.3], limit=5)
                served = ragguard.degraded()
            shown = hits if served else [p.id for p in hits.points]
            print(f"query {i}: {shown} {'(' + served[0] + ')' if served else ''}")
        print(f"vector_store breaker: {ragguard.default_guard().breaker('vector_store').state.value}")
    finally:
        await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="REST, e.g. http://127.0.0.1:6333")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--grpc-port", type=int, help="gRPC instead of REST")
    parser.add_argument("--queries", type=int, default=3)
    parser.add_argument("--deadline-s", type=float, default=1.0,
                        help="each request's deadline; the store's share is a quarter of it")
    args = parser.parse_args()
    if args.grpc_port:
        raw = AsyncQdrantClient(
            host=args.host, grpc_port=args.grpc_port, prefer_grpc=True, check_compatibility=False
        )
    else:
        raw = AsyncQdrantClient(url=args.url or "http://127.0.0.1:6333", check_compatibility=False)
    asyncio.run(main(raw, args.queries, args.deadline_s))
