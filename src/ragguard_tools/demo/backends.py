"""The demo's dependencies, each its own grpc.aio server on 127.0.0.1, plus a control service.

* ``Embedding/Embed``   ``{"texts": [str]}`` -> ``{"vectors": <float32 (n, 256)>}`` (WordLlama, in a
  worker thread so the loop never waits on the CPU)
* ``VectorStore/Search`` ``{"vector": <float32 (1, 256)>, "k": int}`` -> ``{"ids": [int], "scores": [float]}``
  (faiss ``IndexFlatIP`` over the corpus passages)
* ``Generator/Generate`` ``{"question": str, "passages": [str], "max_words": int, "prefix": str}``
  -> a stream of ``{"text": str}``, one word each (the extractive model of
  :mod:`ragguard_tools.demo.generator`, at :data:`WORDS_PER_S` words per second; ``prefix``, optional:
  the start of an answer to continue), served by two servers of their own: two deployments of the
  model (:data:`DEPLOYMENTS`), which share the faults in force
* ``Control/SetFaults`` ``{"faults": [spec, ...]}``: the chaos faults now in force, as fault specs
  of a :mod:`ragguard.chaos` scenario (``{kind: latency, stage: embedding, rate: 0.25, seconds: 3.5}``,
  ``{kind: error, stage: vector_store, error: connection_refused}``...). They act inside the
  servers through a :class:`ragguard.chaos.Chaos` injector on stages ``embedding``,
  ``vector_store`` and the generator's three (``generation``, ``generation_midway``,
  ``generation_overrun``): a latency fault really delays the reply, an error fault really ends
  the call with the matching gRPC status. A fault may name a ``tenant``: the caller's
  ``x-tenant-id`` metadata. ``[]`` heals.
* ``Control/Shutdown`` stops everything.

:class:`BackendServers` runs them in the current event loop (tests); :class:`BackendProcess` runs
them in a child process, so the chaos acts on a separate process as it would in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import anyio.to_thread
import grpc

from ragguard import InvalidInput
from ragguard.breakers import is_out_of_memory
from ragguard.chaos import Chaos, FaultHandle
from ragguard.chaos._scenario import Phase
from ragguard.grpc import SnappyServerInterceptor

from . import _wire
from .corpus import Passage, load_passages
from .embedder import Embedder, load_embedder
from .generator import GENERATION_STAGES, parse_request, stream_answer

__all__ = [
    "BACKEND_STAGES",
    "DEPLOYMENTS",
    "SERVER_STAGES",
    "WORDS_PER_S",
    "BackendAddresses",
    "BackendProcess",
    "BackendServers",
    "ControlClient",
    "build_index",
    "parse_fault_specs",
    "start_in_loop",
]

BACKEND_STAGES = ("embedding", "vector_store")
SERVER_STAGES = (*BACKEND_STAGES, *GENERATION_STAGES)
DEPLOYMENTS = ("a", "b")
"""The model's deployments: each a generator server of its own (``generation``, ``generation_b``)."""
WORDS_PER_S = 200.0
MAX_TEXTS = 64
MAX_TEXT_CHARS = 8192
MAX_K = 100
MAX_FAULTS = 50


def parse_fault_specs(specs: Any) -> list[Any]:
    """Validate a list of :mod:`ragguard.chaos` fault specs (dicts) for the backends' stages
    (:data:`SERVER_STAGES`: the embedding and vector-store servers, the generator's three points).

    Raises :class:`~ragguard.InvalidInput` naming the problem: not a list, an invalid spec, a
    proxy fault (those act on a :class:`~ragguard.chaos.FaultProxy`, not inside a server), or a
    stage that is not a backend's.
    """
    if not isinstance(specs, list) or len(specs) > MAX_FAULTS:
        raise InvalidInput(f"faults must be a list of at most {MAX_FAULTS} fault specs")
    try:
        parsed = Phase.model_validate({"name": "control", "start": 0.0, "end": 1.0, "faults": specs}).faults
    except Exception as exc:  # pydantic's ValidationError, reported as the caller's mistake
        raise InvalidInput(f"invalid fault spec: {exc}") from None
    for spec in parsed:
        if spec.kind == "proxy":
            raise InvalidInput("proxy faults act on a FaultProxy in front of a backend, not in the server")
        stages = [spec.stage] if isinstance(spec.stage, str) else spec.stage
        if stages is None or not set(stages) <= set(SERVER_STAGES):
            raise InvalidInput(f"a backend fault needs stage in {SERVER_STAGES}, got {spec.stage!r}")
    return parsed


