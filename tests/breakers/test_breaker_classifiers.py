"""Classifiers against real exceptions from real connections, and by name where a library is absent."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ragguard import DeadlineExceeded, InvalidInput
from ragguard.breakers import (
    counts_by_default,
    counts_outages,
    is_connection_error,
    is_out_of_memory,
    is_timeout,
)

pytestmark = pytest.mark.timeout(30)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listening socket that accepts connections (kernel backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


async def _raised(coro: object) -> Exception:
    try:
        await coro  # type: ignore[misc]
    except Exception as exc:
        return exc
    raise AssertionError("expected an error")


def test_real_refused_connection() -> None:
    port = closed_port()
    exc = asyncio.run(_raised(asyncio.open_connection("127.0.0.1", port)))
    assert isinstance(exc, OSError)
    assert is_connection_error(exc)
    assert not is_timeout(exc) and not is_out_of_memory(exc)
    with socket.socket() as s, pytest.raises(OSError) as info:
        s.connect(("127.0.0.1", port))
    assert is_connection_error(info.value)


def test_real_redis_client_against_a_dead_port() -> None:
    async def ping() -> Exception:
        client = redis.asyncio.Redis(host="127.0.0.1", port=closed_port(), socket_connect_timeout=2,
                                     retry=Retry(NoBackoff(), 0))
        try:
            return await _raised(client.ping())
        finally:
            await client.aclose()

    exc = asyncio.run(ping())
    assert isinstance(exc, redis.exceptions.ConnectionError)
    assert is_connection_error(exc)


def test_real_redis_timeout_is_a_timeout_that_every_breaker_counts(silent_port: int) -> None:
    async def ping() -> Exception:
        client = redis.asyncio.Redis(host="127.0.0.1", port=silent_port, socket_timeout=0.2,
                                     socket_connect_timeout=2,
                                     retry=Retry(NoBackoff(), 0))
        try:
            return await _raised(client.ping())
        finally:
            await client.aclose()

    exc = asyncio.run(ping())
    assert isinstance(exc, redis.exceptions.TimeoutError)
    assert is_timeout(exc) and not is_connection_error(exc)
    assert counts_outages(exc)  # a timeout is an outage to every typed breaker


def test_real_redis_pool_exhausted(redis_server: object) -> None:
    async def exhaust() -> Exception:
        pool = redis.asyncio.ConnectionPool(host="127.0.0.1", port=redis_server.port,  # type: ignore[attr-defined]
                                            max_connections=1)
        first = await pool.get_connection()
        try:
            return await _raised(pool.get_connection())
        finally:
            await pool.release(first)
            await pool.disconnect()

    exc = asyncio.run(exhaust())
    assert is_connection_error(exc), repr(exc)


def test_real_asyncio_timeout() -> None:
    async def slow() -> Exception:
        return await _raised(asyncio.wait_for(asyncio.sleep(5), 0.01))

    exc = asyncio.run(slow())
    assert is_timeout(exc) and not is_connection_error(exc)


def test_real_grpc_unavailable_and_deadline_exceeded() -> None:
    async def main() -> tuple[Exception, Exception]:
        async def hang(request: bytes, context: object) -> bytes:
            await asyncio.sleep(5)
            return b""

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "t.Svc", {"Hang": grpc.unary_unary_rpc_method_handler(hang)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                slow = await _raised(channel.unary_unary("/t.Svc/Hang")(b"", timeout=0.2))
            async with grpc.aio.insecure_channel(f"127.0.0.1:{closed_port()}") as channel:
                down = await _raised(channel.unary_unary("/t.Svc/Hang")(b"", timeout=5))
        finally:
            await server.stop(0)
        return slow, down

    slow, down = asyncio.run(main())
    assert slow.code() is grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
    assert is_timeout(slow) and not is_connection_error(slow)
    assert down.code() is grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    assert is_connection_error(down) and not is_timeout(down)


def test_real_memory_error() -> None:
    with pytest.raises(MemoryError) as info:
        b"x" * (1 << 62)
    assert is_out_of_memory(info.value)
    assert not is_connection_error(info.value)


@pytest.mark.parametrize(
    "message",
    [
        "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity)",
        "CUDA error: out of memory",
        "[enforce fail at alloc_cpu.cpp:114] DefaultCPUAllocator: can't allocate memory: you tried",
        "MPS backend out of memory",
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    ],
)
def test_out_of_memory_runtime_errors_by_message(message: str) -> None:
    assert is_out_of_memory(RuntimeError(message))


def _library_error(module: str, name: str, base: type[Exception] = Exception) -> type[Exception]:
    """A stand-in for an optional library's exception class: same module and class name."""
    return type(name, (base,), {"__module__": module})


