"""A server that speaks Elasticsearch's (and OpenSearch's) search API as their Python clients read
it: ``/{index}/_search`` with the ``X-Elastic-Product`` header the elasticsearch client checks, and
their error bodies (429 ``es_rejected_execution_exception``)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ._faults import Fault
from ._http import HttpWire

__all__ = ["ElasticWire", "elastic_error"]

PRODUCT = {"x-elastic-product": "Elasticsearch"}


def elastic_error(status: int) -> dict[str, Any]:
    kind = "es_rejected_execution_exception" if status == 429 else "search_phase_execution_exception"
    cause = {"type": kind, "reason": f"error {status}"}
    return {"error": {"root_cause": [cause], **cause}, "status": status}


class ElasticWire(HttpWire):
    """``POST /{index}/_search`` (route ``search``) and ``GET /`` (route ``info``)."""

    error_body = staticmethod(elastic_error)

    def __init__(self, *, product: bool = True) -> None:
        super().__init__()
        self.product = PRODUCT if product else {}
        self.route("/{index}/_search", "search", self._search, ["POST", "GET"])
        self.route("/", "info", self._info, ["GET"])

    async def answer(
        self, request: Request, fault: Fault | None, ok: Any, headers: dict[str, str] | None = None
    ) -> Response:
        return await super().answer(request, fault, ok, {**self.product, **(headers or {})})

    async def _info(self, request: Request, payload: dict[str, Any], fault: Fault | None) -> Response:
        ok = {
            "name": "wire",
            "cluster_name": "wire",
            "version": {"number": "9.0.0", "distribution": "elasticsearch"},
            "tagline": "You Know, for Search",
        }
        return await self.answer(request, fault, ok)

    async def _search(self, request: Request, payload: dict[str, Any], fault: Fault | None) -> Response:
        hits = [
            {"_index": request.path_params["index"], "_id": "1", "_score": 1.0, "_source": {"text": "hit"}}
        ]
        ok = {
            "took": 1,
            "timed_out": False,
            "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
            "hits": {"total": {"value": 1, "relation": "eq"}, "max_score": 1.0, "hits": hits},
        }
        return await self.answer(request, fault, ok)
