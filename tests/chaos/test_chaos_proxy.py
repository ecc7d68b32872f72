"""FaultProxy against a real redis-server and a real grpc.aio server."""

from __future__ import annotations

import asyncio
import errno
import socket
import time

import grpc
import pytest
import redis
import redis.asyncio as aredis
from chaos_helpers import echo_stub, grpc_channel, grpc_echo_server
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ragguard.chaos import FaultProxy

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def _client(proxy: FaultProxy, **kw: object) -> aredis.Redis:
    """A redis.asyncio client through ``proxy`` that does not retry (faults must surface)."""
    kw.setdefault("socket_timeout", 2.0)
    return aredis.Redis(host=proxy.host, port=proxy.port, retry=Retry(NoBackoff(), 0), **kw)  # type: ignore[arg-type]


async def _timed_ping(client: aredis.Redis) -> float:
    t0 = time.perf_counter()
    assert await client.ping()
    return time.perf_counter() - t0


async def test_latency_per_direction_delays_round_trips(redis_server) -> None:
    async with FaultProxy(redis_server.port) as proxy:
        client = _client(proxy)
        await client.ping()  # connect before measuring
        healthy = await _timed_ping(client)
        proxy.set_latency(to_server_s=0.1, to_client_s=0.15)
        slowed = await _timed_ping(client)
        proxy.heal()
        healed = await _timed_ping(client)
        await client.aclose()
    assert slowed >= 0.25
    assert healthy < 0.1 and healed < 0.1


async def test_latency_does_not_cut_throughput(redis_server) -> None:
    async with FaultProxy(redis_server.port) as proxy:
        client = _client(proxy)
        await asyncio.gather(*(client.ping() for _ in range(5)))  # five pooled connections, handshaken
        proxy.set_latency(to_client_s=0.2)
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(client.ping() for _ in range(5)))
        elapsed = time.perf_counter() - t0
        await client.aclose()
    assert all(replies)
    # Five pipelined-through-a-pool round trips run concurrently: ~0.2 s, not 5 x 0.2 s.
    assert 0.2 <= elapsed < 0.6


async def test_bandwidth_cap_slows_a_large_reply(redis_server) -> None:
    value = b"x" * 200_000
    async with FaultProxy(redis_server.port) as proxy:
        client = _client(proxy, socket_timeout=5.0)
        await client.set("big", value)
        t0 = time.perf_counter()
        assert await client.get("big") == value
        fast = time.perf_counter() - t0
        proxy.set_bandwidth(1_000_000)  # 1 MB/s -> >= 0.2 s for 200 kB
        t0 = time.perf_counter()
        assert await client.get("big") == value
        capped = time.perf_counter() - t0
        await client.aclose()
    assert capped >= 0.18
    assert capped > 3 * fast


async def test_reset_sends_rst_to_open_and_new_connections(redis_server) -> None:
    async with FaultProxy(redis_server.port) as proxy:
        raw = await asyncio.open_connection(*proxy.address)
        raw[1].write(b"*1\r\n$4\r\nPING\r\n")
        assert await raw[0].readuntil(b"\r\n") == b"+PONG\r\n"

        proxy.reset()
        with pytest.raises(ConnectionResetError) as info:
            raw[1].write(b"*1\r\n$4\r\nPING\r\n")
            await raw[1].drain()
            await raw[0].read(16)
            await raw[0].read(16)
        assert info.value.errno == errno.ECONNRESET
        raw[1].close()

        client = _client(proxy)
        with pytest.raises(redis.ConnectionError):
            await client.ping()
        proxy.heal()
        assert await client.ping()
        await client.aclose()
    assert proxy.stats.reset >= 2


async def test_drop_accepts_but_never_answers(redis_server) -> None:
    async with FaultProxy(redis_server.port) as proxy:
        client = _client(proxy, socket_timeout=0.3)
        await client.ping()
        proxy.drop()
        t0 = time.perf_counter()
        with pytest.raises(redis.TimeoutError):
            await client.ping()
        assert time.perf_counter() - t0 >= 0.25
        # A new connection is accepted (no refusal) and also hangs.
        fresh = _client(proxy, socket_timeout=0.3)
        with pytest.raises(redis.TimeoutError):
            await fresh.ping()
        await client.aclose()
        await fresh.aclose()
        proxy.heal()
        healed = _client(proxy)
        assert await healed.ping()
        await healed.aclose()


