"""A server that speaks the Anthropic Messages API as the ``anthropic`` SDK reads it: messages
(whole, or streamed as typed SSE events), error bodies ``{"type": "error", "error": {...}}``, 529
``overloaded_error``, and an ``event: error`` (``overloaded_error``) inside a stream that began
with HTTP 200."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ._faults import Fault
from ._http import HttpWire, sse

__all__ = ["OVERLOADED", "AnthropicWire", "anthropic_error"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}

OVERLOADED = {"type": "overloaded_error", "message": "Overloaded"}


def anthropic_error(status: int, *, kind: str | None = None, message: str = "") -> dict[str, Any]:
    """The error body Anthropic sends with ``status``."""
    return {
        "type": "error",
        "error": {"type": kind or _TYPES.get(status, "api_error"), "message": message or f"error {status}"},
    }


class AnthropicWire(HttpWire):
    """``/v1/messages`` (route ``messages``). A stream's usage is Anthropic's: the input in
    ``message_start`` (``input_tokens``, default 3, and ``cache_read_input_tokens``, default 0)
    with one output token, the output so far in ``message_delta``; a whole message's, both."""

    error_body = staticmethod(anthropic_error)

    def __init__(
        self,
        *,
        tokens: tuple[str, ...] = ("Hello", " from", " the", " wire"),
        input_tokens: int = 3,
        cache_read_input_tokens: int = 0,
    ) -> None:
        super().__init__()
        self.tokens = tokens
        self.input_tokens = input_tokens
        self.cache_read_input_tokens = cache_read_input_tokens
        self.route("/v1/messages", "messages", self._messages, ["POST"])

    async def _messages(self, request: Request, payload: dict[str, Any], fault: Fault | None) -> Response:
        model = payload.get("model", "claude-wire")
        usage = {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "output_tokens": len(self.tokens),
        }
        message = {
            "id": "msg_wire",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        if not payload.get("stream"):
            whole = {
                **message,
                "content": [{"type": "text", "text": "".join(self.tokens)}],
                "stop_reason": "end_turn",
            }
            return await self.answer(request, fault, whole)
        events = [
            sse({"type": "message_start", "message": {**message, "usage": {**usage, "output_tokens": 1}}},
                "message_start"),
            sse(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                "content_block_start",
            ),
            sse({"type": "ping"}, "ping"),
        ]
        events += [
            sse(
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": token}},
                "content_block_delta",
            )
            for token in self.tokens
        ]
        events += [
            sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": len(self.tokens)},
                },
                "message_delta",
            ),
            sse({"type": "message_stop"}, "message_stop"),
        ]
        return await self.stream(request, fault, events)

    def error_event(self, event: dict[str, Any]) -> str:
        return sse({"type": "error", "error": event}, "error")
