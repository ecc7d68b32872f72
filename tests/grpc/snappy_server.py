"""A guarded grpc.aio server with Snappy requests, run as its own process so a test can read its
peak RSS (VmHWM). Prints its port, serves until stdin closes.

    python snappy_server.py MAX_CONCURRENCY HOLD_S

Tenant ``acme`` may run MAX_CONCURRENCY calls at once; each call holds its (decompressed)
request HOLD_S seconds, then answers its length.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc
from grpc import aio

import ragguard
from ragguard.grpc import GuardServerInterceptor, SnappyServerInterceptor


async def main(max_concurrency: int, hold_s: float) -> None:
    guard = ragguard.Guard(
        ragguard.Policy(tenants={"acme": ragguard.TenantQuota(max_concurrency=max_concurrency)})
    )

    async def ingest(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        await asyncio.sleep(hold_s)
        return str(len(request)).encode()

    server = aio.server(interceptors=[GuardServerInterceptor(guard=guard), SnappyServerInterceptor()])
    handler = grpc.method_handlers_generic_handler(
        "t.Ingest", {"Put": grpc.unary_unary_rpc_method_handler(ingest)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
