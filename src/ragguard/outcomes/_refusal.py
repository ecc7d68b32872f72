"""The two refusals a stage may route: a request longer than the model's context window
(``context_length``) and one the provider's content policy refused (``content_policy``).

Both are caller's errors (a 400, 413 or 422, or an error event inside a stream): never counted
by a breaker, never retried. A client's classifier finds the outcome, then :func:`refined` gives
a caller's error its finer reason from the error's code and text, as each provider words them:

- context length: OpenAI's ``context_length_exceeded`` ("This model's maximum context length is
  8192 tokens. However, your messages resulted in 9000 tokens", the Responses API's "Your input
  exceeds the context window of this model"); Anthropic's ``invalid_request_error`` "prompt is too
  long: 210000 tokens > 200000 maximum" and "input length and `max_tokens` exceed context limit:
  ..."; vLLM's 400 "This model's maximum context length is 4096 tokens. However, your request has
  5000 input tokens" (and its ``'max_tokens' or 'max_completion_tokens' is too large`` variant,
  ``vllm/entrypoints/openai/engine/serving.py``); TGI's 422 (an error event inside a 200 stream)
  "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: ..."
  (``router/src/validation.rs``); llama.cpp's ``exceed_context_size_error``; llama-cpp-python's
  "Requested tokens (N) exceed context window of M"; Gemini's OpenAI-compatible "input token count
  (N) exceeds the maximum number of tokens allowed (M)";
- content policy: OpenAI's ``content_policy_violation``, ``moderation_blocked`` and
  ``invalid_prompt`` ("flagged as potentially violating our usage policy"), Azure OpenAI's
  ``content_filter`` ("... content management policy"), the SDK's
  ``ContentFilterFinishReasonError``; Anthropic's "Output blocked by content filtering policy".

:func:`context_overflow` reads the figures such an error states (the window and the request's
size, in tokens), for the generation preset's shrink and for a fallback that receives the error.
Only the failure path pays for any of this: a message is read (at most 4096 characters) only once
a classifier has found a caller's error.
"""

from __future__ import annotations

import re

from ._builtin import message_of
from ._kinds import CONTENT_POLICY, CONTEXT_LENGTH, Kind, Outcome

__all__ = ["context_overflow", "error_text", "refined", "refusal_reason"]

_MAX_TEXT = 4096

_CONTEXT_CODES = frozenset(
    {
        "context_length_exceeded",  # OpenAI, Groq, DeepSeek...
        "context_window_exceeded",
        "exceed_context_size_error",  # llama.cpp's server (its error's type)
        "model_context_window_exceeded",
    }
)
_POLICY_CODES = frozenset(
    {
        "content_filter",  # Azure OpenAI
        "content_policy_violation",  # OpenAI (images, moderation)
        "moderation_blocked",  # OpenAI (gpt-image)
        "responsibleaipolicyviolation",  # Azure OpenAI's inner error code
    }
)
_CONTEXT_PHRASES = (
    "maximum context length",  # OpenAI, vLLM, Mistral, DeepSeek, Groq
    "context length exceeded",
    "exceeds the context window",  # OpenAI's Responses API
    "exceed context window",  # llama-cpp-python
    "prompt is too long",  # Anthropic
    "exceed context limit",  # Anthropic (input plus max_tokens)
    "`inputs` tokens + `max_new_tokens` must be <=",  # TGI
    "`inputs` must have less than",  # TGI
    "exceeds the available context size",  # llama.cpp's server
    "longer than the maximum model length",  # vLLM (a decoder prompt)
    "exceeds the maximum number of tokens allowed",  # Gemini's OpenAI-compatible endpoint
)
_POLICY_PHRASES = (
    "content management policy",  # Azure OpenAI
    "content filtering policy",  # Anthropic: "Output blocked by content filtering policy"
    "content policy",
    "safety system",  # OpenAI: "rejected as a result of our safety system"
    "usage policy",  # OpenAI's reasoning models: "invalid_prompt"
)
_REFINED = frozenset({"request", "status", "input"})
"""The caller's-error reasons a refusal's words refine (never ``auth``, ``not_found``...)."""
# the codes are read in the text too: a raw body (httpx), the SDK's "Error code: 400 - {...}"
_CONTEXT_WORDS = re.compile("|".join(map(re.escape, (*_CONTEXT_PHRASES, *sorted(_CONTEXT_CODES)))))
_POLICY_WORDS = re.compile("|".join(map(re.escape, (*_POLICY_PHRASES, *sorted(_POLICY_CODES)))))


def refusal_reason(text: str, *codes: object) -> str | None:
    """``context_length`` or ``content_policy`` when one of ``codes`` (an error body's ``code`` or
    ``type``) or ``text`` (lower case) names that refusal, else None."""
    for code in codes:
        if isinstance(code, str):
            name = code.lower()
            if name in _CONTEXT_CODES:
                return CONTEXT_LENGTH
            if name in _POLICY_CODES:
                return CONTENT_POLICY
    if _CONTEXT_WORDS.search(text) is not None:
        return CONTEXT_LENGTH
    if _POLICY_WORDS.search(text) is not None:
        return CONTENT_POLICY
    return None


