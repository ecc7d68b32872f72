"""A server that speaks the Anthropic Messages API as the ``anthropic`` SDK reads it: messages
(whole, or streamed as typed SSE events), error bodies ``{"type": "error", "error": {...}}``, 529
``overloaded_error``, and an ``event: error`` (``overloaded_error``) inside a stream that began
with HTTP 200. With ``context_limits`` a request longer than its model's window is refused as
Anthropic refuses it: 400 ``invalid_request_error`` "prompt is too long: N tokens > M maximum"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ._continue import rest_of
from ._faults import Fault
from ._http import HttpWire, sse
from .openai_api import prompt_tokens

__all__ = ["CONTENT_BLOCKED", "OVERLOADED", "AnthropicWire", "anthropic_error"]

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
CONTENT_BLOCKED = {"type": "invalid_request_error", "message": "Output blocked by content filtering policy"}


def anthropic_error(status: int, *, kind: str | None = None, message: str = "") -> dict[str, Any]:
    """The error body Anthropic sends with ``status``."""
    return {
        "type": "error",
        "error": {"type": kind or _TYPES.get(status, "api_error"), "message": message or f"error {status}"},
    }


class AnthropicWire(HttpWire):
    """``/v1/messages`` (route ``messages``). ``context_limits`` (model -> tokens): a request to
    such a model whose input (its messages' text / 4, as :func:`wire.openai_api.prompt_tokens`
    counts) passes the limit is refused as Anthropic refuses it. A stream's usage is Anthropic's:
    the input in ``message_start`` (``input_tokens``, default 3, and ``cache_read_input_tokens``,
    default 0) with one output token, the output so far in ``message_delta``; a whole message's,
    both. A request whose last message is the assistant's prefill beginning the answer is
    answered with the rest of it, from ``repeat_tokens`` tokens back
    (:func:`wire._continue.rest_of`)."""

    error_body = staticmethod(anthropic_error)

    def __init__(
        self,
        *,
        tokens: tuple[str, ...] = ("Hello", " from", " the", " wire"),
        context_limits: Mapping[str, int] | None = None,
        input_tokens: int = 3,
        cache_read_input_tokens: int = 0,
    ) -> None:
        super().__init__()
        self.tokens = tokens
        self.context_limits = dict(context_limits or {})
        self.stop_reason = "end_turn"  # "refusal": Anthropic's streaming classifiers stopped it
        self.input_tokens = input_tokens
        self.cache_read_input_tokens = cache_read_input_tokens
        self.repeat_tokens = 0  # how far back a continuation of a prefill starts
        self.route("/v1/messages", "messages", self._messages, ["POST"])

    async def _messages(self, request: Request, payload: dict[str, Any], fault: Fault | None) -> Response:
        model = payload.get("model", "claude-wire")
        limit = self.context_limits.get(str(model))
        prompt = prompt_tokens(payload)
        if limit is not None and prompt > limit and fault is None:
            too_long = anthropic_error(400, message=f"prompt is too long: {prompt} tokens > {limit} maximum")
            return await self.answer(request, Fault(status=400, body=too_long), None)
        tokens = self._answer(payload)
        usage = {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "output_tokens": len(tokens),
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
                "stop_reason": self.stop_reason,
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
            for token in tokens
        ]
        events += [
            sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self.stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": len(tokens)},
                },
                "message_delta",
            ),
            sse({"type": "message_stop"}, "message_stop"),
        ]
        return await self.stream(request, fault, events, preamble=3)

    def _answer(self, payload: dict[str, Any]) -> tuple[str, ...]:
        """The tokens to stream: the answer, or the rest of it after the request's prefill."""
        messages = payload.get("messages") or []
        if messages and messages[-1].get("role") == "assistant":
            prefill = messages[-1].get("content")
            if isinstance(prefill, str) and prefill and "".join(self.tokens).startswith(prefill):
                return rest_of(self.tokens, prefill, self.repeat_tokens)
        return self.tokens

    def error_event(self, event: dict[str, Any]) -> str:
        return sse({"type": "error", "error": event}, "error")
