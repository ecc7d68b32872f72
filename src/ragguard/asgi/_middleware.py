"""The ASGI middleware: tenant, deadline and quota in, mapped statuses out, for any ASGI app."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any

import anyio

from .._clock import monotonic
from .._compat import current_task, running_loop
from .._context import DEFAULT_TENANT
from .._deadline import Expiry, current_expiry, deadline, remaining
from .._errors import (
    ConfigError,
    DeadlineExceeded,
    InvalidInput,
    PermissionDenied,
    TellsDeadline,
    Unauthenticated,
)
from .._handler_deadline import handler_deadline
from .._http import DEGRADED_HEADER, TENANT_HEADER, TIMEOUT_HEADER, check_field_name, parse_timeout_ms
from .._identity import (
    HeaderResolver,
    HttpCaller,
    Identity,
    TenantResolver,
    check_anonymous,
    check_resolver,
    request_priority,
    resolve_identity,
)
from .._validate import seconds
from ..overload._priority import reset_priority, set_priority
from ..quotas._server import server_bulkhead
from ._status import Headers, http_status_for, json_body

if TYPE_CHECKING:
    from .._guard import Guard
    from ..quotas._tenant import TenantContext

__all__ = ["ASGIApp", "Message", "RagguardMiddleware", "Receive", "Scope", "Send"]

log = logging.getLogger("ragguard.asgi")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SSE_ERROR_EVENT = "ragguard-error"
SSE_ENDING_EVENT = "ragguard-ending"


class RagguardMiddleware:
    """Run every HTTP request of an ASGI app inside a ragguard tenant block with its deadline.

    Per request, before the app runs:

    - the tenant comes from ``tenant_resolver`` (see :mod:`ragguard.asgi` and
      :class:`~ragguard.asgi.Caller`): a callable, plain or async, given the request and
      returning its tenant id, an :class:`~ragguard.asgi.Identity` or None. The default,
      ``HeaderResolver(tenant_header)``, takes the ``x-tenant-id`` field as sent: trust it only
      behind a proxy that sets it. A request with no identity runs as the ``anonymous`` tenant
      (default ``"default"``; None refuses it with 401). A resolver's Unauthenticated answers 401
      with ``WWW-Authenticate``, PermissionDenied 403, InvalidInput 400 (a malformed id, a field
      sent twice); any other error or result of the resolver 401, logged;
    - the request's priority comes from the ``x-priority`` field (see :mod:`ragguard.overload`):
      it may lower the tenant's configured priority, and raise it only for a trusted identity;
    - the ``timeout_header`` field (default ``x-request-timeout-ms``: the caller's remaining
      budget in milliseconds) becomes the ragguard deadline; the tenant's ``timeout_s`` may
      shorten it; a malformed value answers 400;
    - the tenant's quota admits the request (``guard.tenant(id)``; the default registry, looked
      up per request, when ``guard`` is None); over quota answers 429.

    The request body reaches the app under the deadline and ``body_timeout_s`` (default 10 s,
    None for no bound): once the app has waited that long in all for body chunks, or the deadline
    passes while it waits, its ``receive()`` raises InvalidInput (400) or DeadlineExceeded (504),
    so a client that trickles its body cannot hold the tenant's slot past either.

    Inside the app, :func:`ragguard.current_tenant`, :func:`ragguard.remaining` and
    :func:`ragguard.degraded` work in endpoints, dependencies and their child tasks.

    Errors leaving the app become responses by their outcome (:func:`ragguard.asgi.http_status_for`,
    :mod:`ragguard.outcomes`): QuotaExceeded 429; BreakerOpen, Overloaded and a dependency's
    rejection 503; a dependency's failure 502; DeadlineExceeded, StageTimeout and a dependency's
    timeout 504; InvalidInput 400; with ``Retry-After`` (whole seconds, rounded up, at least 1) and
    ``retry-after-ms`` (exact) when a wait helps; no body names an upstream URL, host or port.
    Other errors are left to the app and the server. This holds whether the
    middleware is added with ``app.add_middleware(RagguardMiddleware)`` or wraps the whole app
    (then Starlette's error middleware has already sent its 500: it is replaced).

    The request's deadline bounds the whole handler, not only its guarded stages
    (``enforce_deadline``, default True): when it passes the handler is cancelled and the request
    answered 504 (a stream already started is ended, SSE with a ``ragguard-error`` event).

    A response served in part by fallbacks names them in ``degraded_header`` (default
    ``ragguard-degraded``), as far as they are known when the response starts.

    An SSE response (``text/event-stream``) tells how each guarded stream of the request ended
    (:class:`ragguard.StreamEnding`): one ``event: ragguard-ending`` whose data is the ending's
    JSON (``{"ending": "continued", "stage": ..., "items": ..., "continued_by": ...,
    "continued_after": ..., "error": ...}``), sent before the next message the app sends once the
    stream has ended (before a ``data: [DONE]``, before the response's end), and before a
    ``ragguard-error`` event (``ending_events=False``: none).

    Streaming responses (SSE, chunked) hold the tenant's slot until the last chunk. When the client
    disconnects first, the app is cancelled (``cancel_on_disconnect``, default True) and the slot
    released at once, for plain responses too. The watch for a disconnect starts only once the app
    waits for something (its first real await) or reads the request: an app that answers without
    waiting costs no watcher task. An error after the response started cannot change
    its status: an SSE stream gets one ``event: ragguard-error`` with the JSON body, then every
    stream is ended cleanly and the error logged (``ragguard.asgi``; with its traceback when the
    mapping does not know it) rather than re-raised, since servers drop the connection under an
    app that raises after responding. A response with a declared Content-Length cannot end early:
    the error is re-raised and the server aborts it.

    ``max_concurrent_requests``: the requests the service serves at once, all tenants together
    (None, the default: no such bound here). A request holds one from the moment its tenant is
    known until the server's task for it ends, waiting in its tenant's quota or running; once
    ``max_concurrent_requests - headroom`` are held (``headroom`` default 0: kept for tenants
    lighter than the heaviest), the waiting request of the tenant holding the most per unit of
    its ``weight`` is shed for a lighter tenant's arrival, or the arrival refused when its own
    tenant holds the most: 429 with ``Retry-After`` (:class:`~ragguard.QuotaExceeded`, reason
    ``server``; docs/http.md). Use it instead of the server's tenant-blind limit (uvicorn's
    ``--limit-concurrency``, which counts connections too), or below it.

    ``exempt_paths`` (default ``("/health", "/metrics")``) and everything below them pass through
    with no tenant, deadline or quota, as do lifespan and websocket scopes.
    ``ratelimit_fields``: send the draft ``RateLimit`` field on quota 429s (default True).
    Raises :class:`~ragguard.ConfigError` for invalid options.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        guard: Guard | None = None,
        tenant_resolver: TenantResolver | None = None,
        anonymous: str | None = DEFAULT_TENANT,
        tenant_header: str = TENANT_HEADER,
        timeout_header: str | None = TIMEOUT_HEADER,
        body_timeout_s: float | None = 10.0,
        exempt_paths: Iterable[str] = ("/health", "/metrics"),
        degraded_header: str | None = DEGRADED_HEADER,
        ratelimit_fields: bool = True,
        cancel_on_disconnect: bool = True,
        enforce_deadline: bool = True,
        ending_events: bool = True,
        max_concurrent_requests: int | None = None,
        headroom: int | None = None,
    ) -> None:
        if not callable(app):
            raise ConfigError(f"RagguardMiddleware: app must be an ASGI callable, got {app!r}")
        if guard is not None and not callable(getattr(guard, "tenant", None)):
            raise ConfigError(f"RagguardMiddleware: guard must be a ragguard.Guard, got {guard!r}")
        self.app = app
        self._guard = guard
        self.tenant_header = check_field_name("tenant_header", tenant_header)
        if tenant_resolver is None:
            tenant_resolver = HeaderResolver(self.tenant_header)
        elif tenant_header != TENANT_HEADER:
            raise ConfigError("RagguardMiddleware: give tenant_resolver or tenant_header, not both")
        self.tenant_resolver = check_resolver(tenant_resolver)
        self.anonymous = anonymous
        self._anonymous = check_anonymous(anonymous)
        self.body_timeout_s = (
            None if body_timeout_s is None else seconds("body_timeout_s", body_timeout_s, max_s=86_400)
        )
        self.timeout_header = (
            None if timeout_header is None else check_field_name("timeout_header", timeout_header)
        )
        self.degraded_header = (
            None if degraded_header is None else check_field_name("degraded_header", degraded_header)
        )
        self.exempt_paths = _paths(exempt_paths)
        self.ratelimit_fields = bool(ratelimit_fields)
        self.cancel_on_disconnect = bool(cancel_on_disconnect)
        self.enforce_deadline = bool(enforce_deadline)
        self.ending_events = bool(ending_events)
        self.bulkhead = server_bulkhead(
            "max_concurrent_requests", max_concurrent_requests, headroom,
            monotonic if guard is None else guard.clock,
        )
        self._later: _WatchLater | None = None

    def _watch_later(self, loop: asyncio.AbstractEventLoop) -> _WatchLater:
        later = self._later
        if later is None or later.loop is not loop:
            later = self._later = _WatchLater(loop)
        return later

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._exempt(scope):
            await self.app(scope, receive, send)
            return
        exchange = _Exchange(self, receive, send)
        caller = HttpCaller(scope)
        try:
            identity = resolve_identity(self.tenant_resolver, caller, self._anonymous)
            if not isinstance(identity, Identity):
                identity = await identity  # an async resolver
            budget = None
            if self.timeout_header is not None:
                raw_timeout = caller.header(self.timeout_header)
                if raw_timeout is not None:
                    budget = parse_timeout_ms(raw_timeout, self.timeout_header)
            registry = self._guard if self._guard is not None else _default_guard()
            request = registry.tenant(identity.tenant)  # a bad id raises InvalidInput here
            limit = registry.deadline(budget, set_by="client")  # on the Guard's clock
            priority = request_priority(caller, identity, registry.policy)
        except (Unauthenticated, PermissionDenied, InvalidInput) as exc:
            await exchange.finish(exc)  # 401 (with the challenge), 403 or 400: see _status
            return
        if priority is None:
            await exchange.run(scope, request, limit)
            return
        token = set_priority(priority)  # the stages' adaptive limits shed by it
        try:
            await exchange.run(scope, request, limit)
        finally:
            reset_priority(token)

    def _exempt(self, scope: Scope) -> bool:
        if not self.exempt_paths:
            return False
        path: str = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        return any(path == p or path.startswith(p + "/") for p in self.exempt_paths)