def error_text(exc: BaseException) -> str:
    """What ``exc`` says, lower case, at most about 8 KiB: its message, the body it carries when
    that is text (an SDK error event whose ``error`` was a string, as TGI's is), and for an
    ``httpx`` status error the response's body when it was read (never reads one that was not)."""
    text = message_of(exc)
    body = getattr(exc, "body", None)
    if isinstance(body, str) and body:
        text = f"{text} {body[:_MAX_TEXT].lower()}"
    elif body is None and any(c.__name__ == "HTTPStatusError" for c in type(exc).__mro__):
        try:
            content = exc.response.content  # type: ignore[attr-defined]  # ResponseNotRead: never read
        except Exception:
            content = None
        if isinstance(content, (bytes, bytearray)) and content:
            text = f"{text} {bytes(content[:_MAX_TEXT]).decode('utf-8', 'replace').lower()}"
    return text


def refined(outcome: Outcome, exc: BaseException, *codes: object) -> Outcome:
    """``outcome``, with the reason ``context_length`` or ``content_policy`` when it is a caller's
    error (a bad request, not auth or not found) that ``codes`` or ``exc``'s text name so."""
    if outcome.kind is not Kind.CALLER_ERROR or outcome.reason not in _REFINED:
        return outcome
    reason = refusal_reason(error_text(exc), *codes)
    if reason is None:
        return outcome
    return Outcome(outcome.kind, outcome.reached, outcome.retry_after_s, reason, outcome.status)


_N = r"(\d{1,12})"
_FIGURES: tuple[tuple[re.Pattern[str], tuple[tuple[int, ...], int]], ...] = tuple(
    (re.compile(pattern), (requested, limit))
    for pattern, requested, limit in (
        # vLLM: "'max_tokens' or 'max_completion_tokens' is too large: M. This model's maximum
        # context length is L tokens and your request has I input tokens"
        (rf"is too large: {_N}\. this model's maximum context length is {_N} tokens "
         rf"and your request has {_N} input", (0, 2), 1),
        # OpenAI ("you requested R tokens", "your messages resulted in R tokens"), vLLM ("your
        # request has R input tokens")
        (rf"maximum context length is {_N} tokens\. however, "
         rf"(?:you requested|your messages resulted in|your request has) {_N}", (1,), 0),
        (rf"maximum context length is {_N} tokens, but the prompt contains {_N}", (1,), 0),
        (rf"prompt contains {_N} tokens.{{0,40}}too large for model with {_N} maximum context", (0,), 1),
        (rf"prompt is too long: {_N} tokens > {_N} maximum", (0,), 1),  # Anthropic
        (rf"exceed context limit: {_N} \+ {_N} > {_N}", (0, 1), 2),  # Anthropic
        (rf"must be <= {_N}\. given: {_N} `inputs` tokens and {_N} `max_new_tokens`", (1, 2), 0),  # TGI
        (rf"`inputs` must have less than {_N} tokens\. given: {_N}", (1,), 0),  # TGI
        (rf"requested tokens \({_N}\) exceed context window of {_N}", (0,), 1),  # llama-cpp-python
        (rf"decoder prompt \(length {_N}\) is longer than the maximum model length of {_N}", (0,), 1),
        (rf"input token count \({_N}\) exceeds the maximum number of tokens allowed \({_N}\)", (0,), 1),
    )
)  # fmt: skip
_LLAMA_CPP = (re.compile(r"n_prompt_tokens['\"]?:\s*(\d{1,12})"), re.compile(r"n_ctx['\"]?:\s*(\d{1,12})"))


def context_overflow(exc: BaseException) -> tuple[int, int] | None:
    """The context window and the request's size, in tokens, that a context-length refusal
    states (``(8192, 9000)`` for OpenAI's "maximum context length is 8192 tokens. However, your
    messages resulted in 9000 tokens"; input plus the output asked for where the provider counts
    both, as vLLM's ``max_tokens`` variant, Anthropic's and TGI's do); None when ``exc`` states no
    such figures, or figures that do not overflow. Never raises."""
    text = error_text(exc)
    for pattern, (requested, limit) in _FIGURES:
        found = pattern.search(text)
        if found is not None:
            return _overflow(sum(int(found.group(i + 1)) for i in requested), int(found.group(limit + 1)))
    prompt, window = (p.search(text) for p in _LLAMA_CPP)
    if prompt is not None and window is not None:
        return _overflow(int(prompt.group(1)), int(window.group(1)))
    return None


def _overflow(requested: int, limit: int) -> tuple[int, int] | None:
    return (limit, requested) if requested > limit > 0 else None
