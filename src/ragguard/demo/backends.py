"""The demo's two dependencies, each its own grpc.aio server on 127.0.0.1, plus a control service.

* ``Embedding/Embed``   ``{"texts": [str]}`` -> ``{"vectors": <float32 (n, 256)>}`` (WordLlama, in a
  worker thread so the loop never waits on the CPU)
* ``VectorStore/Search`` ``{"vector": <float32 (1, 256)>, "k": int}`` -> ``{"ids": [int], "scores": [float]}``
  (faiss ``IndexFlatIP`` over the corpus passages)
* ``Control/SetFaults`` ``{"embed_latency_s", "embed_latency_share", "vector_latency_s",
  "vector_latency_share", "vector_down"}`` -> the faults now in force. ``vector_down`` stops the
  vector-store server (callers get connection refused); clearing it starts it again on the same port.
* ``Control/Shutdown`` stops everything.

:class:`BackendServers` runs them in the current event loop (tests); :class:`BackendProcess` runs
them in a child process, so the chaos acts on a separate process as it would in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any

import anyio.to_thread

import grpc

from .._errors import InvalidInput
from ..grpc import SnappyServerInterceptor
from . import _wire
from .corpus import Passage, load_passages
from .embedder import Embedder, load_embedder

__all__ = [
    "BackendAddresses",
    "BackendFaults",
    "BackendProcess",
    "BackendServers",
    "ControlClient",
    "build_index",
    "start_in_loop",
]

MAX_TEXTS = 64
MAX_TEXT_CHARS = 8192
MAX_K = 100


@dataclass(frozen=True, slots=True)
class BackendFaults:
    """Faults the backends inject into their own calls.

    A share (0..1) of embedding / vector-store calls is delayed by the given seconds;
    ``vector_down`` keeps the vector-store server stopped.
    """

    embed_latency_s: float = 0.0
    embed_latency_share: float = 0.0
    vector_latency_s: float = 0.0
    vector_latency_share: float = 0.0
    vector_down: bool = False

    def __post_init__(self) -> None:
        for name in ("embed_latency_s", "vector_latency_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or math.isnan(value) or not 0 <= value <= 600:
                raise InvalidInput(f"BackendFaults.{name} must be in [0, 600] seconds, got {value!r}")
        for name in ("embed_latency_share", "vector_latency_share"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or math.isnan(value) or not 0 <= value <= 1:
                raise InvalidInput(f"BackendFaults.{name} must be in [0, 1], got {value!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BackendFaults:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise InvalidInput(f"unknown fault fields {sorted(unknown)}")
        return cls(**data)


@dataclass(frozen=True, slots=True)
class BackendAddresses:
    """``host:port`` of each backend service."""

    embedding: str
    vector_store: str
    control: str


def build_index(embedder: Embedder, passages: list[Passage]) -> Any:
    """A faiss ``IndexFlatIP`` over the passages' normalised vectors (inner product = cosine)."""
    import faiss

    # Many tiny searches on 2 cores: OpenMP worker threads would only spin.
    faiss.omp_set_num_threads(1)
    vectors = embedder.embed([f"{p.title}\n{p.text}" for p in passages])
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    return index


