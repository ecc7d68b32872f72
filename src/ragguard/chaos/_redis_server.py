"""A real ``redis-server`` process on a free 127.0.0.1 port, for tests and the demo.

No persistence (``--save ''``, ``--appendonly no``), a private working directory, and a process
that is always killed: :meth:`RedisServer.stop` terminates it, then kills it when it lingers.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from types import TracebackType

__all__ = ["RedisServer", "RedisServerUnavailable", "find_redis_server", "free_port"]

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0


class RedisServerUnavailable(RuntimeError):
    """The ``redis-server`` binary is missing or would not start; the message says why."""


def find_redis_server() -> str | None:
    """Path of the ``redis-server`` binary: ``$RAGGUARD_REDIS_SERVER``, else the first on ``$PATH``."""
    explicit = os.environ.get("RAGGUARD_REDIS_SERVER")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("redis-server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _ping(host: str, port: int, timeout_s: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process listening on ``host:port`` (127.0.0.1, a free port).

    ``start()`` launches it and waits until it answers PING (at most 10 s); ``stop()`` ends it
    (terminate, then kill after 5 s); ``start()`` again restarts it on the same port, empty.
    Usable as a context manager. Raises :class:`RedisServerUnavailable` when the binary is
    missing or the server does not come up.
    """

    host = "127.0.0.1"

    def __init__(self, *, binary: str | None = None, port: int | None = None) -> None:
        found = binary or find_redis_server()
        if found is None:
            raise RedisServerUnavailable(
                "redis-server not found on PATH (install redis, or set RAGGUARD_REDIS_SERVER)"
            )
        if port is not None and not (0 < port < 65536):
            raise ValueError(f"port must be in 1..65535, got {port}")
        self.binary = found
        self._port_fixed = port is not None
        self.port = port if port is not None else free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> RedisServer:
        """Launch the server (no-op while running); returns self. Raises RedisServerUnavailable."""
        if self.running:
            return self
        for _ in range(3):
            try:
                return self._launch()
            except RedisServerUnavailable as exc:
                # A port picked by free_port() can be taken before redis binds it: pick another,
                # but only for the first start (a restart must keep its port).
                if self._port_fixed or "in use" not in str(exc):
                    raise
                self.port = free_port()
        return self._launch()

    def _launch(self) -> RedisServer:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="ragguard-redis-")
        args = [
            self.binary, "--port", str(self.port), "--bind", self.host,
            "--save", "", "--appendonly", "no", "--dir", self._dir.name,
            "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning",
        ]
        self._proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                self._proc = None
                raise RedisServerUnavailable(f"redis-server on port {self.port} exited: {err.strip()}")
            if _ping(self.host, self.port, 0.2):
                self._port_fixed = True
                return self
            time.sleep(0.01)
        self._kill()
        raise RedisServerUnavailable(f"redis-server on port {self.port} did not answer within "
                                     f"{_START_TIMEOUT_S:.0f}s")

    def stop(self) -> None:
        """End the process (terminate, then kill after 5 s); safe to call twice."""
        self._kill()

    def restart(self) -> RedisServer:
        """Stop, then start again on the same port (the data is gone: no persistence)."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the process and remove its working directory."""
        self._kill()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def flushall(self) -> None:
        """Empty every database (for a server shared between tests)."""
        with socket.create_connection((self.host, self.port), timeout=5.0) as s:
            s.sendall(b"*1\r\n$8\r\nFLUSHALL\r\n")
            reply = s.recv(64)
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"FLUSHALL failed: {reply!r}")

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(_STOP_TIMEOUT_S)
        if proc.stderr is not None:
            proc.stderr.close()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"RedisServer({self.host}:{self.port}, {state})"
