"""The plugin's own fixtures: a real redis-server and a running fault proxy."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import redis

from ragguard.chaos._redis_server import RedisServer, RedisServerUnavailable


@pytest.mark.timeout(30)
def test_redis_server_serves_and_restarts_on_the_same_port(redis_server) -> None:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=2)
    client.set("k", "v")
    assert client.get("k") == b"v"
    assert redis_server.host == "127.0.0.1"
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    port = redis_server.port

    redis_server.stop()
    assert not redis_server.running
    with pytest.raises(redis.ConnectionError):
        client.ping()

    redis_server.start()
    assert redis_server.port == port
    assert client.get("k") is None  # no persistence: a restart is empty
    client.close()


@pytest.mark.timeout(30)
def test_redis_server_process_is_killed_on_close() -> None:
    try:
        server = RedisServer().start()
    except RedisServerUnavailable as exc:  # no redis-server on this machine: as the fixtures do
        pytest.skip(str(exc))
    pid = server.pid
    assert pid is not None
    server.close()
    assert not server.running
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


def test_missing_binary_raises_a_clear_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("RAGGUARD_REDIS_SERVER", str(tmp_path / "no-such-redis-server"))
    with pytest.raises(RedisServerUnavailable, match="redis-server not found"):
        RedisServer()


@pytest.mark.timeout(60)
def test_plugin_is_loaded_by_entry_point_and_skips_without_redis(tmp_path) -> None:
    test_file = tmp_path / "test_user_suite.py"
    test_file.write_text(
        "def test_needs_redis(redis_server):\n"
        "    raise AssertionError('must not run')\n"
        "\n"
        "def test_clock(fake_clock):\n"
        "    fake_clock.advance(2.0)\n"
        "    assert fake_clock() == 2.0\n"
    )
    env = {**os.environ, "RAGGUARD_REDIS_SERVER": str(tmp_path / "missing-redis-server")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(test_file), "-rs", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=50,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout
    assert "redis-server not found" in proc.stdout


@pytest.mark.timeout(30)
def test_session_server_is_shared(redis_server_session) -> None:
    redis_server_session.flushall()
    client = redis.Redis.from_url(redis_server_session.url, socket_timeout=2)
    assert client.dbsize() == 0
    client.close()


@pytest.mark.timeout(30)
def test_fault_proxy_fixture_forwards_to_redis(redis_server, fault_proxy) -> None:
    proxy = fault_proxy(redis_server)
    client = redis.Redis(host=proxy.host, port=proxy.port, socket_timeout=2)
    client.set("through", "proxy")
    assert client.get("through") == b"proxy"
    assert proxy.stats.accepted >= 1
    assert proxy.stats.bytes_to_client > 0
    client.close()