class BackendServers:
    """The embedding, vector-store and control servers in the running event loop.

    ``rng`` (seeded) decides which calls a latency fault hits. Use :meth:`start` then :meth:`stop`.
    """

    def __init__(
        self, embedder: Embedder, index: Any, *, rng: random.Random, host: str = "127.0.0.1"
    ) -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise InvalidInput(f"the demo backends listen on loopback only, got {host!r}")
        self._embedder = embedder
        self._index = index
        self._rng = rng
        self._host = host
        self.faults = BackendFaults()
        self._embedding: grpc.aio.Server | None = None
        self._vector: grpc.aio.Server | None = None
        self._control: grpc.aio.Server | None = None
        self._vector_port = 0
        self._lock = asyncio.Lock()
        self._stopped = asyncio.Event()
        self.addresses: BackendAddresses | None = None

    async def start(self) -> BackendAddresses:
        self._embedding, embed_port = await self._serve(
            _wire.handler(_wire.EMBEDDING, {"Embed": self._embed}), 0
        )
        self._vector, self._vector_port = await self._serve(
            _wire.handler(_wire.VECTOR_STORE, {"Search": self._search}), 0
        )
        self._control, control_port = await self._serve(
            _wire.handler(_wire.CONTROL, {"SetFaults": self._set_faults, "Shutdown": self._shutdown}), 0
        )
        self.addresses = BackendAddresses(
            embedding=f"{self._host}:{embed_port}",
            vector_store=f"{self._host}:{self._vector_port}",
            control=f"{self._host}:{control_port}",
        )
        return self.addresses

    async def _serve(self, handler: grpc.GenericRpcHandler, port: int) -> tuple[grpc.aio.Server, int]:
        # Snappy responses for the callers that ask (the guarded pipeline); plain for the others.
        server = grpc.aio.server(interceptors=[SnappyServerInterceptor()])
        server.add_generic_rpc_handlers((handler,))
        bound = server.add_insecure_port(f"{self._host}:{port}")
        if bound == 0:
            raise OSError(f"could not bind {self._host}:{port}")
        await server.start()
        return server, bound

    async def apply(self, faults: BackendFaults) -> None:
        """Put ``faults`` in force: stop or restart the vector store as needed."""
        async with self._lock:
            was_down = self.faults.vector_down
            self.faults = faults
            if faults.vector_down and not was_down and self._vector is not None:
                server, self._vector = self._vector, None
                await server.stop(grace=None)
            elif not faults.vector_down and was_down and self._vector is None:
                self._vector, _ = await self._serve(
                    _wire.handler(_wire.VECTOR_STORE, {"Search": self._search}), self._vector_port
                )

    async def stop(self) -> None:
        for server in (self._embedding, self._vector, self._control):
            if server is not None:
                await server.stop(grace=None)
        self._embedding = self._vector = self._control = None
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _maybe_delay(self, seconds: float, share: float) -> None:
        if seconds > 0 and share > 0 and self._rng.random() < share:
            await asyncio.sleep(seconds)

    async def _embed(self, request: dict[str, Any], context: grpc.aio.ServicerContext) -> dict[str, Any]:
        texts = request.get("texts")
        if not isinstance(texts, list) or not 0 < len(texts) <= MAX_TEXTS:
            raise InvalidInput(f"texts must be a list of 1..{MAX_TEXTS} strings")
        if not all(isinstance(t, str) and len(t) <= MAX_TEXT_CHARS for t in texts):
            raise InvalidInput(f"each text must be a str of at most {MAX_TEXT_CHARS} characters")
        f = self.faults
        await self._maybe_delay(f.embed_latency_s, f.embed_latency_share)
        vectors = await anyio.to_thread.run_sync(self._embedder.embed, texts)
        return {"vectors": _wire.encode_vectors(vectors)}

    async def _search(self, request: dict[str, Any], context: grpc.aio.ServicerContext) -> dict[str, Any]:
        vector = _wire.decode_vectors(request.get("vector"))
        k = request.get("k")
        if not isinstance(k, int) or not 0 < k <= MAX_K:
            raise InvalidInput(f"k must be an int in 1..{MAX_K}, got {k!r}")
        if vector.shape != (1, self._index.d):
            raise InvalidInput(f"vector must have shape (1, {self._index.d}), got {vector.shape}")
        f = self.faults
        await self._maybe_delay(f.vector_latency_s, f.vector_latency_share)
        scores, ids = await anyio.to_thread.run_sync(self._index.search, vector, k)
        keep = ids[0] >= 0
        return {"ids": ids[0][keep].tolist(), "scores": scores[0][keep].tolist()}

    async def _set_faults(self, request: dict[str, Any], context: grpc.aio.ServicerContext) -> dict[str, Any]:
        await self.apply(BackendFaults.from_dict(request))
        return asdict(self.faults)

    async def _shutdown(self, request: dict[str, Any], context: grpc.aio.ServicerContext) -> dict[str, Any]:
        # Reply first, stop after: stopping the control server inside its own call would cut it.
        asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(self.stop()))
        return {"ok": True}


