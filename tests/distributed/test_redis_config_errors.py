"""Issue 21, item 7: credentials and permissions are configuration errors, not "Redis unreachable".

Against a real redis-server with ACL users (``--user``) and with TLS (``--tls-port``, certificates
from ``trustme``): a wrong password, an ACL user who may PING but not run the scripts (or not one of
their commands), and an untrusted certificate are each logged once at ERROR naming the cause, never
the password; ``start(strict=True)`` raises ConfigError instead; the health probe runs a script
that checks every command, so the component stays on local state instead of flapping; a fixed ACL
is picked up by the next probe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aredis
import trustme
from distributed_helpers import make_client, until
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ragguard import CircuitBreaker, ConfigError, Guard, Policy, TenantQuota
from ragguard.chaos import RedisServer
from ragguard.chaos._redis_server import find_redis_server, free_port
from ragguard.redis import (
    RedisBackend,
    RedisQuotas,
    SharedCircuitBreaker,
    SharedStateDegraded,
    SharedStateRestored,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60),
              pytest.mark.skipif(find_redis_server() is None, reason="redis-server not found")]

SECRET = "s3cret-Pa55word"
QUOTA = TenantQuota(max_concurrency=2)
# The commands ragguard's quota scripts run, on its keys; "limited" may not run ZADD among them.
ALL = ["~*", "&*", "+ping", "+evalsha", "+script|load", "+time", "+zcard", "+zscore", "+zadd", "+zrem",
       "+zrank", "+zrangebyscore", "+zremrangebyscore", "+pexpire", "+pttl", "+hgetall", "+hset", "+hdel"]


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    users = [
        ("--user", "ragguard", "on", f">{SECRET}", "+@all", "~*", "&*"),
        ("--user", "pinger", "on", f">{SECRET}", "~*", "&*", "+ping"),  # PING works, scripts do not
        ("--user", "limited", "on", f">{SECRET}", *[p for p in ALL if p != "+zadd"]),
    ]
    with RedisServer(extra_args=[arg for user in users for arg in user]) as server:
        yield server


def acl_client(server: RedisServer, user: str, password: str = SECRET) -> aredis.Redis:
    return make_client(server.host, server.port, username=user, password=password)


def problems(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def settle(seen: list[Any], seconds: float) -> tuple[int, int]:
    await asyncio.sleep(seconds)
    return (sum(isinstance(e, SharedStateDegraded) for e in seen),
            sum(isinstance(e, SharedStateRestored) for e in seen))


async def test_a_wrong_password_is_an_error_naming_the_cause(acl_server: RedisServer, seen: list[Any],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    client = acl_client(acl_server, "ragguard", password=SECRET + "-wrong")
    q = RedisQuotas(lambda t: QUOTA, client, probe_every_s=0.2)
    try:
        with pytest.raises(ConfigError) as info:
            await q.start(strict=True)
        assert "authentication failed" in str(info.value) and SECRET not in str(info.value)
        assert not q.shared and q.problem is not None and "authentication failed" in q.problem
        lease = await q.acquire("acme")  # the fallback admits: no user call fails for it
        assert lease is not None and not lease.shared  # type: ignore[attr-defined]
        q.release(lease)
        assert await settle(seen, 1.0) == (1, 0)  # stays on local state: no flapping
        errors = problems(caplog)
        assert len(errors) == 1 and "authentication failed" in errors[0]  # once, at ERROR
        assert SECRET not in caplog.text
        assert all(SECRET not in e.reason for e in seen if isinstance(e, SharedStateDegraded))
    finally:
        await q.aclose()
        await client.aclose()


async def test_start_without_strict_falls_back_and_the_guard_can_be_told_to_raise(
    acl_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = acl_client(acl_server, "ragguard", password="not-it")
    g = Guard(Policy(tenants={"acme": QUOTA}), backend=RedisBackend(client))
    try:
        assert await g.start() is g  # logs and falls back
        assert not g.quotas.shared and len(problems(caplog)) == 1
        with pytest.raises(ConfigError, match="quotas: authentication failed"):
            await g.start(strict=True)
        async with g.tenant("acme"):  # still serving, on the fallback
            pass
    finally:
        await g.aclose()
        await client.aclose()


async def test_an_acl_user_who_may_ping_but_not_run_scripts_does_not_flap(
    acl_server: RedisServer, seen: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    client = acl_client(acl_server, "pinger")
    q = RedisQuotas(lambda t: QUOTA, client, probe_every_s=0.1)
    try:
        leases = [await q.acquire("acme") for _ in range(2)]  # NOPERM on the first: the fallback admits
        assert not any(lease.shared for lease in leases)  # type: ignore[union-attr]
        degraded, restored = await settle(seen, 1.5)  # 15 probes
        assert (degraded, restored) == (1, 0)  # a PING probe would have flapped every 0.1 s
        assert not q.shared and q.problem is not None and "permission denied" in q.problem
        assert len(problems(caplog)) == 1 and "NOPERM" in problems(caplog)[0]
        with pytest.raises(ConfigError, match="permission denied"):
            await q.start(strict=True)
    finally:
        await q.aclose()
        await client.aclose()


async def test_a_command_the_acl_denies_inside_the_scripts_is_named_and_a_fixed_acl_is_picked_up(
    acl_server: RedisServer, seen: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    client = acl_client(acl_server, "limited")
    admin = make_client(acl_server.host, acl_server.port)
    q = RedisQuotas(lambda t: QUOTA, client, probe_every_s=0.1)
    try:
        with pytest.raises(ConfigError) as info:
            await q.start(strict=True)  # EVALSHA and the keys are allowed: the probe finds ZADD
        assert "may not run ZADD" in str(info.value)
        assert await settle(seen, 0.5) == (1, 0)
        await admin.execute_command("ACL", "SETUSER", "limited", "+zadd")  # the operator fixes it
        assert await until(lambda: q.shared, 3.0) < 3.0
        lease = await q.acquire("acme")
        assert lease is not None and lease.shared  # type: ignore[attr-defined]
        q.release(lease)
        assert q.problem is None and len(problems(caplog)) == 1
    finally:
        await admin.execute_command("ACL", "SETUSER", "limited", "-zadd")
        await q.aclose()
        await client.aclose()
        await admin.aclose()


async def test_a_shared_breaker_reports_the_same_causes(acl_server: RedisServer,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    client = acl_client(acl_server, "pinger")
    b = SharedCircuitBreaker(CircuitBreaker("search"), client, redis_timeout_s=0.5)
    try:
        with pytest.raises(ConfigError, match="breaker:search: permission denied"):
            await b.start(strict=True)
        assert not b.shared
        b.on_result(b.acquire(), 0.01, None)  # its wrapped breaker decides meanwhile
        later = SharedCircuitBreaker(CircuitBreaker("rerank"), client, redis_timeout_s=0.5)
        later.on_result(later.acquire(), 0.01, None)  # built later, never started: its first use
        assert await until(lambda: any("breaker:rerank" in m for m in problems(caplog)), 3.0) < 3.0
        await later.aclose()
    finally:
        await b.aclose()
        await client.aclose()
    assert any("breaker:search" in m and "NOPERM" in m for m in problems(caplog))


# -- TLS ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, int, Path]]:
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    trustme.CA().cert_pem.write_to_path(str(d / "other-ca.pem"))  # a CA that signed nothing here
    port = free_port()
    args = ["--tls-port", str(port), "--tls-cert-file", str(d / "cert.pem"), "--tls-key-file",
            str(d / "key.pem"), "--tls-ca-cert-file", str(d / "ca.pem"), "--tls-auth-clients", "no"]
    try:
        server = RedisServer(extra_args=args).start()
    except Exception as exc:  # pragma: no cover - a redis-server built without TLS
        pytest.skip(f"redis-server without TLS support: {exc}")
    try:
        yield server, port, d
    finally:
        server.close()


def tls_client(port: int, ca: Path) -> aredis.Redis:
    return aredis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca), socket_timeout=2.0,
                        socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0))


async def test_an_untrusted_tls_certificate_is_an_error_naming_the_cause(
    tls_server: tuple[RedisServer, int, Path], seen: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    _, port, d = tls_server
    client = tls_client(port, d / "other-ca.pem")
    q = RedisQuotas(lambda t: QUOTA, client, probe_every_s=0.2)
    try:
        with pytest.raises(ConfigError) as info:
            await q.start(strict=True)
        assert "TLS: the server's certificate is not trusted" in str(info.value)
        lease = await q.acquire("acme")
        assert lease is not None and not lease.shared  # type: ignore[attr-defined]
        q.release(lease)
        assert await settle(seen, 0.6) == (1, 0)
        assert len(problems(caplog)) == 1 and "certificate" in problems(caplog)[0]
    finally:
        await q.aclose()
        await client.aclose()


async def test_a_trusted_tls_certificate_serves_the_shared_quota(tls_server: tuple[RedisServer, int, Path],
                                                                caplog: pytest.LogCaptureFixture) -> None:
    _, port, d = tls_server
    client = tls_client(port, d / "ca.pem")
    q = RedisQuotas(lambda t: QUOTA, client)
    try:
        await q.start(strict=True)
        leases = [await q.acquire("acme") for _ in range(2)]
        assert all(lease.shared for lease in leases)  # type: ignore[union-attr]
        for lease in leases:
            q.release(lease)
        assert q.shared and not problems(caplog)
    finally:
        await q.aclose()
        await client.aclose()


async def test_a_read_only_replica_is_an_error_naming_the_cause(redis_server: Any, seen: list[Any],
                                                                caplog: pytest.LogCaptureFixture) -> None:
    with RedisServer(extra_args=["--replicaof", redis_server.host, str(redis_server.port)]) as replica:
        client = make_client(replica.host, replica.port)
        q = RedisQuotas(lambda t: QUOTA, client, probe_every_s=0.1)
        try:
            with pytest.raises(ConfigError, match="read-only replica"):
                await q.start(strict=True)
            lease = await q.acquire("acme")
            assert lease is not None and not lease.shared  # type: ignore[attr-defined]
            q.release(lease)
            assert await settle(seen, 0.6) == (1, 0)  # the probe writes too: no flapping
            assert len(problems(caplog)) == 1 and "READONLY" in problems(caplog)[0]
        finally:
            await q.aclose()
            await client.aclose()


async def test_doctor_says_redis_refused_the_configuration_not_that_it_was_unreachable(
    acl_server: RedisServer, tmp_path: Path
) -> None:
    from ragguard.monitors._record import EventRecorder, load_records
    from ragguard_tools.doctor import diagnose

    path = tmp_path / "events.jsonl"
    client = acl_client(acl_server, "ragguard", password="not-it")
    q = RedisQuotas(lambda t: QUOTA, client, probe_every_s=0.2)
    try:
        with EventRecorder(path=path):
            await q.start()
            assert not q.shared
            await asyncio.sleep(0.01)  # listeners get the bus's events when the loop runs them
    finally:
        await q.aclose()
        await client.aclose()
    (f,) = [f for f in diagnose(load_records(path)).findings if f.kind == "shared_state"]
    assert f.summary.startswith("shared state: Redis refused ragguard's configuration"), f.summary
    assert "unreachable" not in f.summary
