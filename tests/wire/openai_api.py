"""A server that speaks the OpenAI API as the ``openai`` SDK reads it: embeddings, chat completions
(whole, or streamed as SSE ending in ``[DONE]``), error bodies ``{"error": {...}}`` and the
headers of rate limits (``retry-after``, ``retry-after-ms``, ``x-ratelimit-*``)."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ._faults import Fault
from ._http import HttpWire, sse

__all__ = ["OpenAIWire", "openai_error"]

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    429: "requests",
    500: "server_error",
    503: "server_error",
}


def openai_error(status: int, *, code: str | None = None, message: str = "") -> dict[str, Any]:
    """The error body OpenAI sends with ``status``."""
    return {
        "error": {
            "message": message or f"error {status}",
            "type": _TYPES.get(status, "server_error"),
            "param": None,
            "code": code,
        }
    }


class OpenAIWire(HttpWire):
    """``/v1/embeddings`` and ``/v1/chat/completions`` (routes ``embeddings`` and ``chat``)."""

    error_body = staticmethod(openai_error)

    def __init__(self, *, tokens: tuple[str, ...] = ("Hello", " from", " the", " wire")) -> None:
        super().__init__()
        self.tokens = tokens
        self.route("/v1/embeddings", "embeddings", self._embeddings, ["POST"])
        self.route("/v1/chat/completions", "chat", self._chat, ["POST"])

    async def _embeddings(self, request: Request, payload: dict[str, Any], fault: Fault | None) -> Response:
        inputs = payload.get("input", [])
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        data = [
            {"object": "embedding", "index": i, "embedding": [float(len(t)), 0.5, 0.25]}
            for i, t in enumerate(texts)
        ]
        ok = {
            "object": "list",
            "data": data,
            "model": payload.get("model", "m"),
            "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)},
        }
        return await self.answer(request, fault, ok)

    async def _chat(self, request: Request, payload: dict[str, Any], fault: Fault | None) -> Response:
        model = payload.get("model", "m")
        created = int(time.time())
        if not payload.get("stream"):
            ok = {
                "id": "chatcmpl-wire",
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "".join(self.tokens)},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": 3,
                    "completion_tokens": len(self.tokens),
                    "total_tokens": 3 + len(self.tokens),
                },
            }
            return await self.answer(request, fault, ok)

        def chunk(delta: dict[str, Any], finish: str | None) -> str:
            return sse(
                {
                    "id": "chatcmpl-wire",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        events = [chunk({"role": "assistant", "content": ""}, None)]
        events += [chunk({"content": token}, None) for token in self.tokens]
        events += [chunk({}, "stop"), "data: [DONE]\n\n"]
        return await self.stream(request, fault, events)

    def error_event(self, event: dict[str, Any]) -> str:
        return sse({"error": event})