async def test_close_after_n_bytes_truncates_the_reply(redis_server) -> None:
    async with FaultProxy(redis_server.port) as proxy:
        client = _client(proxy)
        await client.set("k", b"v" * 10_000)
        await client.aclose()
        proxy.close_after(100)
        reader, writer = await asyncio.open_connection(*proxy.address)
        writer.write(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")
        await writer.drain()
        received = b""
        for _ in range(100):  # bounded: at most 100 reads
            chunk = await asyncio.wait_for(reader.read(65536), 2.0)
            if not chunk:
                break
            received += chunk
        writer.close()
    assert len(received) == 100
    assert received.startswith(b"$10000\r\nvvv")


async def test_refuse_rejects_new_connections_but_keeps_open_ones(redis_server) -> None:
    async with FaultProxy(redis_server.port) as proxy:
        open_client = _client(proxy)
        await open_client.ping()
        proxy.refuse()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(*proxy.address)
        assert await open_client.ping()  # the established connection still works
        proxy.heal()
        fresh = _client(proxy)
        assert await fresh.ping()
        await fresh.aclose()
        await open_client.aclose()


async def test_stop_and_restart_on_the_same_port(redis_server) -> None:
    async with FaultProxy(redis_server.port) as proxy:
        port = proxy.port
        client = _client(proxy)
        await client.ping()
        proxy.stop()
        assert proxy.stats.active == 0
        with pytest.raises(redis.ConnectionError):
            await client.ping()
        proxy.restart()
        assert proxy.port == port
        assert await client.ping()
        await client.aclose()


async def test_close_releases_every_socket(redis_server) -> None:
    proxy = await FaultProxy(redis_server.port).open()
    clients = [_client(proxy) for _ in range(3)]
    for c in clients:
        await c.ping()
    assert proxy.stats.active == 3
    await proxy.aclose()
    assert proxy.stats.active == 0
    with pytest.raises(OSError):
        await asyncio.open_connection(*proxy.address)
    for c in clients:
        with pytest.raises(redis.ConnectionError):
            await c.ping()
        await c.aclose()


def test_thread_mode_controls_take_effect_before_returning(redis_server) -> None:
    with FaultProxy(redis_server.port) as proxy:
        client = redis.Redis(host=proxy.host, port=proxy.port, socket_timeout=2)
        assert client.ping()
        proxy.refuse()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(proxy.address, timeout=1)
        proxy.heal()
        socket.create_connection(proxy.address, timeout=1).close()
        client.close()
    assert proxy.stats.active == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"upstream_port": 0}, "upstream_port"),
        ({"upstream_port": 70000}, "upstream_port"),
        ({"upstream_port": 1, "port": -1}, "port"),
        ({"upstream_port": 1, "max_connections": 0}, "max_connections"),
    ],
)
def test_bad_options_name_the_field(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        FaultProxy(**kwargs)


def test_bad_fault_values_name_the_field() -> None:
    proxy = FaultProxy(6379)
    with pytest.raises(ValueError, match="to_client_s"):
        proxy.set_latency(to_client_s=-1)
    with pytest.raises(ValueError, match="bytes_per_s"):
        proxy.set_bandwidth(0)
    with pytest.raises(ValueError, match="n_bytes"):
        proxy.close_after(-5)


async def test_grpc_through_the_proxy_unavailable_and_deadline_exceeded() -> None:
    async with grpc_echo_server() as port, FaultProxy(port) as proxy:
        channel = grpc_channel(proxy.target)
        echo = echo_stub(channel)
        assert await echo(b"hello", timeout=5) == b"hello"

        proxy.drop()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await echo(b"lost", timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

        proxy.heal()
        proxy.stop()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await echo(b"down", timeout=2)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE

        proxy.restart()
        reply = None
        for _ in range(40):  # bounded: the channel reconnects within its 100 ms backoff
            try:
                reply = await echo(b"back", timeout=1)
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.05)
        assert reply == b"back"
        await channel.close()


async def test_grpc_latency_through_the_proxy() -> None:
    async with grpc_echo_server() as port, FaultProxy(port) as proxy:
        channel = grpc_channel(proxy.target)
        echo = echo_stub(channel)
        await echo(b"warm", timeout=5)
        proxy.set_latency(to_client_s=0.2)
        t0 = time.perf_counter()
        assert await echo(b"slow", timeout=5) == b"slow"
        assert time.perf_counter() - t0 >= 0.2
        await channel.close()