def test_out_of_memory_of_libraries_matched_by_name_and_message() -> None:
    torch_oom = _library_error("torch.cuda", "OutOfMemoryError", RuntimeError)
    assert is_out_of_memory(torch_oom("whatever"))
    ort_fail = _library_error("onnxruntime.capi.onnxruntime_pybind11_state", "RuntimeException")
    assert is_out_of_memory(ort_fail(
        "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running "
        "MatMul node. Failed to allocate memory for requested buffer of size 8388608"))
    assert not is_out_of_memory(ort_fail("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : bad input"))
    assert is_out_of_memory(OSError(errno.ENOMEM, "Cannot allocate memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))  # a ValueError is the caller's


def test_httpx_errors_matched_by_class_name() -> None:
    transport = _library_error("httpx", "TransportError")
    timeout = type("TimeoutException", (transport,), {"__module__": "httpx"})
    read_timeout = type("ReadTimeout", (timeout,), {"__module__": "httpx"})
    network = type("NetworkError", (transport,), {"__module__": "httpx"})
    connect = type("ConnectError", (network,), {"__module__": "httpx"})
    pool = type("PoolTimeout", (timeout,), {"__module__": "httpx"})
    assert is_timeout(read_timeout("read")) and not is_connection_error(read_timeout("read"))
    assert is_connection_error(connect("refused")) and not is_timeout(connect("refused"))
    assert is_timeout(pool("pool exhausted")) and not is_connection_error(pool("pool exhausted"))
    status = _library_error("httpx", "HTTPStatusError")
    assert not (is_timeout(status("404")) or is_connection_error(status("404")))


def test_errno_chains_and_groups() -> None:
    assert is_connection_error(OSError(errno.ECONNRESET, "reset"))
    assert is_connection_error(BrokenPipeError())
    assert not is_connection_error(OSError(errno.ENOENT, "no such file"))
    try:
        try:
            raise TimeoutError("embedding call")
        except TimeoutError as inner:
            raise RuntimeError("embedding client failed") from inner
    except RuntimeError as outer:
        assert is_timeout(outer)
    group = ExceptionGroup("tasks", [KeyError("k"), ConnectionResetError("reset")])
    assert is_connection_error(group) and not is_timeout(group)


def test_callers_errors_are_not_counted() -> None:
    for exc in (ValueError("bad"), KeyError("k"), InvalidInput("tenant"), DeadlineExceeded("embedding")):
        assert not (is_timeout(exc) or is_connection_error(exc) or is_out_of_memory(exc)), exc
    assert not counts_by_default(ValueError("bad")) and not counts_by_default(TypeError("bad"))
    assert counts_by_default(ConnectionResetError()) and counts_by_default(RuntimeError("boom"))


@pytest.mark.parametrize(
    ("classifier", "cause"),
    [
        (is_timeout, TimeoutError("cut")),
        (is_connection_error, ConnectionRefusedError("down")),
        (is_out_of_memory, MemoryError()),
        (counts_by_default, RuntimeError("boom")),
    ],
)
def test_a_spent_deadline_is_never_the_dependencys_failure(classifier: Any, cause: Exception) -> None:
    """A nested stage's DeadlineExceeded, raised from the timeout that cut it, reaching an outer
    breaker says the caller's budget ran out, not that the dependency is slow or down."""
    assert classifier(cause) is True  # the cause alone is the dependency's failure
    try:
        try:
            raise cause
        except Exception as exc:
            raise DeadlineExceeded("inner", 0.1) from exc
    except DeadlineExceeded as spent:
        assert classifier(spent) is False
