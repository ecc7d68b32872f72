"""A TCP fault proxy: real network faults between a client and a real server.

:class:`FaultProxy` listens on 127.0.0.1 and forwards every connection to an upstream server
(Redis, a gRPC server, ...). While it runs, a test changes what the network does:

==========================  ================================================================
``set_latency``             delay each chunk per direction (latency, not a throughput cap)
``set_bandwidth``           cap bytes per second per direction per connection
``reset()``                 RST every open connection (SO_LINGER 0), and new ones until healed
``drop()``                  accept and read, never answer (clients run into their timeouts)
``close_after(n)``          close each connection after ``n`` more bytes towards the client
``refuse()``                stop listening: new connections get ECONNREFUSED
``stop()`` / ``restart()``  the server goes away (connections closed, port refused), comes back
``heal()``                  back to a clean pipe (listening again if refused)
==========================  ================================================================

Each chunk read from one side is stamped ``now + latency`` and queued; a writer task delivers it
at that time, so latency adds delay without cutting throughput. Queues are bounded (back
pressure reaches the sender) and every task ends when its connection closes.

The proxy runs on an asyncio loop: the caller's (``async with FaultProxy(...)``) or its own
thread (:meth:`FaultProxy.start_in_thread`, used by the ``fault_proxy`` pytest fixture so it
serves sync, asyncio and trio tests alike). The controls are plain methods callable from any
thread; they take effect before they return.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar

from .. import _validate as v

__all__ = ["FaultProxy", "ProxyStats"]

T = TypeVar("T")
Mode = Literal["pass", "drop", "reset"]

_CHUNK = 64 * 1024
_QUEUE_CHUNKS = 16
_CONTROL_TIMEOUT_S = 5.0
_EOF = b""


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """Counters since the proxy opened: connections and bytes forwarded per direction."""

    accepted: int
    active: int
    reset: int
    bytes_to_server: int
    bytes_to_client: int


def _set_rst_on_close(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with an RST instead of a FIN: SO_LINGER on with a 0 s timeout, then abort."""
    _set_rst_on_close(writer)
    writer.transport.abort()


