"""What every integration shares: the stage decorator of a Guard, the SDK's timeout from the
deadline, the tenant header and the retry count, streams opened up to their first token, calls of
one item, and a prompt's token estimate.

Only ragguard's public API is used here (``ragguard.guard``, ``Guard.guard``, ``ragguard.remaining``,
``ragguard.current_tenant``), so the integrations do not depend on how the core is laid out.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import ragguard
from ragguard.rag import Usage

from .._extras import install_hint
from .._http import field_name

__all__ = [
    "RETRY_COUNT_HEADER",
    "SDK_TIMEOUT_GRACE_S",
    "Attempts",
    "GuardedStream",
    "Stages",
    "count_text",
    "endpoint_of",
    "fallback_name",
    "fallbacks",
    "held_back",
    "needs",
    "one_item",
    "open_stream",
    "prompt_tokens",
    "sdk_options",
    "send_tenant_header",
    "sending_tenant",
    "streamed",
    "tenant_headers",
    "usage_of",
]

RETRY_COUNT_HEADER = "x-stainless-retry-count"
"""The header in which the OpenAI and Anthropic SDKs number a request's retries (0: the first
attempt); ragguard's retries are numbered in it the same way, so the provider tells a retry from
a new request."""

log = logging.getLogger("ragguard.integrations")

SDK_TIMEOUT_GRACE_S = 0.1
"""Seconds the SDK's own timeout is given past ragguard's bound of the attempt, so that ragguard's
timer (a ``DeadlineExceeded`` that no breaker counts, or the stage's ``StageTimeout``) is always
what ends a call that runs too long, and the SDK's timeout only a backstop that closes the
connection of a call ragguard no longer waits for."""


def needs(module: str, extra: str) -> Any:
    """Import ``module`` (an SDK), or raise ImportError with the command that installs ragguard's
    ``extra``."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"ragguard's {extra} integration needs {module}: {install_hint(extra)}") from exc


_PRESET_OF_OPTION = {
    "texts": "embedding",
    "tokens": "generation",
    "usage": "generation",
    "estimate": "generation",
    "input_tokens": "generation",
    "model": "generation",
    "continuation": "generation",
    "text": "generation",
    "continue_structured": "generation",
}


class Stages:
    """The Guard an integration runs in (None: the default registry, looked up at each call, so
    :func:`ragguard.configure` applies) and how it decorates a function as one of its stages."""

    __slots__ = ("guard",)

    def __init__(self, guard: ragguard.Guard | None) -> None:
        if guard is not None and not isinstance(guard, ragguard.Guard):
            raise ragguard.ConfigError(f"guard must be a ragguard.Guard or None, got {type(guard).__name__}")
        self.guard = guard

    @property
    def current(self) -> ragguard.Guard:
        return self.guard if self.guard is not None else ragguard.default_guard()

    def current_guard(self) -> ragguard.Guard:
        """:attr:`current`, as a function."""
        return self.guard if self.guard is not None else ragguard.default_guard()

    def preset_of(self, stage: str) -> str | None:
        return self.current.policy.stage(stage).preset

    def decorate(
        self,
        stage: str,
        fn: Callable[..., Any],
        *,
        fallback: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
        key: Callable[..., Any] | None = None,
        **preset_options: Any,
    ) -> Callable[..., Any]:
        """``fn`` guarded as ``stage`` (keyed by ``key``, a function of its arguments, when
        given): the preset options are given only when the stage runs the preset they belong to
        (a stage of another name without a preset runs the generic layers)."""
        options = {k: v for k, v in preset_options.items() if v is not None}
        preset = self.preset_of(stage)
        options = {k: v for k, v in options.items() if _PRESET_OF_OPTION.get(k) == preset}
        if self.guard is not None:
            return self.guard.guard(stage, fallback=fallback, key=key, **options)(fn)
        return ragguard.guard(stage, fallback=fallback, key=key, **options)(fn)

    def estimate_default(self, stage: str) -> int:
        """The stage's ``generation.estimate_tokens`` (what a stream reserves when the request does
        not say how many tokens it may generate)."""
        return self.current.policy.stage(stage).generation.estimate_tokens

    def timeout_s(self, stage: str) -> float | None:
        return self.current.policy.stage(stage).timeout_s

    def tenant_header(self, given: str | None) -> str | None:
        """The header the tenant travels in: ``given`` (a wrapper's own), else the Guard's
        ``tenant_header`` (None: none)."""
        return given if given is not None else self.current.tenant_header


def endpoint_of(url: Any) -> str:
    """The host (and port, when it is not the scheme's default) of ``url`` (an SDK client's
    ``base_url``: an httpx URL or a str): the endpoint part of a deployment's key
    (``api.openai.com``, ``127.0.0.1:8000``); ``-`` when there is none."""
    host = getattr(url, "host", None)
    if host is None:
        try:
            return (urlsplit(url).netloc.rpartition("@")[2] or "-") if isinstance(url, str) else "-"
        except ValueError:
            return "-"
    port = getattr(url, "port", None)
    return str(host) if port is None else f"{host}:{port}"


def model_key(endpoint: str) -> Callable[..., str | None]:
    """A generation's key from its keyword arguments: ``<endpoint>/<model>`` (None without a
    str ``model``: the call runs on the stage's own instance)."""

    def key(*args: Any, **kwargs: Any) -> str | None:
        model = kwargs.get("model")
        return f"{endpoint}/{model}" if isinstance(model, str) else None

    return key


def header_option(given: str | None) -> str | None:
    """A wrapper's ``tenant_header=``: None, or an HTTP field name (lowercased); else ConfigError."""
    return None if given is None else field_name("tenant_header", given)


class Attempts:
    """The attempts one call of a wrapped SDK method has made so far: :meth:`next` numbers each
    (0 for the first), as the SDK numbers its own retries in :data:`RETRY_COUNT_HEADER`."""

    __slots__ = ("made",)

    def __init__(self) -> None:
        self.made = 0

    def next(self) -> int:
        made = self.made
        self.made = made + 1
        return made


_outgoing: ContextVar[Mapping[str, str] | None] = ContextVar("ragguard_tenant_headers", default=None)


def tenant_headers() -> Mapping[str, str]:
    """The tenant header of the wrapped call running now (``{"x-tenant-id": "acme"}``), as the
    Guard's (or the wrapper's) ``tenant_header`` names it; {} outside one, or when none is named.
    What :func:`send_tenant_header` adds to a request."""
    return _outgoing.get() or {}


async def send_tenant_header(request: Any) -> None:
    """An httpx event hook (``httpx.AsyncClient(event_hooks={"request": [send_tenant_header]})``,
    the same for ``httpx2``): adds :func:`tenant_headers` to each request a wrapped call makes, for
    a client ragguard cannot reach into (a LlamaIndex embedding model's own SDK client). A header
    the request sets itself is kept."""
    for name, value in tenant_headers().items():
        if name not in request.headers:
            request.headers[name] = value


@contextlib.contextmanager
def sending_tenant(header: str | None) -> Iterator[None]:
    """While it is open, the current tenant goes out in ``header`` (None: nothing changes) from
    the clients that read the context: :func:`send_tenant_header`, and qdrant-client (REST and
    gRPC) through its own context headers."""
    if header is None:
        yield
        return
    sent = {header: ragguard.current_tenant()}
    token = _outgoing.set(sent)
    try:
        with _qdrant_context(sent):
            yield
    finally:
        _outgoing.reset(token)


_QDRANT_HEADERS: Any = None


def _qdrant_context(sent: Mapping[str, str]) -> contextlib.AbstractContextManager[Any]:
    """qdrant-client's ``context_headers.headers(...)`` when qdrant-client is imported and has it
    (it sends them with every REST and gRPC request made in the context), else nothing."""
    global _QDRANT_HEADERS
    if _QDRANT_HEADERS is None:
        import sys

        if "qdrant_client" not in sys.modules:
            return contextlib.nullcontext()
        try:
            from qdrant_client import context_headers
        except ImportError:
            log.warning("qdrant-client has no context_headers (an older release): the tenant header "
                        "is not sent to Qdrant")
            _QDRANT_HEADERS = False
        else:
            _QDRANT_HEADERS = context_headers.headers
    if _QDRANT_HEADERS is False:
        return contextlib.nullcontext()
    return _QDRANT_HEADERS(dict(sent))  # type: ignore[no-any-return]


def sdk_options(
    stages: Stages,
    stage: str,
    kwargs: Mapping[str, Any],
    tenant_header: str | None,
    *,
    retries: int | None = None,
    timeout_name: str = "timeout",
    headers_name: str = "extra_headers",
) -> dict[str, Any]:
    """``kwargs`` with the attempt's SDK options: ``timeout`` (seconds) the smallest of the
    caller's own, the stage's ``timeout_s`` and the deadline's remaining seconds, plus
    :data:`SDK_TIMEOUT_GRACE_S` (unchanged when none of them is set); merged into the caller's
    extra headers, the current tenant's id in the header ``tenant_header`` (when one is named:
    the wrapper's own, else the Guard's) and the attempt's number ``retries`` in
    :data:`RETRY_COUNT_HEADER` (unless the caller set that header itself)."""
    out = dict(kwargs)
    bounds = [b for b in (stages.timeout_s(stage), ragguard.remaining()) if b is not None]
    if bounds:
        bound = min(bounds) + SDK_TIMEOUT_GRACE_S
        given = out.get(timeout_name)
        if isinstance(given, (int, float)) and not isinstance(given, bool):
            bound = min(bound, float(given))
        if given is None or isinstance(given, (int, float)):
            out[timeout_name] = bound
    tenant_header = stages.tenant_header(tenant_header)
    if tenant_header or retries is not None:
        headers = dict(out.get(headers_name) or {})
        if tenant_header:
            headers[tenant_header] = ragguard.current_tenant()
        if retries is not None and not any(k.lower() == RETRY_COUNT_HEADER for k in headers):
            headers[RETRY_COUNT_HEADER] = str(retries)
        out[headers_name] = headers
    return out


async def held_back(events: AsyncIterator[Any], is_preamble: Callable[[Any], bool]) -> AsyncIterator[Any]:
    """``events`` as they come, except that the ones before the first token (``is_preamble``: a
    role-only chunk, ``response.created``, ``message_start``...) are held back and handed over
    together with it: the stream's first item then arrives with its first token, so the
    first-item budget bounds the time to the first token and the commit point is there (a server
    that sends its preamble at once and then stalls can still be retried or replaced)."""
    held: list[Any] = []
    began = False
    async for event in events:
        if not began:
            if is_preamble(event):
                held.append(event)
                continue
            began = True
            for early in held:
                yield early
            held.clear()
        yield event
    for early in held:  # a stream with no token at all
        yield early


class GuardedStream:
    """A guarded stream opened up to its first item, as an SDK's stream reads: ``async for``,
    ``await stream.close()`` / ``aclose()``, ``async with stream:``. ``drop(item)`` True hides an
    item from the caller after ragguard counted it (the usage chunk the integration asked for)."""

    __slots__ = ("_drop", "_first", "_items", "_next", "_pending")

    def __init__(self, items: Any, first: Any, pending: bool, drop: Callable[[Any], bool] | None) -> None:
        self._items = items
        self._next = items.__aiter__().__anext__  # a guarded stream's generator: no call of ours per item
        self._first = first
        self._pending = pending
        self._drop = drop

    def __aiter__(self) -> GuardedStream:
        return self

    @property
    def ending(self) -> Any:
        """How the stream ended (:class:`ragguard.StreamEnding`), None while it runs."""
        return getattr(self._items, "ending", None)

    async def __anext__(self) -> Any:
        if self._pending:
            self._pending = False
            first, self._first = self._first, None
            if self._drop is None or not self._drop(first):
                return first
        while True:
            item = await self._next()
            if self._drop is None or not self._drop(item):
                return item

    async def aclose(self) -> None:
        """Close the stream (the upstream response with it); settles its tokens. Idempotent."""
        self._pending = False
        await self._items.aclose()

    close = aclose

    async def __aenter__(self) -> GuardedStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


async def open_stream(items: Any, drop: Callable[[Any], bool] | None = None) -> GuardedStream:
    """Open the guarded stream ``items`` up to its first item, so that what fails before it (the
    token quota, an open breaker with no fallback, a rate limit, no first token within its budget)
    raises here, where the SDK raises its HTTP errors."""
    try:
        first = await items.__anext__()
    except StopAsyncIteration:
        return GuardedStream(items, None, False, drop)
    except BaseException:
        await items.aclose()
        raise
    return GuardedStream(items, first, True, drop)


async def one_item(items: Any) -> Any:
    """The only item of a guarded stream of one (a whole response run as a stream so that the
    generation stage reserves and settles its tokens), read to the stream's end: a stream closed
    after its item would end as closed early (an attempt the breaker does not count, a stream
    settled as ``cancelled``), not as the success it is."""
    try:
        item = await items.__anext__()
        async for _ in items:  # the end of the stream of one: it ends completed
            pass
        return item
    finally:
        await items.aclose()


def streamed(fallback: Callable[..., Any]) -> Callable[..., Any]:
    """A fallback of a whole response, as the fallback of a stream of one item (its name kept for
    :func:`ragguard.degraded`)."""

    @functools.wraps(fallback)
    async def serve(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        produced = fallback(*args, **kwargs)
        if inspect.isawaitable(produced):
            produced = await produced
        yield produced

    return serve


def fallbacks(
    given: Callable[..., Any] | Sequence[Callable[..., Any]] | None, wrap: Callable[..., Any] | None = None
) -> tuple[Callable[..., Any], ...] | None:
    """The user's fallback(s) as a tuple (None: none), each passed through ``wrap``."""
    if given is None:
        return None
    chain = tuple(given) if isinstance(given, (list, tuple)) else (given,)
    return tuple(wrap(fn) for fn in chain) if wrap is not None else chain


def fallback_name(fallback: Any) -> str:
    """What :func:`ragguard.degraded` calls ``fallback``: a model by its class and its model
    (``ChatOpenAI(gpt-4o-mini)``, as a fallback of ChatOpenAI should read), a runnable by its
    ``get_name()``, a function by its ``__name__`` (give a lambda a name with
    :func:`ragguard.named`), anything else by its class."""
    get_name = getattr(fallback, "get_name", None)
    base = str(get_name()) if callable(get_name) else None
    if base is None:
        name = getattr(fallback, "__name__", None)
        base = name if isinstance(name, str) and name else type(fallback).__name__
    if not inspect.isroutine(fallback):
        for field in ("model_name", "model"):
            model = getattr(fallback, field, None)
            if isinstance(model, str) and model:
                return f"{base}({model})"
    return base


def count_text(*texts: Any) -> int:
    """Tokens of the text pieces of an item (``ragguard.rag.count_tokens`` of each str)."""
    from ragguard.rag import count_tokens

    return sum(count_tokens(t) for t in texts if isinstance(t, str))


def usage_of(input_tokens: Any, output_tokens: Any) -> Usage | None:
    """The provider's report as a :class:`ragguard.rag.Usage` (a count that is not an int >= 0 is
    not reported), None when it reports neither."""
    counts = [
        n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None
        for n in (input_tokens, output_tokens)
    ]
    return None if counts == [None, None] else Usage(*counts)


_TEXT_FIELDS = frozenset({"content", "text", "input", "instructions", "system", "arguments", "output"})
_MAX_DEPTH = 8


def prompt_tokens(*parts: Any) -> int:
    """The estimate of the input tokens a request sends: the text of ``parts`` (a str, or the
    messages of a chat request: dicts and lists, their ``content``, ``text``, ``input``,
    ``instructions``, ``system``, ``arguments`` and ``output`` fields, any depth up to 8; an
    object's ``content``), counted as ``ragguard.rag.count_tokens`` counts text (characters / 4).
    Images, file data, tool schemas and the provider's own framing are not counted: the reported
    usage settles the difference."""
    return sum(_text_tokens(part, 0) for part in parts)


def _text_tokens(value: Any, depth: int) -> int:
    if isinstance(value, str):
        return count_text(value)
    if depth >= _MAX_DEPTH:
        return 0
    if isinstance(value, Mapping):
        return sum(_text_tokens(v, depth + 1) for k, v in value.items() if k in _TEXT_FIELDS)
    if isinstance(value, (list, tuple)):
        return sum(_text_tokens(v, depth + 1) for v in value)
    content = getattr(value, "content", None)  # a LangChain message, a LlamaIndex ChatMessage
    return 0 if content is None else _text_tokens(content, depth + 1)
