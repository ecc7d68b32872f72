"""A server that speaks the OpenAI API as the ``openai`` SDK reads it: embeddings, chat completions
(whole, or streamed as SSE ending in ``[DONE]``, with a usage chunk when the request asks for
``stream_options={"include_usage": true}``, and the usage so far in every chunk when it adds
vLLM's ``"continuous_usage_stats": true``), the Responses API (whole, or streamed as typed
``response.*`` events ending in ``response.completed`` with its usage), error bodies
``{"error": {...}}`` and the headers of rate limits (``retry-after``, ``retry-after-ms``,
``x-ratelimit-*``). With ``context_limits`` a chat request longer than its model's window is
refused as OpenAI, vLLM or TGI refuse it (``dialect``), with the figures they state."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import Response

from ._continue import rest_of
from ._faults import Fault
from ._http import HttpWire, sse

__all__ = ["OpenAIWire", "context_length_error", "openai_error", "prompt_tokens"]

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


Dialect = Literal["openai", "vllm", "tgi"]


def prompt_tokens(payload: dict[str, Any]) -> int:
    """A chat request's input tokens as the wire server counts them: each message's text / 4
    (rounded up) plus 4 tokens of framing per message."""
    total = 0
    for message in payload.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        text = content if isinstance(content, str) else str(content or "")
        total += 4 + (len(text) + 3) // 4
    return total


def context_length_error(
    dialect: Dialect, limit: int, prompt: int, completion: int
) -> tuple[int, dict[str, Any]]:
    """The status and body ``dialect``'s server answers a chat request of ``prompt`` input tokens
    asking for ``completion`` output tokens when its model's window is ``limit`` tokens (OpenAI's
    ``context_length_exceeded``; vLLM's 400, ``vllm/entrypoints/openai/engine/serving.py``; TGI's
    422 ``validation`` error, ``router/src/validation.rs`` and ``server.rs``)."""
    if dialect == "tgi":
        message = (
            f"Input validation error: `inputs` tokens + `max_new_tokens` must be <= {limit}. "
            f"Given: {prompt} `inputs` tokens and {completion} `max_new_tokens`"
        )
        return 422, {"error": message, "error_type": "validation"}
    if dialect == "vllm":
        message = (
            f"This model's maximum context length is {limit} tokens. However, your request has "
            f"{prompt} input tokens. Please reduce the length of the input messages."
        )
        return 400, {
            "error": {"message": message, "type": "BadRequestError", "param": "input_tokens", "code": 400}
        }
    message = (
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the completion). "
        "Please reduce the length of the messages or completion."
    )
    return 400, {
        "error": {"message": message, "type": "invalid_request_error", "param": "messages",
                  "code": "context_length_exceeded"}
    }  # fmt: skip


class OpenAIWire(HttpWire):
    """``/v1/embeddings``, ``/v1/chat/completions`` and ``/v1/responses`` (routes ``embeddings``,
    ``chat`` and ``responses``). A completion is ``tokens``, one per chunk or delta; its usage
    says ``usage_prompt_tokens`` (default 3) prompt (input) tokens and ``completion_tokens``
    (default: one per token) completion ones.

    ``context_limits`` (model -> tokens): a chat request to such a model whose input
    (:func:`prompt_tokens`) plus its ``max_tokens`` (vLLM: its input alone) passes the limit is
    refused as ``dialect``'s server refuses it (:func:`context_length_error`); TGI streams the
    refusal as an error event after HTTP 200, as its router does.

    A chat request whose messages end with an assistant message that begins the answer, then a
    user message (ragguard's continuation recipe), is answered with the rest of the answer, from
    ``repeat_tokens`` tokens back (:func:`wire._continue.rest_of`)."""

    error_body = staticmethod(openai_error)

    def __init__(
        self,
        *,
        tokens: tuple[str, ...] = ("Hello", " from", " the", " wire"),
        completion_tokens: int | None = None,
        usage_prompt_tokens: int = 3,
        context_limits: Mapping[str, int] | None = None,
        dialect: Dialect = "openai",
    ) -> None:
        super().__init__()
        self.tokens = tokens
        self.completion_tokens = completion_tokens
        self.usage_prompt_tokens = usage_prompt_tokens
        self.context_limits = dict(context_limits or {})
        self.dialect: Dialect = dialect
        self.finish_reason = "stop"  # a whole completion's (Azure's "content_filter", say)
        self.repeat_tokens = 0  # how far back a continuation starts
        self.route("/v1/embeddings", "embeddings", self._embeddings, ["POST"])
        self.route("/v1/chat/completions", "chat", self._chat, ["POST"])
        self.route("/v1/responses", "responses", self._responses, ["POST"])

    def _used(self) -> int:
        return len(self.tokens) if self.completion_tokens is None else self.completion_tokens

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
        refused = self._too_long(payload)
        if refused is not None and fault is None:
            status, body = refused
            if status == 422 and payload.get("stream"):  # TGI: HTTP 200, then the error event
                return await self.stream(request, None, [sse(body)])
            return await self.answer(request, Fault(status=status, body=body), None)
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
                        "finish_reason": self.finish_reason,
                        "logprobs": None,
                    }
                ],
                "usage": self._chat_usage(),
            }
            return await self.answer(request, fault, ok)

        options = payload.get("stream_options") or {}
        continuous = bool(options.get("include_usage") and options.get("continuous_usage_stats"))

        def chunk(delta: dict[str, Any], finish: str | None, sent: int) -> str:
            body: dict[str, Any] = {
                "id": "chatcmpl-wire",
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            if continuous:  # vLLM: every chunk says the usage so far
                body["usage"] = self._chat_usage(sent)
            return sse(body)

        answer = self._answer(payload)
        events = [chunk({"role": "assistant", "content": ""}, None, 0)]
        events += [chunk({"content": token}, None, i) for i, token in enumerate(answer, 1)]
        events.append(chunk({}, "stop", len(answer)))
        if options.get("include_usage"):
            usage = {
                "id": "chatcmpl-wire",
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": self._chat_usage(len(answer) if answer is not self.tokens else None),
            }
            events.append(sse(usage))
        events.append("data: [DONE]\n\n")
        return await self.stream(request, fault, events, preamble=1)

    def _answer(self, payload: dict[str, Any]) -> tuple[str, ...]:
        """The tokens to stream: the answer, or the rest of it when the request continues it."""
        messages = payload.get("messages") or []
        roles = [m.get("role") for m in messages[-2:]]
        if roles == ["assistant", "user"]:
            partial = messages[-2].get("content")
            if isinstance(partial, str) and partial and "".join(self.tokens).startswith(partial):
                return rest_of(self.tokens, partial, self.repeat_tokens)
        return self.tokens

    def _too_long(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        limit = self.context_limits.get(str(payload.get("model")))
        if limit is None:
            return None
        prompt = prompt_tokens(payload)
        completion = int(payload.get("max_completion_tokens") or payload.get("max_tokens") or 0)
        asked = prompt if self.dialect == "vllm" else prompt + completion
        if asked <= limit:
            return None
        return context_length_error(self.dialect, limit, prompt, completion)

    def _chat_usage(self, tokens: int | None = None) -> dict[str, int]:
        used, prompt = self._used() if tokens is None else tokens, self.usage_prompt_tokens
        return {"prompt_tokens": prompt, "completion_tokens": used, "total_tokens": prompt + used}

    async def _responses(self, request: Request, payload: dict[str, Any], fault: Fault | None) -> Response:
        used = self._used()
        text = "".join(self.tokens)
        message = {
            "id": "msg_wire",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        response: dict[str, Any] = {
            "id": "resp_wire",
            "object": "response",
            "created_at": int(time.time()),
            "model": payload.get("model", "m"),
            "status": "completed",
            "output": [message],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": self.usage_prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": used,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.usage_prompt_tokens + used,
            },
        }
        if not payload.get("stream"):
            return await self.answer(request, fault, response)
        opening = {**response, "status": "in_progress", "output": [], "usage": None}
        item = {**message, "status": "in_progress", "content": []}
        seq = iter(range(10_000))

        def event(kind: str, **fields: Any) -> str:
            return sse({"type": kind, "sequence_number": next(seq), **fields}, kind)

        events = [
            event("response.created", response=opening),
            event("response.in_progress", response=opening),
            event("response.output_item.added", output_index=0, item=item),
            event(
                "response.content_part.added",
                item_id="msg_wire",
                output_index=0,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            ),
        ]
        events += [
            event(
                "response.output_text.delta",
                item_id="msg_wire",
                output_index=0,
                content_index=0,
                delta=token,
                logprobs=[],
            )
            for token in self.tokens
        ]
        events += [
            event(
                "response.output_text.done",
                item_id="msg_wire",
                output_index=0,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            event("response.output_item.done", output_index=0, item=message),
            event("response.completed", response=response),
        ]
        return await self.stream(request, fault, events)

    def error_event(self, event: dict[str, Any]) -> str:
        return sse({"error": event})
