"""A real ``redis-server`` process on a free 127.0.0.1 port, for tests and the demo; and a local
Redis Cluster of such processes.

No persistence (``--save ''``, ``--appendonly no``), a private working directory, and a process
that is always killed: :meth:`RedisServer.stop` terminates it, then kills it when it lingers.
:class:`RedisClusterServers` starts masters from the same binary with ``--cluster-enabled yes``,
joins them (``CLUSTER MEET``) and spreads the 16384 slots over them (``CLUSTER ADDSLOTSRANGE``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from types import TracebackType

__all__ = [
    "RedisClusterServers",
    "RedisServer",
    "RedisServerUnavailable",
    "find_redis_server",
    "free_cluster_port",
    "free_port",
]

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


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is a free port too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 >= 65536:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RedisServerUnavailable("no free port pair (port, port + 10000) found for a cluster node")


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
    Usable as a context manager. ``extra_args`` are appended to the command line. Raises
    :class:`RedisServerUnavailable` when the binary is missing or the server does not come up.
    """

    host = "127.0.0.1"

    def __init__(self, *, binary: str | None = None, port: int | None = None,
                 extra_args: Sequence[str] = (), pick_port: Callable[[], int] = free_port) -> None:
        found = binary or find_redis_server()
        if found is None:
            raise RedisServerUnavailable(
                "redis-server not found on PATH (install redis, or set RAGGUARD_REDIS_SERVER)"
            )
        if port is not None and not (0 < port < 65536):
            raise ValueError(f"port must be in 1..65535, got {port}")
        self.binary = found
        self.extra_args = tuple(extra_args)
        self._pick_port = pick_port
        self._port_fixed = port is not None
        self.port = port if port is not None else pick_port()
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
                self.port = self._pick_port()
        return self._launch()

    def _launch(self) -> RedisServer:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="ragguard-redis-")
        log_path = os.path.join(self._dir.name, "redis.log")
        args = [
            self.binary, "--port", str(self.port), "--bind", self.host,
            "--save", "", "--appendonly", "no", "--dir", self._dir.name,
            "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning",
            "--logfile", log_path,  # redis logs to stdout otherwise: its errors would be lost
            *self.extra_args,
        ]
        self._proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                self._proc = None
                raise RedisServerUnavailable(
                    f"redis-server on port {self.port} exited: {(err + _tail(log_path)).strip()}")
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


def _tail(path: str, size: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return " " + f.read().decode(errors="replace")
    except OSError:
        return ""


def _command(host: str, port: int, *args: str, timeout_s: float = 5.0) -> bytes:
    """Send one command in RESP and return the raw reply (enough for CLUSTER admin replies)."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(b"".join(parts))
        reply = s.recv(65536)
        if reply.startswith(b"$"):  # a bulk string: read to its announced length
            size = int(reply[1:reply.index(b"\r\n")])
            header = reply.index(b"\r\n") + 2
            while len(reply) < header + size + 2:
                more = s.recv(65536)
                if not more:
                    break
                reply += more
        return reply


class RedisClusterServers:
    """A local Redis Cluster: ``masters`` (default 3) ``redis-server`` processes in cluster mode on
    free 127.0.0.1 ports, no replicas, the 16384 slots spread evenly.

    ``start()`` launches them, joins them and waits (at most 20 s) until every node reports
    ``cluster_state:ok``. :meth:`stop_node` / :meth:`start_node` take one master away and bring it
    back on the same port with the same node id and slots (its ``nodes.conf`` is kept) but no
    data, as a restarted master without persistence. With ``cluster-require-full-coverage no``,
    the other masters keep serving their slots meanwhile. ``node_timeout_ms`` is the cluster's
    failure-detection time. Usable as a context manager; raises :class:`RedisServerUnavailable`.
    """

    host = "127.0.0.1"
    SLOTS = 16384

    def __init__(self, masters: int = 3, *, binary: str | None = None, node_timeout_ms: int = 1000) -> None:
        if not 1 <= masters <= 16:
            raise ValueError(f"masters must be in 1..16, got {masters}")
        args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms), "--cluster-require-full-coverage", "no")
        self.nodes = [RedisServer(binary=binary, extra_args=args, pick_port=free_cluster_port)
                      for _ in range(masters)]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every master, for ``redis.asyncio.RedisCluster(startup_nodes=...)``."""
        return [(n.host, n.port) for n in self.nodes]

    def start(self) -> RedisClusterServers:
        """Launch, join and assign slots (no-op for nodes already running); returns self."""
        fresh = not any(n.running for n in self.nodes)
        for node in self.nodes:
            node.start()
        if fresh:
            first = self.nodes[0]
            for node in self.nodes[1:]:
                self._ok(_command(first.host, first.port, "CLUSTER", "MEET", node.host, str(node.port)))
            share = self.SLOTS // len(self.nodes)
            for i, node in enumerate(self.nodes):
                low = i * share
                high = self.SLOTS - 1 if i == len(self.nodes) - 1 else low + share - 1
                self._ok(_command(node.host, node.port, "CLUSTER", "ADDSLOTSRANGE", str(low), str(high)))
        self.wait_ok()
        return self

    def wait_ok(self, timeout_s: float = 20.0) -> None:
        """Wait until every running node reports ``cluster_state:ok`` and knows every master."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._healthy(n) for n in self.nodes if n.running):
                return
            time.sleep(0.05)
        raise RedisServerUnavailable(f"the cluster on {self.startup_nodes} did not settle in {timeout_s}s")

    def _healthy(self, node: RedisServer) -> bool:
        try:
            info = _command(node.host, node.port, "CLUSTER", "INFO").decode(errors="replace")
        except OSError:
            return False
        return ("cluster_state:ok" in info
                and f"cluster_known_nodes:{len(self.nodes)}" in info
                and f"cluster_slots_assigned:{self.SLOTS}" in info)

    def node_of(self, slot: int) -> int:
        """Index of the master that serves ``slot`` (slots are spread evenly, in order)."""
        share = self.SLOTS // len(self.nodes)
        return min(slot // share, len(self.nodes) - 1)

    def stop_node(self, index: int) -> None:
        """Take master ``index`` away (terminate its process)."""
        self.nodes[index].stop()

    def start_node(self, index: int) -> None:
        """Bring master ``index`` back (same port, node id and slots; no data) and wait until the
        cluster is ok again."""
        self.nodes[index].start()
        self.wait_ok()

    def close(self) -> None:
        """Stop every node and remove their working directories."""
        for node in self.nodes:
            node.close()

    @staticmethod
    def _ok(reply: bytes) -> None:
        if not reply.startswith(b"+OK"):
            raise RedisServerUnavailable(f"cluster set-up failed: {reply[:200]!r}")

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisClusterServers({self.startup_nodes})"