@dataclass(frozen=True, slots=True)
class BackendAddresses:
    """``host:port`` of each backend service: ``generation`` and ``generation_b`` the model's two
    deployments (:data:`DEPLOYMENTS`; "" when there is none)."""

    embedding: str
    vector_store: str
    control: str
    generation: str = ""
    generation_b: str = ""

    def generator(self, deployment: str) -> str:
        """The address of ``deployment`` ("a" or "b")."""
        return self.generation_b if deployment == DEPLOYMENTS[1] else self.generation


def build_index(embedder: Embedder, passages: list[Passage]) -> Any:
    """A faiss ``IndexFlatIP`` over the passages' normalised vectors (inner product = cosine)."""
    import faiss

    # Many tiny searches on 2 cores: OpenMP worker threads would only spin.
    faiss.omp_set_num_threads(1)
    vectors = embedder.embed([f"{p.title}\n{p.text}" for p in passages])
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    return index


def _fault_status(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status a server ends a call with when ``exc`` (a chaos fault) hit it."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code: grpc.StatusCode = exc.code()
        return code
    if isinstance(exc, ConnectionError):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if is_out_of_memory(exc):
        return grpc.StatusCode.INTERNAL
    return grpc.StatusCode.UNKNOWN


class BackendServers:
    """The embedding, vector-store, generator (two deployments) and control servers in the running
    event loop.

    ``rng`` (seeded) decides which calls a fault hits; the generator emits ``words_per_s`` words
    per second. Use :meth:`start` then :meth:`stop`.
    """

    def __init__(
        self,
        embedder: Embedder,
        index: Any,
        *,
        rng: random.Random,
        host: str = "127.0.0.1",
        words_per_s: float = WORDS_PER_S,
    ) -> None:
        if not 0 < words_per_s <= 100_000:
            raise InvalidInput(f"words_per_s must be in (0, 100000], got {words_per_s}")
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise InvalidInput(f"the demo backends listen on loopback only, got {host!r}")
        self._embedder = embedder
        self._index = index
        self._host = host
        self._word_s = 1.0 / words_per_s
        self.streams_open = 0  # Generate calls under way (a cut or cancelled caller ends its own)
        self.chaos = Chaos(rng=rng)
        self._handles: list[FaultHandle] = []
        self._servers: list[grpc.aio.Server] = []
        self._stopped = asyncio.Event()
        self.addresses: BackendAddresses | None = None

    async def start(self) -> BackendAddresses:
        embed_port = await self._serve(_wire.handler(_wire.EMBEDDING, {"Embed": self._embed}))
        vector_port = await self._serve(_wire.handler(_wire.VECTOR_STORE, {"Search": self._search}))
        generator_port = await self._serve(_wire.handler(_wire.GENERATOR, {}, {"Generate": self._generate}))
        generator_b_port = await self._serve(_wire.handler(_wire.GENERATOR, {}, {"Generate": self._generate}))
        control_port = await self._serve(
            _wire.handler(_wire.CONTROL, {"SetFaults": self._set_faults, "Shutdown": self._shutdown})
        )
        self.addresses = BackendAddresses(
            embedding=f"{self._host}:{embed_port}",
            vector_store=f"{self._host}:{vector_port}",
            control=f"{self._host}:{control_port}",
            generation=f"{self._host}:{generator_port}",
            generation_b=f"{self._host}:{generator_b_port}",
        )
        return self.addresses

    async def _serve(self, handler: grpc.GenericRpcHandler) -> int:
        # Snappy responses for the callers that ask (the guarded pipeline); plain for the others.
        server = grpc.aio.server(interceptors=[SnappyServerInterceptor()])
        server.add_generic_rpc_handlers((handler,))
        port: int = server.add_insecure_port(f"{self._host}:0")
        if port == 0:
            raise OSError(f"could not bind {self._host}")
        await server.start()
        self._servers.append(server)
        return port

    def set_faults(self, specs: Any) -> None:
        """Replace the faults in force with ``specs`` (see :func:`parse_fault_specs`)."""
        parsed = parse_fault_specs(specs)
        for handle in self._handles:
            handle.remove()
        self._handles = [self.chaos.inject(s.build(), stage=s.stage, tenant=s.tenant) for s in parsed]

    async def stop(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            await server.stop(grace=None)
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _faulted(
        self, stage: str, context: grpc.aio.ServicerContext, call: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Run ``call`` through the faults of ``stage``; a fault's error ends the RPC with its status."""
        try:
            result: dict[str, Any] = await self.chaos(stage, _wire.tenant_of(context), call)
        except InvalidInput:
            raise
        except Exception as exc:
            await context.abort(_fault_status(exc), f"{type(exc).__name__}: {exc}")
            raise  # unreachable: abort raises
        return result

    async def _embed(self, request: dict[str, Any], context: grpc.aio.ServicerContext) -> dict[str, Any]:
        texts = request.get("texts")
        if not isinstance(texts, list) or not 0 < len(texts) <= MAX_TEXTS:
            raise InvalidInput(f"texts must be a list of 1..{MAX_TEXTS} strings")
        if not all(isinstance(t, str) and len(t) <= MAX_TEXT_CHARS for t in texts):
            raise InvalidInput(f"each text must be a str of at most {MAX_TEXT_CHARS} characters")

        async def embed() -> dict[str, Any]:
            vectors = await anyio.to_thread.run_sync(self._embedder.embed, texts)
            return {"vectors": _wire.encode_vectors(vectors)}

        return await self._faulted("embedding", context, embed)

    async def _search(self, request: dict[str, Any], context: grpc.aio.ServicerContext) -> dict[str, Any]:
        vector = _wire.decode_vectors(request.get("vector"))
        k = request.get("k")
        if not isinstance(k, int) or not 0 < k <= MAX_K:
            raise InvalidInput(f"k must be an int in 1..{MAX_K}, got {k!r}")
        if vector.shape != (1, self._index.d):
            raise InvalidInput(f"vector must have shape (1, {self._index.d}), got {vector.shape}")

        async def search() -> dict[str, Any]:
            scores, ids = await anyio.to_thread.run_sync(self._index.search, vector, k)
            keep = ids[0] >= 0
            return {"ids": ids[0][keep].tolist(), "scores": scores[0][keep].tolist()}

        return await self._faulted("vector_store", context, search)

    async def _generate(
        self, request: dict[str, Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[dict[str, Any]]:
        _question, passages, max_words, prefix = parse_request(request)
        words = stream_answer(
            passages, max_words, tenant=_wire.tenant_of(context), faults=self.chaos, word_s=self._word_s,
            prefix=prefix,
        )
        self.streams_open += 1
        try:
            async for word in words:
                yield {"text": word}
        except Exception as exc:  # a chaos fault's error, before the first word, halfway or at the end
            await context.abort(_fault_status(exc), f"{type(exc).__name__}: {exc}")
            raise  # unreachable: abort raises
        finally:
            self.streams_open -= 1
            await words.aclose()

    async def _set_faults(self, request: dict[str, Any], context: grpc.aio.ServicerContext) -> dict[str, Any]:
        self.set_faults(request.get("faults"))
        return {"faults": len(self._handles)}

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

    async def set_faults(self, specs: list[dict[str, Any]], *, timeout_s: float = 5.0) -> int:
        """Put the fault ``specs`` in force (replacing the previous ones); returns their number.

        Raises grpc.aio.AioRpcError (INVALID_ARGUMENT for a bad spec)."""
        reply = await self._set({"faults": specs}, timeout=timeout_s)
        return int(reply["faults"])

    async def heal(self) -> None:
        await self.set_faults([])

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
    """Entry point of the backends' child process: ``python -m ragguard_tools.demo._child --seed N``.

    Prints the addresses as one JSON line on stdout once serving; exits after Control/Shutdown.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ragguard_tools.demo._child")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    _quiet_logging()
    asyncio.run(_serve_child(args.seed))


class BackendProcess:
    """The backends in a child process (``python -m ragguard_tools.demo._child``): :meth:`start`
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
            sys.executable, "-m", "ragguard_tools.demo._child", "--seed", str(self._seed),
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