class _Conn:
    __slots__ = ("budget_to_client", "client", "proxy", "server", "tasks")

    def __init__(self, proxy: FaultProxy, client: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.budget_to_client: int | None = proxy._close_after

    def close(self, *, rst: bool = False) -> None:
        for w in (self.client, self.server):
            if w is None:
                continue
            if rst:
                _rst(w)
            else:
                w.close()
        for t in self.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        self.proxy._conns.discard(self)


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream_host:upstream_port`` and inject network faults.

    ``port`` 0 (the default) lets the kernel pick a free port; after :meth:`open` it is in
    :attr:`port` and stays the same across :meth:`stop`/:meth:`restart`. ``max_connections``
    bounds concurrent connections (more are reset). ``connect_timeout_s`` bounds the upstream
    connect; a failed upstream connect resets the client connection.

    Raises ConfigError (a ValueError) for a port outside 0..65535 or a non-positive limit.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        upstream_port: int,
        upstream_host: str = "127.0.0.1",
        *,
        port: int = 0,
        max_connections: int = 256,
        connect_timeout_s: float = 5.0,
    ) -> None:
        v.count("upstream_port", upstream_port, 1, 65535, hint="a TCP port")
        v.count("port", port, 0, 65535, hint="a TCP port, 0: any free one")
        v.count("max_connections", max_connections, 1)
        v.seconds("connect_timeout_s", connect_timeout_s)
        self.upstream = (upstream_host, upstream_port)
        self.port = port
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s

        self._delay_to_server_s = 0.0
        self._delay_to_client_s = 0.0
        self._bandwidth_bps: float | None = None
        self._mode: Mode = "pass"
        self._close_after: int | None = None
        self._close_with_rst = False

        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._server: asyncio.Server | None = None
        self._pending_sock: socket.socket | None = None
        self._conns: set[_Conn] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._accepted = 0
        self._reset = 0
        self._bytes_up = 0
        self._bytes_down = 0

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` to connect clients to."""
        return (self.host, self.port)

    @property
    def target(self) -> str:
        """``"127.0.0.1:<port>"``, the form gRPC channels take."""
        return f"{self.host}:{self.port}"

    async def open(self) -> FaultProxy:
        """Start listening on the current asyncio loop; returns self."""
        if self._loop is not None:
            raise RuntimeError("FaultProxy is already open")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        await self._listen()
        return self

    async def aclose(self) -> None:
        """Close the listener and every connection; cancel every task. Safe to call twice."""
        if self._loop is None:
            return
        self._closing = True
        self._unlisten()
        for _ in range(3):  # bounded: handlers accepted during close end on their first check
            self._close_all(rst=False)
            tasks = [t for t in self._tasks if not t.done()]
            for t in tasks:
                t.cancel()
            tasks += [t for t in self._handlers if not t.done()]
            if not tasks:
                break
            await asyncio.wait(tasks, timeout=_CONTROL_TIMEOUT_S)
        self._loop = None
        self._closing = False

    async def __aenter__(self) -> FaultProxy:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def start_in_thread(self) -> FaultProxy:
        """Run the proxy on its own event loop in a daemon thread; returns self once listening."""
        if self._thread is not None or self._loop is not None:
            raise RuntimeError("FaultProxy is already open")
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.open())
            except BaseException as exc:
                ready.set_exception(exc)
                loop.close()
                return
            ready.set_result(None)
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.aclose())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"ragguard-fault-proxy-{id(self):x}", daemon=True)
        self._thread.start()
        try:
            ready.result(_CONTROL_TIMEOUT_S)
        except BaseException:
            self._thread.join(_CONTROL_TIMEOUT_S)
            self._thread = None
            raise
        return self

    def close(self) -> None:
        """Stop a proxy started with :meth:`start_in_thread`, closing every socket; idempotent."""
        thread, self._thread = self._thread, None
        loop = self._loop
        if thread is None:
            return
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
        thread.join(_CONTROL_TIMEOUT_S)

    def __enter__(self) -> FaultProxy:
        return self.start_in_thread()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- faults ----------------------------------------------------------------------------------

    def set_latency(self, *, to_server_s: float = 0.0, to_client_s: float = 0.0) -> None:
        """Delay every chunk by ``to_server_s`` towards the server, ``to_client_s`` back (seconds)."""
        v.seconds("to_server_s", to_server_s, allow_zero=True)
        v.seconds("to_client_s", to_client_s, allow_zero=True)
        self._delay_to_server_s = float(to_server_s)
        self._delay_to_client_s = float(to_client_s)

    def set_bandwidth(self, bytes_per_s: float | None) -> None:
        """Cap each direction of each connection at ``bytes_per_s`` (None: no cap)."""
        if bytes_per_s is not None:
            v.number("bytes_per_s", bytes_per_s, low=0.0, low_open=True, what="a rate in bytes per second")
        self._bandwidth_bps = None if bytes_per_s is None else float(bytes_per_s)

    def reset(self, *, new_connections: bool = True) -> None:
        """RST every open connection now; with ``new_connections``, also each new one until healed."""
        def apply() -> None:
            if new_connections:
                self._mode = "reset"
            self._close_all(rst=True)
        self._run(apply)

    def drop(self) -> None:
        """Black-hole traffic: connections stay open, bytes are read and discarded, nothing answers."""
        self._run(lambda: setattr(self, "_mode", "drop"))

    def close_after(self, n_bytes: int, *, rst: bool = False) -> None:
        """Close each connection once ``n_bytes`` more bytes went to its client (RST with ``rst``)."""
        v.count("n_bytes", n_bytes, 0)

        def apply() -> None:
            self._close_after = n_bytes
            self._close_with_rst = rst
            for conn in self._conns:
                conn.budget_to_client = n_bytes
        self._run(apply)

    def refuse(self) -> None:
        """Stop listening: new connections are refused (ECONNREFUSED); open ones keep working."""
        def apply() -> None:
            self._unlisten()
        self._run(apply)

    def stop(self) -> None:
        """The server goes away: stop listening and close every open connection."""
        def apply() -> None:
            self._unlisten()
            self._close_all(rst=False)
        self._run(apply)

    def restart(self) -> None:
        """Listen again on the same port (after :meth:`stop` or :meth:`refuse`); faults are kept."""
        self._run(self._relisten)

    def heal(self) -> None:
        """Remove every fault: no latency, no cap, forwarding, listening."""
        def apply() -> None:
            self._delay_to_server_s = self._delay_to_client_s = 0.0
            self._bandwidth_bps = None
            self._mode = "pass"
            self._close_after = None
            for conn in self._conns:
                conn.budget_to_client = None
            self._relisten()
        self._run(apply)

    @property
    def stats(self) -> ProxyStats:
        return ProxyStats(self._accepted, len(self._conns), self._reset, self._bytes_up, self._bytes_down)

    # -- internals -------------------------------------------------------------------------------

    def _run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the proxy's loop thread and wait for it (directly when already there)."""
        loop = self._loop
        if loop is None or self._loop_thread == threading.get_ident() or loop.is_closed():
            return fn()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

        loop.call_soon_threadsafe(call)
        return done.result(_CONTROL_TIMEOUT_S)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _listen(self) -> None:
        sock = self._bind()
        self._server = await asyncio.start_server(self._accept, sock=sock, limit=_CHUNK)

    def _bind(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        return sock

    def _relisten(self) -> None:
        if self._server is not None or self._pending_sock is not None or self._loop is None:
            return
        # Bind and listen synchronously: the port accepts (into its backlog) before this returns;
        # the accept loop starts on the next loop iteration.
        sock = self._pending_sock = self._bind()

        async def serve() -> None:
            try:
                server = await asyncio.start_server(self._accept, sock=sock, limit=_CHUNK)
            except OSError:  # the socket was closed by refuse()/stop() before we got here
                return
            if self._pending_sock is sock:
                self._pending_sock = None
                self._server = server
            else:
                server.close()

        self._spawn(serve())

    def _unlisten(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        sock, self._pending_sock = self._pending_sock, None
        if sock is not None:
            sock.close()

    def _close_all(self, *, rst: bool) -> None:
        for conn in list(self._conns):
            if rst:
                self._reset += 1
            conn.close(rst=rst)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._accepted += 1
        # Not cancelled on close (asyncio's stream callback would log the cancellation): it ends
        # by itself once its connection's tasks are cancelled.
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        if self._closing:
            writer.close()
            return
        if self._mode == "reset" or len(self._conns) >= self.max_connections:
            self._reset += 1
            _rst(writer)
            return
        conn = _Conn(self, writer)
        self._conns.add(conn)
        try:
            if self._mode != "drop":
                try:
                    up_reader, up_writer = await asyncio.wait_for(
                        asyncio.open_connection(*self.upstream, limit=_CHUNK), self.connect_timeout_s
                    )
                except (OSError, TimeoutError):
                    self._reset += 1
                    conn.close(rst=True)
                    return
                conn.server = up_writer
                if conn not in self._conns or self._closing:  # closed while connecting upstream
                    up_writer.close()
                    return
            else:
                up_reader = None
            q_up: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUE_CHUNKS)
            q_down: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUE_CHUNKS)
            conn.tasks = [
                self._spawn(self._read(conn, reader, q_up, to_client=False)),
                self._spawn(self._write(conn, q_up, to_client=False)),
            ]
            if up_reader is not None:
                conn.tasks += [
                    self._spawn(self._read(conn, up_reader, q_down, to_client=True)),
                    self._spawn(self._write(conn, q_down, to_client=True)),
                ]
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            if conn in self._conns:
                conn.close()

    async def _read(
        self, conn: _Conn, reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]],
        *, to_client: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:  # ends at EOF, on a socket error, or when the connection is closed (cancel)
            try:
                data = await reader.read(_CHUNK)
            except OSError:
                data = _EOF
            if not data:
                await queue.put((0.0, _EOF))
                return
            if self._mode == "drop":
                continue
            if self._mode == "reset":
                self._reset += 1
                conn.close(rst=True)
                return
            delay = self._delay_to_client_s if to_client else self._delay_to_server_s
            await queue.put((loop.time() + delay, data))

    async def _write(
        self, conn: _Conn, queue: asyncio.Queue[tuple[float, bytes]], *, to_client: bool
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:  # ends at EOF or when the connection is closed (cancel)
            due, data = await queue.get()
            if data is _EOF or not data:
                conn.close()
                return
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._mode == "drop":
                continue
            writer = conn.client if to_client else conn.server
            if writer is None:
                continue
            cut = False
            if to_client and conn.budget_to_client is not None:
                if len(data) >= conn.budget_to_client:
                    data, cut = data[: conn.budget_to_client], True
                conn.budget_to_client -= len(data)
            if data:
                try:
                    await self._send(writer, data)
                except OSError:
                    conn.close()
                    return
                if to_client:
                    self._bytes_down += len(data)
                else:
                    self._bytes_up += len(data)
            if cut:
                if self._close_with_rst:
                    self._reset += 1
                conn.close(rst=self._close_with_rst)
                return

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        bps = self._bandwidth_bps
        if bps is None:
            writer.write(data)
            await writer.drain()
            return
        # Pace in slices of ~10 ms worth of bytes so a cap change applies quickly.
        step = max(1, int(bps / 100))
        for start in range(0, len(data), step):
            piece = data[start : start + step]
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(len(piece) / (self._bandwidth_bps or bps))