class _BodyReader:
    """The app's ``receive()``, bounding how long the app waits for the request body: at most
    ``body_timeout_s`` in all, and never past the request's deadline. Once the body is complete,
    messages (the disconnect) pass through unbounded. Once a wait was cut, every later
    ``receive()`` says the client is gone, and the response asks the server to close the
    connection (``connection: close``): the rest of the body will never be read."""

    __slots__ = ("_cut", "_done", "_exchange", "_left", "_receive", "_total", "_waiting")

    def __init__(self, exchange: _Exchange, receive: Receive, body_timeout_s: float | None) -> None:
        self._exchange = exchange
        self._receive = receive
        self._total = self._left = body_timeout_s
        self._done = self._cut = self._waiting = False

    async def __call__(self) -> Message:
        if self._done:
            return await self._receive()
        if self._cut:
            return {"type": "http.disconnect"}
        left, deadline_left = self._left, remaining()
        # a body message is awaited: a handler deadline that passes now cut the body (unread());
        # left set when the wait raises, as a cancellation does
        self._waiting = True
        if left is None and deadline_left is None:
            message = await self._receive()
        else:
            wait = min(x for x in (left, deadline_left) if x is not None)
            start = anyio.current_time()
            with anyio.move_on_after(wait) as cut:
                message = await self._receive()
            if cut.cancelled_caught:
                self._cut = True
                self._exchange._send = _closing(self._exchange._send)
                if left is None or (deadline_left is not None and deadline_left <= left):
                    raise DeadlineExceeded("request body", deadline_left, "the client had not sent all of it")
                raise InvalidInput(
                    f"the request body did not arrive within body_timeout_s ({self._total:g} s)"
                )
            if left is not None:
                self._left = left - (anyio.current_time() - start)
        self._waiting = False
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._done = True  # complete (or the client left): waiting for the disconnect is not bounded
        return message

    def unread(self, exc: DeadlineExceeded) -> DeadlineExceeded:
        """What the deadline ``exc`` (the handler's) answers: when it passed while the app waited
        for the body, the same 504 as a cut body read, and the connection closed (the rest of the
        body will never be read); else ``exc`` itself."""
        if not self._waiting or self._cut:
            return exc
        self._cut = True
        self._exchange._send = _closing(self._exchange._send)
        cut = "the client had not sent all of it"
        return DeadlineExceeded("request body", exc.budget_s, cut, exc.deadline_s, set_by=exc.set_by)


