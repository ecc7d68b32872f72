"""The status of a Guard over HTTP without an ASGI server (a gRPC service): :func:`serve`.

``GET /status`` (and ``/health``) answers :func:`ragguard._status.snapshot`'s JSON (what
:meth:`ragguard.Guard.status` returns), ``GET /metrics`` a Prometheus exporter's scrape; what
``ragguard top`` polls. A service with an ASGI server mounts :class:`ragguard.asgi.StatusEndpoint`
instead.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ragguard import ConfigError, Guard, default_guard
from ragguard._status import StatusCounts, snapshot

__all__ = ["StatusServer", "serve"]


class StatusServer:
    """What :func:`serve` returns: ``address`` (host, port), ``url`` of the status route;
    :meth:`close` stops the server thread (and the counts it started)."""

    def __init__(self, httpd: ThreadingHTTPServer, thread: threading.Thread, counts: StatusCounts | None):
        self._httpd = httpd
        self._thread = thread
        self._counts = counts
        host, port = httpd.server_address[:2]
        self.address: tuple[str, int] = (str(host), int(port))
        self.url = f"http://{self.address[0]}:{self.address[1]}/status"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
        if self._counts is not None:
            self._counts.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-answer (a closed ragguard top): nothing to report


def serve(
    port: int,
    guard: Guard | None = None,
    *,
    addr: str = "127.0.0.1",
    exporter: Any = None,
    counts: bool = True,
    loop: asyncio.AbstractEventLoop | None = None,
    source: Callable[[], dict[str, Any]] | None = None,
) -> StatusServer:
    """Serve ``GET /status`` (the :func:`snapshot` JSON; ``/health`` too) and, given a
    :class:`ragguard.metrics.PrometheusExporter` as ``exporter``, ``GET /metrics``, over HTTP on
    ``addr:port`` from a daemon thread: the way for a service without an ASGI server (a gRPC one).

    The snapshot is taken on ``loop`` (default: the running loop, so call this from the service's
    loop), never in the server's thread, so it reads the Guard as its own calls leave it.
    ``guard`` default: the default registry, looked up per request; ``counts``: also count
    fallbacks, sheds and rejections (a :class:`StatusCounts`, subscribed now). ``source``: what to
    serve instead of a Guard's snapshot (called on ``loop`` for each request; no ``guard``, and
    ``counts`` is not used). Port 0 picks a free one (see ``StatusServer.address``). Raises
    ConfigError for a bad port or both ``guard`` and ``source``, RuntimeError without a loop, OSError
    when the port cannot be bound.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise ConfigError(f"status.serve: port must be 0..65535, got {port!r}")
    if guard is not None and source is not None:
        raise ConfigError("status.serve: give a guard or a source, not both")
    target = loop if loop is not None else asyncio.get_running_loop()
    tally = StatusCounts().start() if counts and source is None else None

    def take() -> dict[str, Any]:
        async def on_loop() -> dict[str, Any]:
            if source is not None:
                return source()
            return snapshot(guard if guard is not None else default_guard(), tally)

        return asyncio.run_coroutine_threadsafe(on_loop(), target).result(timeout=5)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if path in ("/status", "/health", ""):
                try:
                    body = json.dumps(take(), separators=(",", ":")).encode()
                    kind, code = "application/json", 200
                except Exception as exc:  # the loop is gone or too busy to answer in time
                    body, kind, code = f"status unavailable: {type(exc).__name__}".encode(), "text/plain", 503
            elif path == "/metrics" and exporter is not None:
                body, kind, code = exporter.scrape(), "text/plain; version=0.0.4; charset=utf-8", 200
            else:
                body, kind, code = b"not found", "text/plain", 404
            self.send_response(code)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.send_header("cache-control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = _Server((addr, port), Handler)
    thread = threading.Thread(target=httpd.serve_forever, name="ragguard-status", daemon=True)
    thread.start()
    return StatusServer(httpd, thread, tally)
