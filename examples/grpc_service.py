"""A tiny guarded grpc.aio search service and its client, on loopback; runs and exits.

    .venv/bin/python examples/grpc_service.py

The server knows the caller's tenant by its API key (x-api-key metadata), admits each call under
that tenant's quota, bounds it by the caller's deadline, maps ragguard errors to gRPC statuses and
sends Snappy-compressed hits to clients that ask.
The client propagates its tenant and deadline and gets errors its breakers understand.
No protoc: messages are JSON bytes.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # keep gRPC's C core from logging connection teardown

import grpc
from grpc import aio

import ragguard
from ragguard.grpc import (
    APIKeyResolver,
    GuardServerInterceptor,
    RemoteQuotaExceeded,
    SnappyServerInterceptor,
    client_interceptors,
    snappy_channel,
)

SERVICE = "demo.Search"
POLICY = ragguard.Policy(tenants={"acme": ragguard.TenantQuota(max_concurrency=1, timeout_s=2.0)})
ACME_KEY = "demo-key-acme-4b1f"  # in a real service: from a secret store
ACME = (("x-api-key", ACME_KEY),)


def encode(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def decode(data: bytes) -> Any:
    return json.loads(data)


async def search(
    request: dict[str, Any], context: aio.ServicerContext[Any, Any]
) -> AsyncIterator[dict[str, Any]]:
    """Stream the top hits for a query, one message per hit."""
    if not request.get("query"):
        raise ragguard.InvalidInput("query must be a non-empty string")  # -> INVALID_ARGUMENT
    for rank in range(request.get("k", 3)):
        await asyncio.sleep(0.01)
        yield {
            "rank": rank,
            "tenant": ragguard.current_tenant(),
            "budget_s": round(ragguard.remaining() or 0.0, 2),
            "text": f"passage {rank} about {request['query']} " * 40,
        }


async def serve(guard: ragguard.Guard) -> tuple[aio.Server, int]:
    # the guard first: a call its tenant's quota refuses is never decompressed
    keys = APIKeyResolver({ACME_KEY: "acme"})
    server = aio.server(
        interceptors=[GuardServerInterceptor(guard=guard, tenant_resolver=keys), SnappyServerInterceptor()]
    )
    handler = grpc.unary_stream_rpc_method_handler(
        search, request_deserializer=decode, response_serializer=encode
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Search": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def main() -> None:
    server, port = await serve(ragguard.Guard(POLICY))
    channel = snappy_channel(aio.insecure_channel(f"127.0.0.1:{port}", interceptors=client_interceptors()))
    stub = channel.unary_stream(f"/{SERVICE}/Search", request_serializer=encode, response_deserializer=decode)
    client = ragguard.Guard()  # the client side's own registry (no quotas configured)
    try:
        async with client.tenant("acme"):
            with ragguard.deadline(1.5):
                hits = [hit async for hit in stub({"query": "circuit breakers", "k": 3}, metadata=ACME)]
        for hit in hits:
            size = len(hit["text"])
            print(f"hit {hit['rank']}: tenant={hit['tenant']} budget_s={hit['budget_s']} text={size} B")

        # Two concurrent calls of a tenant allowed one at a time: the second is refused.
        async def one(query: str) -> str:
            async with client.tenant("acme"):
                try:
                    return f"{len([h async for h in stub({'query': query, 'k': 5}, metadata=ACME)])} hits"
                except RemoteQuotaExceeded as exc:
                    return f"refused: retry after {exc.retry_after_s:.3f}s ({exc.code().name})"

        print("concurrent:", await asyncio.gather(one("first"), one("second")))

        # Claiming the tenant in metadata is not its API key: the call runs as "default".
        forged = (("x-tenant-id", "acme"),)
        claimed = [hit async for hit in stub({"query": "quotas", "k": 1}, metadata=forged)]
        print("claimed acme: ran as", claimed[0]["tenant"])

        try:
            [hit async for hit in stub({"query": ""})]
        except aio.AioRpcError as exc:
            print("bad input:", exc.code().name, "-", exc.details())
    finally:
        await channel.close()
        await server.stop(None)


if __name__ == "__main__":
    asyncio.run(main())