async def start_in_loop(*, seed: int, embedder: Embedder | None = None) -> BackendServers:
    """Load the model (unless given), index the corpus and start the servers in this loop."""
    model = embedder if embedder is not None else await anyio.to_thread.run_sync(load_embedder)
    passages = load_passages()
    index = await anyio.to_thread.run_sync(build_index, model, passages)
    servers = BackendServers(model, index, rng=random.Random(seed))
    await servers.start()
    return servers


class ControlClient:
    """Changes the backends' faults over gRPC (works for in-loop and child-process backends)."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.aio.insecure_channel(address, options=_wire.CHANNEL_OPTIONS)
        self._set = _wire.unary(self._channel, _wire.CONTROL, "SetFaults")
        self._shutdown = _wire.unary(self._channel, _wire.CONTROL, "Shutdown")

    async def set_faults(self, faults: BackendFaults, *, timeout_s: float = 5.0) -> BackendFaults:
        reply = await self._set(asdict(faults), timeout=timeout_s)
        return BackendFaults.from_dict(reply)

    async def heal(self) -> None:
        await self.set_faults(replace(BackendFaults()))

    async def shutdown(self, *, timeout_s: float = 5.0) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self._shutdown({}, timeout=timeout_s)

    async def close(self) -> None:
        await self._channel.close()


def _quiet_logging() -> None:
    """The child's own logs: wordllama configures root logging at INFO on import, which would
    print faiss's loader chatter; keep warnings and errors only."""
    logging.basicConfig(level=logging.WARNING)


async def _serve_child(seed: int) -> None:
    servers = await start_in_loop(seed=seed)
    assert servers.addresses is not None
    sys.stdout.write(json.dumps(asdict(servers.addresses)) + "\n")
    sys.stdout.flush()
    await servers.wait_stopped()


def child_main(argv: list[str] | None = None) -> None:
    """Entry point of the backends' child process: ``python -m ragguard.demo._child --seed N``.

    Prints the addresses as one JSON line on stdout once serving; exits after Control/Shutdown.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ragguard.demo._child")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    _quiet_logging()
    asyncio.run(_serve_child(args.seed))


class BackendProcess:
    """The backends in a child process (``python -m ragguard.demo._child``): :meth:`start`
    returns their addresses, :meth:`stop` shuts them down (and kills the process if it lingers)."""

    def __init__(self, *, seed: int, start_timeout_s: float = 60.0) -> None:
        self._seed = seed
        self._timeout = start_timeout_s
        self._process: asyncio.subprocess.Process | None = None
        self._stderr: bytearray = bytearray()
        self._drain: asyncio.Task[None] | None = None
        self.addresses: BackendAddresses | None = None

    async def start(self) -> BackendAddresses:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ragguard.demo._child", "--seed", str(self._seed),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        assert self._process.stdout is not None and self._process.stderr is not None
        self._drain = asyncio.create_task(self._keep_stderr(self._process.stderr))
        try:
            async with asyncio.timeout(self._timeout):
                line = await self._process.stdout.readline()
        except BaseException:
            await self.kill()
            raise
        try:
            self.addresses = BackendAddresses(**json.loads(line))
        except (ValueError, TypeError):
            await self.kill()
            tail = bytes(self._stderr[-2000:]).decode(errors="replace")
            raise RuntimeError(f"demo backends failed to start: {tail or 'no output'}") from None
        return self.addresses

    async def _keep_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            self._stderr += chunk
            del self._stderr[:-8192]

    async def stop(self) -> None:
        if self._process is None:
            return
        if self.addresses is not None and self._process.returncode is None:
            control = ControlClient(self.addresses.control)
            try:
                await control.shutdown()
            finally:
                await control.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                await self._process.wait()
        await self.kill()

    async def kill(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.returncode is None:
                process.kill()
                await process.wait()
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None


