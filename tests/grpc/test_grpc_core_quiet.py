"""The suite's output carries no gRPC core chatter: tests/conftest.py keeps the core to errors."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

CONNECTIONS = 4


async def _slow(request: bytes, context: Any) -> bytes:
    await asyncio.sleep(5)
    return request


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_server_stopping_under_calls_logs_no_goaway(capfd: pytest.CaptureFixture[str]) -> None:
    """Stopping a server with calls in flight sends each client a GOAWAY ("Cancelling all calls"),
    which the C core logs at INFO level (``chttp2_transport.cc ... Got goaway``) by default."""
    server = grpc.aio.server()
    slow = grpc.unary_unary_rpc_method_handler(_slow)
    handler = grpc.method_handlers_generic_handler("quiet.Q", {"Slow": slow})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(CONNECTIONS)]
    try:
        calls = [ch.unary_unary("/quiet.Q/Slow")(b"x") for ch in channels]
        await asyncio.sleep(0.3)  # every call reached the server
        await server.stop(None)
        codes = []
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call
            codes.append(failed.value.code())
        await asyncio.sleep(0.2)  # the core logs from its own threads
    finally:
        for ch in channels:
            await ch.close()
    assert codes == [grpc.StatusCode.UNAVAILABLE] * CONNECTIONS
    err = capfd.readouterr().err
    assert "goaway" not in err.lower() and "chttp2_transport" not in err, err
