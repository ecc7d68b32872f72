"""A server that speaks Qdrant as ``qdrant-client`` reads it: REST ``POST
/collections/{name}/points/query`` and gRPC ``qdrant.Points/Query``, the gRPC side built from
qdrant-client's own generated stubs (``qdrant_client.grpc``) on a real ``grpc.aio`` server. Faults:
REST status/headers/body/delay/reset as any :class:`HttpWire`; gRPC ``grpc_code``, ``details``,
``trailers`` (``retry-after``) and ``delay_s``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
from grpc import aio
from qdrant_client import grpc as qgrpc
from qdrant_client.grpc import points_service_pb2_grpc
from starlette.requests import Request
from starlette.responses import Response

from ._faults import Fault, Faults
from ._http import HttpWire

__all__ = ["QdrantGrpcWire", "QdrantWire", "qdrant_error"]


def qdrant_error(status: int) -> dict[str, Any]:
    return {"status": {"error": f"error {status}"}, "time": 0.0}


class QdrantWire(HttpWire):
    """REST ``/collections/{name}/points/query`` (route ``query``)."""

    error_body = staticmethod(qdrant_error)

    def __init__(self) -> None:
        super().__init__()
        self.route("/collections/{name}/points/query", "query", self._query, ["POST"])

    async def _query(self, request: Request, payload: dict[str, Any], fault: Fault | None) -> Response:
        points = [{"id": 1, "version": 0, "score": 0.9, "payload": {"text": "hit"}, "vector": None}]
        return await self.answer(
            request, fault, {"result": {"points": points}, "status": "ok", "time": 0.001}
        )


class _Points(points_service_pb2_grpc.PointsServicer):  # type: ignore[misc]
    def __init__(self, faults: Faults, requests: list[dict[str, Any]]) -> None:
        self.faults = faults
        self.requests = requests

    async def Query(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        headers = {key: value for key, value in context.invocation_metadata() or ()}
        self.requests.append({"route": "query", "headers": headers})
        fault = self.faults.take("query")
        if fault is not None:
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.grpc_code is not None:
                await context.abort(
                    getattr(grpc.StatusCode, fault.grpc_code),
                    fault.details or fault.grpc_code,
                    trailing_metadata=fault.trailers,
                )
        point = qgrpc.ScoredPoint(id=qgrpc.PointId(num=1), score=0.9, version=0)
        return qgrpc.QueryResponse(result=[point], time=0.001)


class QdrantGrpcWire:
    """gRPC ``qdrant.Points/Query`` (route ``query``) on a ``grpc.aio`` server in its own thread
    and loop; ``port`` once running; ``requests`` records each call's metadata (``headers``)."""

    def __init__(self) -> None:
        self.faults = Faults()
        self.requests: list[dict[str, Any]] = []
        self.port = 0

    @contextmanager
    def running(self) -> Iterator[int]:
        loop = asyncio.new_event_loop()
        started = threading.Event()
        stop: asyncio.Event | None = None

        async def serve() -> None:
            nonlocal stop
            stop = asyncio.Event()
            server = aio.server()
            points_service_pb2_grpc.add_PointsServicer_to_server(_Points(self.faults, self.requests), server)
            self.port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            started.set()
            await stop.wait()
            await server.stop(None)

        thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
        thread.start()
        if not started.wait(10):
            raise RuntimeError("the gRPC server did not start within 10 s")
        try:
            yield self.port
        finally:
            assert stop is not None
            loop.call_soon_threadsafe(stop.set)
            thread.join(10)
            loop.close()