def _closing(send: Send) -> Send:
    """``send``, adding ``connection: close`` to the response's start (RFC 9110 section 9.6)."""

    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        await send(message)

    return closing


class _WatchLater:
    """Starts the disconnect watchers of the requests still running when ``loop`` next gets
    control: one ``call_soon`` per loop iteration for all of them, none per request, so a request
    whose app answers without waiting costs a dict insert and delete, not a task."""

    __slots__ = ("_scheduled", "exchanges", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.exchanges: dict[_Exchange, None] = {}
        self._scheduled = False

    def add(self, exchange: _Exchange) -> None:
        self.exchanges[exchange] = None
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._start)

    def discard(self, exchange: _Exchange) -> None:
        self.exchanges.pop(exchange, None)

    def _start(self) -> None:
        self._scheduled = False
        waiting, self.exchanges = self.exchanges, {}
        for exchange in waiting:
            exchange._start_watcher()


class _Exchange:
    """One request's traffic between the server and the app: what was sent, what is held back,
    and (with ``cancel_on_disconnect``) the only reader of the server's ``receive``."""

    __slots__ = (
        "_cancel",
        "_cut",
        "_held",
        "_inbox",
        "_mail",
        "_middleware",
        "_receive",
        "_running",
        "_send",
        "_starter",
        "_taken",
        "_told",
        "_watcher",
        "complete",
        "content_length",
        "disconnected",
        "ended_in",
        "event_stream",
        "request",
        "started",
    )

    def __init__(self, middleware: RagguardMiddleware, receive: Receive, send: Send) -> None:
        self._middleware = middleware
        self._receive = receive
        self._send = send
        self._held: list[Message] | None = None  # a 500 start (and body) kept until the app ends
        self._inbox: deque[Message] = deque()
        self._mail: anyio.Event | None = None  # made when the app waits for a message
        self._taken: anyio.Event | None = None  # made when the watcher waits for the app
        self._cancel: Callable[[], Any] | None = None  # cancels the app when the client leaves
        self._running = False  # the app (or its admission) is running: a disconnect cancels it
        self._cut = False  # the app was cancelled because the client left
        self._starter: _WatchLater | None = None  # starts the watcher once the app waits
        self._watcher: asyncio.Task[None] | None = None
        self.request: TenantContext | None = None
        self.ended_in: TenantContext | None = None  # the request whose stream endings are told
        self._told = 0  # stream endings told so far (SSE)
        self.started = False
        self.complete = False
        self.disconnected = False
        self.event_stream = False
        self.content_length = False

    # -- the request ------------------------------------------------------------------------

    async def run(self, scope: Scope, request: TenantContext, limit: deadline) -> None:
        if not self._middleware.cancel_on_disconnect:
            failure = await self._serve(scope, request, limit, self._receive)
        else:
            loop = running_loop()  # None under trio
            task = None if loop is None else current_task(loop)
            if task is not None:
                failure = await self._serve_watched_asyncio(scope, request, limit, task)
            else:
                failure = await self._serve_watched_anyio(scope, request, limit)
        await self.finish(failure)

    async def _serve(
        self, scope: Scope, request: TenantContext, limit: deadline, receive: Receive
    ) -> Exception | None:
        body = _BodyReader(self, receive, self._middleware.body_timeout_s)
        expiry = None
        try:
            with limit:
                bulkhead = self._middleware.bulkhead
                async with request if bulkhead is None else bulkhead.seat(request):
                    self.request = request
                    if self._middleware.ending_events:
                        self.ended_in = request
                    expiry = current_expiry()  # the client's deadline, or the tenant's if sooner
                    if expiry is None or not self._middleware.enforce_deadline:
                        await self._middleware.app(scope, body, self.send)
                    else:
                        await self._bounded(scope, body, expiry)
        except Exception as exc:
            if expiry is not None and isinstance(exc, TellsDeadline):
                exc.told_by(expiry.budget_s, expiry.set_by)
            return body.unread(exc) if isinstance(exc, DeadlineExceeded) else exc
        finally:
            self.request = None
        return None

    async def _bounded(self, scope: Scope, receive: Receive, expiry: Expiry) -> None:
        """Run the app until the request's deadline: past it, cancel the app and raise
        DeadlineExceeded (504), whether or not the app awaits a guarded stage."""
        with handler_deadline(expiry):
            await self._middleware.app(scope, receive, self.send)

    async def _serve_watched_asyncio(
        self, scope: Scope, request: TenantContext, limit: deadline, task: asyncio.Task[Any]
    ) -> Exception | None:
        # asyncio without a task group (which costs a loop iteration per request): the watcher
        # cancels this task, and the cancellation is taken back here (uncancel) when it was ours.
        # The watcher task starts only when the loop gets control while the app runs (its first
        # real await) or when the app reads: an app that answers at once never pays for a task.
        self._cancel = task.cancel
        self._starter = self._middleware._watch_later(task.get_loop())
        self._starter.add(self)
        self._running = True
        failure: Exception | None = None
        try:
            failure = await self._serve(scope, request, limit, self.receive)
        except asyncio.CancelledError:
            if not self._cut or task.uncancel() > 0:
                raise  # not ours, or the server cancels this request too
            return None
        finally:
            self._running = False
            if self._watcher is not None:
                self._watcher.cancel()
            elif self._starter is not None:
                self._starter.discard(self)
                self._starter = None
        if self._cut:
            task.uncancel()  # the app swallowed our cancellation
        return failure

    def _start_watcher(self) -> None:
        self._starter = None
        if self._watcher is None and self._running:
            self._watcher = running_loop().create_task(self._watch())  # type: ignore[union-attr]

    async def _serve_watched_anyio(
        self, scope: Scope, request: TenantContext, limit: deadline
    ) -> Exception | None:
        failure: Exception | None = None
        async with anyio.create_task_group() as tasks:
            self._cancel = tasks.cancel_scope.cancel
            tasks.start_soon(self._watch)
            self._running = True
            try:
                failure = await self._serve(scope, request, limit, self.receive)
            finally:
                self._running = False
                tasks.cancel_scope.cancel()  # stop watching: the app is done
        return failure

    async def finish(self, failure: Exception | None) -> None:
        """Answer for the app: forward what it held back, or the response ``failure`` maps to."""
        if failure is None:
            await self._release_held()
            return
        status = http_status_for(failure, ratelimit_fields=self._middleware.ratelimit_fields)
        if self.disconnected:
            if status is None:
                raise failure
            return  # nobody to tell
        if not self.started:
            if status is None:
                await self._release_held()  # the app's own 500, if it sent one
                raise failure
            self._held = None  # a 500 the app's error middleware made of this very error
            code, headers, body = status
            payload = json_body(body)
            headers = [
                *headers,
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ]
            await self._send({"type": "http.response.start", "status": code, "headers": headers})
            await self._send({"type": "http.response.body", "body": payload, "more_body": False})
            self.started = self.complete = True
            return
        if self.content_length and not self.complete:
            raise failure  # a fixed-length body cannot end early: the server aborts it
        if not self.complete:
            await self._tell_endings()
            if status is not None and self.event_stream:
                data = json.dumps({"status": status[0], **status[2]})
                event = f"event: {SSE_ERROR_EVENT}\ndata: {data}\n\n".encode()
                await self._send({"type": "http.response.body", "body": event, "more_body": True})
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            self.complete = True
        # Not re-raised: a server closes the connection under an app that raises after
        # responding, which can cut the response short at the client.
        if status is None:
            log.error("error after the response started; the response was ended cleanly", exc_info=failure)
        else:
            log.info("ragguard error after the response started: %s", failure)

    # -- what the app sends -----------------------------------------------------------------

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start" and not self.started and self._held is None:
            if message.get("status") == 500:
                # Starlette's error middleware answers 500 and then re-raises: hold it until the
                # app ends, so a ragguard error can still become its proper status
                self._held = [message]
                return
            await self._start(message)
            return
        if self._held is not None:
            self._held.append(message)
            if message.get("more_body", False):
                await self._release_held()  # a streamed 500 is the app's own: let it flow
            return
        if kind == "http.response.body":
            if self.ended_in is not None and self.ended_in.endings is not None:
                await self._tell_endings()
            if not message.get("more_body", False):
                self.complete = True  # before sending: the server's receive() wakes on it
        elif kind in ("http.response.pathsend", "http.response.zerocopysend"):
            self.complete = True
        await self._send(message)

    async def _start(self, message: Message) -> None:
        headers: Headers = list(message.get("headers", ()))
        for key, value in headers:
            if key == b"content-type" and value.split(b";")[0].strip().lower() == b"text/event-stream":
                self.event_stream = True
            elif key == b"content-length":
                self.content_length = True
        degraded_header = self._middleware.degraded_header
        request = self.request
        if degraded_header is not None and request is not None and request.fallbacks:
            names = ", ".join(dict.fromkeys(request.fallbacks))
            message = {**message, "headers": [*headers, (degraded_header.encode(), names.encode())]}
        self.started = True
        await self._send(message)

    async def _tell_endings(self) -> None:
        """Send the endings of the request's streams not told yet, as SSE events (an SSE response
        that has started and not ended only)."""
        request = self.ended_in
        if request is None or not self.event_stream or not self.started or self.complete:
            return
        endings = request.endings
        if not endings:
            return
        total = request.ended_before + len(endings)
        if total <= self._told:
            return
        fresh = endings[max(0, len(endings) - (total - self._told)) :]
        self._told = total
        body = "".join(
            f"event: {SSE_ENDING_EVENT}\ndata: {json.dumps(ending.as_dict())}\n\n" for ending in fresh
        )
        await self._send({"type": "http.response.body", "body": body.encode(), "more_body": True})

    async def _release_held(self) -> None:
        held, self._held = self._held, None
        if not held or self.disconnected:
            return
        await self._start(held[0])
        for message in held[1:]:
            await self.send(message)

    # -- what the app receives --------------------------------------------------------------

    async def receive(self) -> Message:
        if self._starter is not None:  # the app reads before its first await: watch from now on
            self._starter.discard(self)
            self._start_watcher()
        while not self._inbox:
            if self._mail is None or self._mail.is_set():  # concurrent receivers share one event
                self._mail = anyio.Event()
            await self._mail.wait()
        message = self._inbox[0]
        if message["type"] != "http.disconnect":  # a disconnect stays: every later receive gets it
            self._inbox.popleft()
            if self._taken is not None:
                self._taken.set()
        return message

    def _deliver(self, message: Message) -> None:
        self._inbox.append(message)
        if self._mail is not None:
            self._mail.set()

    async def _watch(self) -> None:
        """Read the server's messages for the app; cancel the app when the client disconnects
        before the response is complete. The body is read no faster than the app takes it;
        once it is complete, the only message left to wait for is the disconnect."""
        try:
            while True:
                message = await self._receive()
                self._deliver(message)
                if message["type"] == "http.disconnect":
                    self.disconnected = True
                    if self._running and not self.complete and self._cancel is not None:
                        self._cut = True
                        self._cancel()
                    return
                if message.get("more_body", False):
                    while self._inbox:
                        self._taken = anyio.Event()
                        await self._taken.wait()
        except Exception:  # a server that cannot be read: the app finds out on its own
            log.debug("ragguard.asgi: receive() failed while watching for a disconnect", exc_info=True)
            self._deliver({"type": "http.disconnect"})



def _paths(paths: Iterable[str]) -> tuple[str, ...]:
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Iterable):
        raise ConfigError(f"exempt_paths must be a collection of paths, got {paths!r}")
    checked = []
    for path in paths:
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError(f"exempt_paths: {path!r} is not a path starting with '/'")
        checked.append(path.rstrip("/") or "/")
    return tuple(checked)


def _default_guard() -> Guard:
    from .._guard import default_guard

    return default_guard()
