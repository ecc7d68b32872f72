"""A guarded FastAPI RAG endpoint with no status-mapping code at all; runs and exits.

    .venv/bin/python examples/fastapi_service.py            # serves on loopback, calls itself, exits
    .venv/bin/python examples/fastapi_service.py --serve    # keeps serving on 127.0.0.1:8000

The endpoint is plain FastAPI: it calls guarded stages and returns their answer. RagguardMiddleware
turns each request into a tenant block with the caller's deadline, and ragguard's errors into 429,
503 and 504 with Retry-After. The tenant comes from the caller's API key (APIKeyResolver), not from
a header the caller could fill in with any tenant it likes. The embedding provider is called over
HTTP through GuardTransport, which hands it the tenant and what is left of the deadline, and turns
its 429/503 into errors the breakers understand. Needs ragguard's http extra:
``pip install '/path/to/ragguard[http]'`` (from a checkout: ``pip install '.[http]'``;
``ragguard`` on PyPI is another project).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

import ragguard
from ragguard.asgi import APIKeyResolver, RagguardMiddleware, StatusEndpoint
from ragguard.httpx import GuardTransport

DOCS = {
    "breakers": "A circuit breaker fails fast while a dependency is down.",
    "quotas": "Tenant quotas keep one greedy tenant from starving the rest.",
    "deadlines": "A deadline shrinks as the request moves through the pipeline.",
}

ragguard.configure(
    {
        "tenants": {"acme": {"rate_per_s": 0.2, "burst": 2}},
        "stages": {"vector_store": {"breaker": {"minimum_calls": 1, "window_size": 1}}},
    }
)

# -- the embedding provider: another HTTP service (here a toy one, on the same server) -------

provider = FastAPI()


@provider.post("/embed")
async def provider_embed(body: dict[str, list[str]]) -> dict[str, Any]:
    return {"vectors": [[float(len(t)), float(t.count(" "))] for t in body["texts"]]}


# -- the RAG service -------------------------------------------------------------------------

store_up = True


@ragguard.guard("embedding")
async def embed(texts: list[str]) -> list[list[float]]:
    async with httpx.AsyncClient(base_url=PROVIDER_URL, transport=GuardTransport()) as client:
        reply = await client.post("/embed", json={"texts": texts})
        return list(reply.json()["vectors"])


async def keyword_search(vector: list[float], k: int, query: str) -> list[str]:
    return [name for name in DOCS if name[:-1] in query][:k] or ["(no keyword match)"]


@ragguard.guard("vector_store", fallback=keyword_search)
async def search(vector: list[float], k: int, query: str) -> list[str]:
    if not store_up:
        raise ConnectionRefusedError("vector store is down")
    return sorted(DOCS, key=lambda name: abs(len(DOCS[name]) - vector[0] * 2))[:k]


app = FastAPI()


@app.get("/ask")
async def ask(q: str) -> dict[str, Any]:
    vectors = await embed([q])
    hits = await search(vectors[0], 2, q)
    return {"tenant": ragguard.current_tenant(), "answer": [DOCS.get(h, h) for h in hits]}


app.add_route("/health", StatusEndpoint())  # exempt from quotas; Guard.status() as JSON
# who is calling (by API key; a request without one runs as the "default" tenant), deadline, quota,
# and every status mapping; /provider stands in for the external embedding service, so its
# traffic is not this service's to count. In a real service the keys come from a secret store.
ACME_KEY = "demo-key-acme-4b1f"
app.add_middleware(
    RagguardMiddleware,
    tenant_resolver=APIKeyResolver({ACME_KEY: "acme"}),
    exempt_paths=("/health", "/metrics", "/provider"),
)
app.mount("/provider", provider)

PROVIDER_URL = "http://127.0.0.1:8000/provider"


async def tour(base: str) -> None:
    global store_up
    async with httpx.AsyncClient(base_url=base) as client:
        acme = {"x-api-key": ACME_KEY, "x-request-timeout-ms": "2000"}
        ok = await client.get("/ask", params={"q": "what do quotas do?"}, headers=acme)
        print("200:", ok.status_code, ok.json())
        await client.get("/ask", params={"q": "again"}, headers=acme)  # burst 2, then one per 5 s
        throttled = await client.get("/ask", params={"q": "and again"}, headers=acme)
        print(
            f"429: {throttled.status_code} Retry-After={throttled.headers['retry-after']} "
            f"retry-after-ms={throttled.headers['retry-after-ms']} RateLimit={throttled.headers['ratelimit']}"
        )
        store_up = False
        served = await client.get("/ask", params={"q": "how do breakers work?"})
        print("degraded:", served.status_code, "ragguard-degraded:", served.headers.get("ragguard-degraded"))
        spent = await client.get("/ask", params={"q": "late"}, headers={"x-request-timeout-ms": "0"})
        print("504:", spent.status_code, spent.json()["detail"])
        unknown = await client.get("/ask", params={"q": "who?"}, headers={"x-api-key": "guessed"})
        challenge = unknown.headers["www-authenticate"]
        print("401:", unknown.status_code, unknown.json()["detail"], f"(WWW-Authenticate: {challenge})")
        claimed = await client.get("/ask", params={"q": "quotas"}, headers={"x-tenant-id": "acme"})
        print("claimed acme:", claimed.status_code, "ran as", claimed.json()["tenant"])
        twice = await client.get("/ask", params={"q": "who?"}, headers=[("x-api-key", ACME_KEY)] * 2)
        print("400:", twice.status_code, twice.json()["detail"])
        health = await client.get("/health")
        print("health:", health.status_code, health.json()["open"])


def main() -> None:
    global PROVIDER_URL
    if "--serve" in sys.argv:
        uvicorn.run(app, host="127.0.0.1", port=8000)
        return
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    PROVIDER_URL = base + "/provider"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        threading.Event().wait(0.01)
    try:
        asyncio.run(tour(base))
    finally:
        server.should_exit = True
        thread.join(10)


if __name__ == "__main__":
    main()
