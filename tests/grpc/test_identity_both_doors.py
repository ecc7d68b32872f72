"""Who is calling, at both front doors: the same tenant resolvers, refusals and priorities over a
real uvicorn server (httpx client) and a real grpc.aio server (stock grpcio client).

Each test runs once per door with one ``ask`` that sends fields (HTTP headers or gRPC metadata,
duplicates kept) and returns the outcome as a gRPC status name (HTTP statuses translated), so a
test states once what both doors must do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import jwt
import pytest
from grpc import aio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))  # the HTTP tests' uvicorn runner
from http_helpers import Gate, running

import ragguard
from ragguard import InvalidInput, Policy, TenantQuota
from ragguard.asgi import RagguardMiddleware
from ragguard.grpc import (
    APIKeyResolver,
    Caller,
    GuardServerInterceptor,
    HeaderResolver,
    Identity,
    PermissionDenied,
    Unauthenticated,
)
from ragguard.overload._priority import current_priority

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

DOORS = ["http", "grpc"]
HTTP_CODES = {
    200: "OK",
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    429: "RESOURCE_EXHAUSTED",
    500: "UNKNOWN",
    504: "DEADLINE_EXCEEDED",
}
KEYS: dict[str, str | Identity] = {
    "key-acme-7f3a": "acme",
    "key-ops-91c2": Identity("ops", trusted=True),
}
SECRET = "test-signing-secret-of-32-bytes!"
Fields = list[tuple[str, str]]


@dataclass
class Reply:
    code: str  # a grpc.StatusCode name
    detail: str
    body: dict[str, Any]
    headers: dict[str, str]


Ask = Callable[..., Awaitable[Reply]]


class Endpoint:
    """The one endpoint both doors serve: ``whoami`` tells what the guarded code sees, ``hold``
    parks it on a gate first (so a test can fill a tenant's slots)."""

    def __init__(self, guard: ragguard.Guard) -> None:
        self.guard = guard
        self.gate = Gate()
        self.runs = 0

    async def answer(self, what: str) -> dict[str, Any]:
        self.runs += 1
        if what == "hold":
            await self.gate.wait()
        if what in HANDLER_REFUSALS:
            refusal = HANDLER_REFUSALS[what][0]
            if what.startswith("guarded"):  # from inside a guarded call, through the stage's layers
                await self.guard.guard("authz")(_raising(refusal))()
            raise refusal
        tenant = ragguard.current_tenant()
        priority = current_priority() or self.guard.policy.quota(tenant).priority
        return {"tenant": tenant, "priority": priority}


def asgi_app(endpoint: Endpoint) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = json.dumps(await endpoint.answer(scope["path"].strip("/"))).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


@asynccontextmanager
async def door(kind: str, endpoint: Endpoint, **options: Any) -> AsyncIterator[Ask]:
    """Serve ``endpoint`` behind the ``kind`` door built with ``options``; yields ``ask``."""
    if kind == "http":
        with running(RagguardMiddleware(asgi_app(endpoint), guard=endpoint.guard, **options)) as url:
            async with httpx.AsyncClient(base_url=url) as client:

                async def ask_http(fields: Fields = (), what: str = "whoami") -> Reply:  # type: ignore[assignment]
                    reply = await client.get(f"/{what}", headers=list(fields))
                    json_reply = reply.headers.get("content-type") == "application/json"
                    body = reply.json() if json_reply else {}  # a server's own 500 is text
                    return Reply(
                        HTTP_CODES[reply.status_code], body.get("detail", ""), body, dict(reply.headers)
                    )

                yield ask_http
        return
    server = aio.server(interceptors=[GuardServerInterceptor(guard=endpoint.guard, **options)])

    async def handler(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        return json.dumps(await endpoint.answer(request.decode())).encode()

    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "t.Door", {"Ask": grpc.unary_unary_rpc_method_handler(handler)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            rpc = channel.unary_unary("/t.Door/Ask")

            async def ask_grpc(fields: Fields = (), what: str = "whoami") -> Reply:  # type: ignore[assignment]
                try:
                    answer = await rpc(what.encode(), metadata=tuple(fields), timeout=20)
                except aio.AioRpcError as exc:
                    return Reply(exc.code().name, exc.details() or "", {}, {})
                return Reply("OK", "", json.loads(answer), {})

            yield ask_grpc
    finally:
        await server.stop(None)


def _raising(exc: Exception) -> Callable[[], Awaitable[None]]:
    async def check() -> None:
        raise exc

    return check


HANDLER_REFUSALS: dict[str, tuple[Exception, str, int]] = {
    "unauthenticated": (
        Unauthenticated("session revoked", challenge='Bearer realm="rag"'), "UNAUTHENTICATED", 401
    ),
    "forbidden": (PermissionDenied("acme may not read this collection"), "PERMISSION_DENIED", 403),
    "guarded unauthenticated": (Unauthenticated("token expired"), "UNAUTHENTICATED", 401),
    "guarded forbidden": (PermissionDenied("acme may not rerank"), "PERMISSION_DENIED", 403),
}


def guard_of(**tenants: TenantQuota) -> ragguard.Guard:
    return ragguard.Guard(Policy(tenants=tenants))


async def held(ask: Ask, endpoint: Endpoint, fields: Fields, n: int) -> list[asyncio.Task[Reply]]:
    """``n`` requests with ``fields``, each parked inside the endpoint (holding its slot)."""
    tasks = [asyncio.create_task(ask(fields, "hold")) for _ in range(n)]
    for _ in range(500):
        if endpoint.runs >= n or any(t.done() for t in tasks):
            break
        await asyncio.sleep(0.01)
    return tasks


@pytest.mark.parametrize("case", list(HANDLER_REFUSALS))
@pytest.mark.parametrize("kind", DOORS)
async def test_a_refusal_raised_by_the_handler_is_401_or_403_and_unauthenticated_or_permission_denied(
    kind: str, case: str
) -> None:
    """The same answer as the resolver's refusal, whether the handler raises it itself or a guarded
    call inside it does (before the error table, the handler's refusal was a 500 / UNKNOWN)."""
    refusal, code, status = HANDLER_REFUSALS[case]
    endpoint = Endpoint(guard_of())
    async with door(kind, endpoint) as ask:
        reply = await ask(what=case)
    assert (reply.code, reply.detail) == (code, str(refusal))
    if kind == "http":
        assert reply.body["error"] == type(refusal).__name__
        assert reply.body["outcome"] == "caller_error"
        if status == 401:
            assert reply.headers["www-authenticate"] == refusal.challenge  # type: ignore[attr-defined]
        else:
            assert "www-authenticate" not in reply.headers


# --- 1. the tenant comes from a resolver, not from the client's word --------------------------


@pytest.mark.parametrize("kind", DOORS)
async def test_a_claimed_tenant_header_does_not_take_the_tenants_slot(kind: str) -> None:
    endpoint = Endpoint(guard_of(acme=TenantQuota(max_concurrency=1)))
    async with door(kind, endpoint, tenant_resolver=APIKeyResolver(KEYS)) as ask:
        forged = await held(ask, endpoint, [("x-tenant-id", "acme")], 3)
        real = await ask([("x-api-key", "key-acme-7f3a"), ("x-tenant-id", "globex")])
        endpoint.gate.release.set()
        claims = await asyncio.gather(*forged)
    assert (real.code, real.body.get("tenant")) == ("OK", "acme")
    assert [(c.code, c.body["tenant"]) for c in claims] == [("OK", "default")] * 3  # anonymous


@pytest.mark.parametrize("kind", DOORS)
async def test_an_anonymous_request_runs_as_the_anonymous_tenant_or_is_refused(kind: str) -> None:
    endpoint = Endpoint(guard_of())
    async with door(kind, endpoint, tenant_resolver=APIKeyResolver(KEYS)) as ask:
        default = await ask()
    async with door(kind, endpoint, tenant_resolver=APIKeyResolver(KEYS), anonymous="guest") as ask:
        guest = await ask()
    async with door(kind, endpoint, tenant_resolver=APIKeyResolver(KEYS), anonymous=None) as ask:
        runs = endpoint.runs
        refused = await ask([("x-tenant-id", "acme")])
        keyed = await ask([("x-api-key", "key-acme-7f3a")])
    assert default.body["tenant"] == "default" and guest.body["tenant"] == "guest"
    assert refused.code == "UNAUTHENTICATED" and "carries none" in refused.detail
    assert keyed.body["tenant"] == "acme" and endpoint.runs == runs + 1
    if kind == "http":
        assert refused.headers["www-authenticate"] == 'APIKey header="x-api-key"'


@pytest.mark.parametrize("kind", DOORS)
async def test_the_api_key_resolver(kind: str) -> None:
    endpoint = Endpoint(guard_of())
    async with door(kind, endpoint, tenant_resolver=APIKeyResolver(KEYS)) as ask:
        acme = await ask([("x-api-key", "key-acme-7f3a")])
        ops = await ask([("x-api-key", "key-ops-91c2")])
        unknown = await ask([("x-api-key", "key-acme-7f3b")])
    async with door(kind, endpoint, tenant_resolver=APIKeyResolver(KEYS, header="authorization")) as ask:
        bearer = await ask([("authorization", "Bearer key-acme-7f3a")])
        basic = await ask([("authorization", "Basic a2V5")])
    assert acme.body["tenant"] == "acme" and ops.body["tenant"] == "ops"
    assert (unknown.code, unknown.detail) == ("UNAUTHENTICATED", "unknown API key")
    assert "7f3b" not in unknown.detail
    assert bearer.body["tenant"] == "acme" and basic.code == "UNAUTHENTICATED"
    if kind == "http":
        assert basic.headers["www-authenticate"] == "Bearer"


def _raises(exc: Exception) -> Callable[[Caller], Any]:
    def resolver(caller: Caller) -> Any:
        raise exc

    return resolver


def _async_returns(value: object) -> Callable[[Caller], Any]:
    async def resolver(caller: Caller) -> Any:
        await asyncio.sleep(0)
        return value

    return resolver


RESOLVER_CASES: dict[str, tuple[Callable[[Caller], Any], str, str]] = {
    "unauthenticated": (_raises(Unauthenticated("token expired")), "UNAUTHENTICATED", "token expired"),
    "permission": (_raises(PermissionDenied("acme may not use /ask")), "PERMISSION_DENIED", "may not"),
    "invalid": (_raises(InvalidInput("malformed token")), "INVALID_ARGUMENT", "malformed token"),
    "bug": (_raises(KeyError("tenant")), "UNAUTHENTICATED", "credentials are missing or invalid"),
    "junk": (lambda caller: 42, "UNAUTHENTICATED", "credentials are missing or invalid"),
    "async junk": (_async_returns(["acme"]), "UNAUTHENTICATED", "credentials are missing or invalid"),
    "bad id": (lambda caller: "has space", "INVALID_ARGUMENT", "invalid tenant id"),
    "async bad identity": (_async_returns(Identity(7)), "INVALID_ARGUMENT", "tenant id must be a str"),  # type: ignore[arg-type]
    "async ok": (_async_returns(Identity("acme")), "OK", ""),
}


@pytest.mark.parametrize("case", list(RESOLVER_CASES))
@pytest.mark.parametrize("kind", DOORS)
async def test_a_resolver_that_raises_or_returns_junk_is_refused_never_a_500(
    kind: str, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    resolver, code, detail = RESOLVER_CASES[case]
    endpoint = Endpoint(guard_of())
    with caplog.at_level(logging.INFO, logger="ragguard.identity"):
        async with door(kind, endpoint, tenant_resolver=resolver) as ask:
            reply = await ask()
    assert reply.code == code and detail in reply.detail
    assert endpoint.runs == (1 if code == "OK" else 0)
    if case in ("bug", "junk", "async junk"):
        assert "tenant resolver" in caplog.text  # a broken resolver is logged, not shown to the client
        assert "KeyError" not in reply.detail


@pytest.mark.parametrize("kind", DOORS)
async def test_the_resolver_sees_the_request(kind: str) -> None:
    seen: dict[str, Any] = {}

    def resolver(caller: Caller) -> str:  # a Caller is valid while its resolver runs
        seen.update(door=caller.door, method=caller.method, peer=caller.peer)
        if caller.door == "http":
            seen["verb"] = caller.scope["method"]
        else:
            seen["security"] = caller.context.auth_context()["transport_security_type"]
        return caller.header("x-team") or "nobody"

    endpoint = Endpoint(guard_of())
    async with door(kind, endpoint, tenant_resolver=resolver) as ask:
        reply = await ask([("x-team", "blue")])
    assert reply.body["tenant"] == "blue" and seen["door"] == kind
    assert seen["peer"] is not None and "127.0.0.1:" in seen["peer"]
    if kind == "http":
        assert seen["method"] == "/whoami" and seen["verb"] == "GET"
    else:
        assert seen["method"] == "/t.Door/Ask" and seen["security"] == [b"insecure"]


# The verified-token resolver of docs/http.md and docs/grpc.md, as written there.
def token_tenant(caller: Caller) -> str | None:
    auth = caller.header("authorization")
    if auth is None:
        return None  # anonymous
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer":
        raise Unauthenticated("send 'authorization: Bearer <token>'")
    try:
        claims = jwt.decode(token, SECRET, algorithms=["HS256"], audience="rag-api")
    except jwt.InvalidTokenError as exc:
        raise Unauthenticated(f"invalid token: {exc}") from None
    return str(claims["tenant"])


@pytest.mark.parametrize("kind", DOORS)
async def test_a_verified_token_resolver(kind: str) -> None:
    good = jwt.encode({"tenant": "acme", "aud": "rag-api"}, SECRET, algorithm="HS256")
    forged = jwt.encode(
        {"tenant": "acme", "aud": "rag-api"}, "another-secret-of-32-bytes-long!", algorithm="HS256"
    )
    expired = jwt.encode({"tenant": "acme", "aud": "rag-api", "exp": 1}, SECRET, algorithm="HS256")
    endpoint = Endpoint(guard_of())
    async with door(kind, endpoint, tenant_resolver=token_tenant) as ask:
        ok = await ask([("authorization", f"Bearer {good}")])
        bad = await ask([("authorization", f"Bearer {forged}")])
        old = await ask([("authorization", f"Bearer {expired}")])
        claimed = await ask([("x-tenant-id", "acme")])
    assert ok.body["tenant"] == "acme"
    assert bad.code == "UNAUTHENTICATED" and "Signature verification failed" in bad.detail
    assert old.code == "UNAUTHENTICATED" and "expired" in old.detail
    assert claimed.body["tenant"] == "default"


@pytest.mark.parametrize("kind", DOORS)
async def test_rotating_tenant_ids_cannot_multiply_the_default_quota(kind: str) -> None:
    # 50 ids where each unnamed tenant gets 2 slots: together they must stay within the one
    # aggregate bound of tenants not named in the policy (by default the default quota itself)
    endpoint = Endpoint(ragguard.Guard(Policy(default_quota=TenantQuota(max_concurrency=2))))
    async with door(kind, endpoint) as ask:
        tasks = [asyncio.create_task(ask([("x-tenant-id", f"evil{i}")], "hold")) for i in range(50)]
        for _ in range(300):
            if endpoint.runs >= 50 or sum(t.done() for t in tasks) + endpoint.runs >= 50:
                break
            await asyncio.sleep(0.01)
        admitted = endpoint.runs
        endpoint.gate.release.set()
        replies = await asyncio.gather(*tasks)
    assert admitted <= 2, f"{admitted} of 50 rotating ids were admitted at once"
    assert sum(r.code == "RESOURCE_EXHAUSTED" for r in replies) >= 48


# --- 2. a client's priority can lower its tenant's, never raise it -----------------------------


@pytest.mark.parametrize("kind", DOORS)
async def test_a_sent_priority_lowers_never_raises_unless_trusted(kind: str) -> None:
    guard = guard_of(nightly=TenantQuota(priority="batch"), ops=TenantQuota(priority="interactive"))
    endpoint = Endpoint(guard)
    async with door(kind, endpoint) as ask:

        async def priority(tenant: str, sent: str | None) -> str:
            fields = [("x-tenant-id", tenant)] + ([] if sent is None else [("x-priority", sent)])
            reply = await ask(fields)
            return reply.body["priority"] if reply.code == "OK" else reply.code

        untrusted = [
            await priority("nightly", "critical"),
            await priority("nightly", "interactive"),
            await priority("ops", "critical"),
            await priority("ops", "batch"),
            await priority("ops", None),
            await priority("ops", "urgent"),
        ]
    assert untrusted == ["batch", "batch", "interactive", "batch", "interactive", "INVALID_ARGUMENT"]
    async with door(kind, endpoint, tenant_resolver=HeaderResolver(trusted=True)) as ask:
        trusted = [await priority("nightly", "critical"), await priority("ops", "batch")]
    async with door(kind, endpoint, tenant_resolver=APIKeyResolver(KEYS)) as ask:
        keyed = await ask([("x-api-key", "key-ops-91c2"), ("x-priority", "critical")])
    assert trusted == ["critical", "batch"]
    assert keyed.body == {"tenant": "ops", "priority": "critical"}  # ops' key is a trusted Identity


# --- 3. an ambiguous identity is refused the same way at both doors ---------------------------


AMBIGUOUS: dict[str, tuple[Fields, dict[str, Any]]] = {
    "tenant twice": ([("x-tenant-id", "evil"), ("x-tenant-id", "acme")], {}),
    "tenant twice, same value": ([("x-tenant-id", "acme"), ("x-tenant-id", "acme")], {}),
    "priority twice": ([("x-tenant-id", "acme"), ("x-priority", "batch"), ("x-priority", "critical")], {}),
    "api key twice": (
        [("x-api-key", "key-acme-7f3a"), ("x-api-key", "key-ops-91c2")],
        {"tenant_resolver": APIKeyResolver(KEYS)},
    ),
}


@pytest.mark.parametrize("case", list(AMBIGUOUS))
async def test_an_ambiguous_identity_is_refused_the_same_way_at_both_doors(case: str) -> None:
    fields, options = AMBIGUOUS[case]
    replies = {}
    for kind in DOORS:
        endpoint = Endpoint(guard_of())
        async with door(kind, endpoint, **options) as ask:
            replies[kind] = await ask(fields)
        assert endpoint.runs == 0
    assert replies["http"].code == replies["grpc"].code == "INVALID_ARGUMENT"
    assert replies["http"].detail == replies["grpc"].detail
    assert "sent 2 times" in replies["http"].detail


def test_door_options_are_checked() -> None:
    with pytest.raises(ragguard.ConfigError):
        GuardServerInterceptor(tenant_resolver="x-tenant-id")  # type: ignore[arg-type]
    with pytest.raises(ragguard.ConfigError) as info:
        GuardServerInterceptor(anonymous="has space")
    assert info.value.field == "anonymous"
    with pytest.raises(ragguard.ConfigError, match="not both"):
        RagguardMiddleware(
            asgi_app(Endpoint(guard_of())), tenant_header="x-team", tenant_resolver=HeaderResolver()
        )
    with pytest.raises(ragguard.ConfigError, match="not both"):
        GuardServerInterceptor(tenant_key="x-team", tenant_resolver=HeaderResolver())
    with pytest.raises(ragguard.ConfigError) as bad_tenant:
        APIKeyResolver({"secret-key-1": "has space"})
    assert "secret-key-1" not in str(bad_tenant.value)
    with pytest.raises(ragguard.ConfigError):
        APIKeyResolver({"": "acme"})
    assert "key-acme" not in repr(APIKeyResolver(KEYS))


# --- the gRPC auth context: the tenant from the client certificate (docs/grpc.md) -------------


def certificate_tenant(caller: Caller) -> str | None:  # as written in docs/grpc.md
    names = caller.context.auth_context().get("x509_common_name")
    return names[0].decode() if names else None  # the server checked the chain (mutual TLS)


def _certificates(tmp: Path) -> dict[str, bytes]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate whose CN is acme."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test-ca")
    (tmp / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, cn, ext in (("server", "127.0.0.1", ["-extfile", "san.ext"]), ("client", "acme", [])):
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "1",
            *ext,
        )
    return {p.name: p.read_bytes() for p in tmp.iterdir() if p.suffix in (".pem", ".key")}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="makes its certificates with openssl")
async def test_the_tenant_from_the_client_certificate_under_mutual_tls(tmp_path: Path) -> None:
    pem = _certificates(tmp_path)
    endpoint = Endpoint(guard_of(acme=TenantQuota(priority="batch")))
    server = aio.server(
        interceptors=[GuardServerInterceptor(guard=endpoint.guard, tenant_resolver=certificate_tenant)]
    )

    async def handler(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        return json.dumps(await endpoint.answer("whoami")).encode()

    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "t.Door", {"Ask": grpc.unary_unary_rpc_method_handler(handler)}
            ),
        )
    )
    credentials = grpc.ssl_server_credentials(
        [(pem["server.key"], pem["server.pem"])], root_certificates=pem["ca.pem"], require_client_auth=True
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    client = grpc.ssl_channel_credentials(pem["ca.pem"], pem["client.key"], pem["client.pem"])
    try:
        async with aio.secure_channel(f"127.0.0.1:{port}", client) as channel:
            answer = await channel.unary_unary("/t.Door/Ask")(
                b"", metadata=(("x-tenant-id", "globex"),), timeout=10
            )
    finally:
        await server.stop(None)
    assert json.loads(answer) == {"tenant": "acme", "priority": "batch"}


def test_a_broken_resolver_is_logged_with_its_traceback_the_first_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ragguard import _identity

    class Broken:
        def __call__(self, caller: Caller) -> str:
            raise LookupError("the key store is down")

    caller = _identity.HttpCaller({"type": "http", "path": "/", "headers": []})
    with caplog.at_level(logging.INFO, logger="ragguard.identity"):
        for _ in range(2):
            with pytest.raises(Unauthenticated) as info:
                _identity.resolve_identity(Broken(), caller, None)
            assert isinstance(info.value.__cause__, LookupError)
    first, second = [r for r in caplog.records if r.name == "ragguard.identity"]
    assert (first.levelno, second.levelno) == (logging.WARNING, logging.INFO)
    assert first.exc_info is not None and second.exc_info is None


def test_refusal_messages_are_bounded_and_pickle() -> None:
    long = Unauthenticated("x" * 500, challenge="APIKey")
    assert len(str(long)) == 200 and str(long).endswith("...")
    again = pickle.loads(pickle.dumps(long))
    assert (str(again), again.challenge) == (str(long), "APIKey")
    denied = pickle.loads(pickle.dumps(PermissionDenied("no")))
    assert str(denied) == "no"
