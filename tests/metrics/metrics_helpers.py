"""A real HTTP server (uvicorn) for the metrics tests: ``GET /<status>`` answers with that status
when the path is a number (``/429``), else 200 with the path as its body."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    status = int(path[1:]) if path[1:].isdigit() else 200
    headers = [(b"content-type", b"text/plain")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": path.encode()})


def http_server() -> Any:
    """Serve the status-echoing app above (see :func:`serving`)."""
    return serving(_app)


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn on a free loopback port from a thread; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", loop="asyncio", http="h11"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(1000):
            if server.started:
                break
            time.sleep(0.01)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
