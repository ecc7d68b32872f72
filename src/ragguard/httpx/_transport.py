"""The httpx transport: tenant and remaining deadline out, classified statuses in."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx

from .._context import DEFAULT_TENANT, current_tenant
from .._deadline import Expiry, current_expiry
from .._errors import ConfigError, DeadlineExceeded
from .._http import TENANT_HEADER, TIMEOUT_HEADER, check_field_name, format_timeout_ms
from ._errors import ERROR_BODY_BYTES, RemoteDeadlineExceeded, RemoteQuotaExceeded, RemoteUnavailable

__all__ = ["GuardTransport"]

_TIMEOUT_KEYS = ("connect", "read", "write", "pool")
_SENT_DEADLINE = "ragguard.sent_deadline"  # a request extension: the timeout field is the deadline's


class GuardTransport(httpx.AsyncBaseTransport):
    """An async httpx transport that carries ragguard's context to the server and back.

    ::

        client = httpx.AsyncClient(transport=GuardTransport())           # wraps httpx's own
        client = httpx.AsyncClient(transport=GuardTransport(httpx.AsyncHTTPTransport(retries=1)))

    Per request:

    - the current tenant (:func:`ragguard.current_tenant`) goes out in ``tenant_header`` (default
      ``x-tenant-id``), unless it is the default tenant or the request sets the field itself;
    - with a ragguard deadline, what is left of it goes out in ``timeout_header`` (default
      ``x-request-timeout-ms``, whole milliseconds rounded down; a smaller value the request
      already carries is kept), each of httpx's connect/read/write/pool timeouts is cut to it,
      and the whole exchange, response body included, must end by it. When the deadline, not a
      timeout of the caller's own, cuts the request, :class:`~ragguard.DeadlineExceeded` is
      raised (the httpx timeout is its ``__context__``): the caller's short budget says nothing
      of the server, so the breakers do not count it. A request whose deadline is already spent
      is not sent.
    - a 429 answer raises :class:`RemoteQuotaExceeded` (a dependency's rejection) and a 503
      :class:`RemoteUnavailable` (a failure, or a rejection when it states a wait), both with
      ``retry_after_s`` from ``retry-after-ms``, ``Retry-After`` or the rate-limit resets (see
      :mod:`ragguard.httpx._errors`); their body is read first, at most ``ERROR_BODY_BYTES``
      (8 KiB) of it, so ``exc.response.text`` works (a body that fails to arrive or decode is
      left unread: the status is the news).
    - a 504 answer raises :class:`RemoteDeadlineExceeded`, with ``set_by`` and ``deadline_s``:
      what a ragguard server's JSON body said set the deadline that ran out there. At most
      ``ERROR_BODY_BYTES`` (8 KiB) of its body are read (``exc.response.text`` holds them); a
      body that fails to arrive or decode leaves both None. When the server says the client's
      deadline ran out and the timeout field it got was this request's deadline (sent by the
      transport), the error is the request's deadline (``request_deadline``), not the server's
      slowness: no breaker counts it.
    - ``raise_statuses=False`` hands every response back unchanged.

    The field names are the ones :class:`ragguard.asgi.RagguardMiddleware` reads, so two ragguard
    services chain. ``transport`` default: ``httpx.AsyncHTTPTransport()``. Raises
    :class:`~ragguard.ConfigError` for invalid options.
    """

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        tenant_header: str = TENANT_HEADER,
        timeout_header: str | None = TIMEOUT_HEADER,
        raise_statuses: bool = True,
    ) -> None:
        if transport is not None and not isinstance(transport, httpx.AsyncBaseTransport):
            raise ConfigError(
                f"transport must be an httpx.AsyncBaseTransport, got {type(transport).__name__}"
            )
        self._transport = transport if transport is not None else httpx.AsyncHTTPTransport()
        self.tenant_header = check_field_name("tenant_header", tenant_header)
        self.timeout_header = (
            None if timeout_header is None else check_field_name("timeout_header", timeout_header)
        )
        self.raise_statuses = bool(raise_statuses)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        tenant = current_tenant()
        if tenant != DEFAULT_TENANT and self.tenant_header not in request.headers:
            request.headers[self.tenant_header] = tenant
        expiry = current_expiry()
        if expiry is None:
            response = await self._transport.handle_async_request(request)
        else:
            response = await self._within(request, expiry)
        if self.raise_statuses and response.status_code == 504:
            response.request = request
            await _read_capped(response, ERROR_BODY_BYTES)
            sent = request.extensions.get(_SENT_DEADLINE) is True
            raise RemoteDeadlineExceeded(response, request_deadline=sent)
        if self.raise_statuses and response.status_code in (429, 503):
            response.request = request
            await _read_capped(response, ERROR_BODY_BYTES)
            if response.status_code == 429:
                raise RemoteQuotaExceeded(response, tenant)
            raise RemoteUnavailable(response)
        return response

    async def _within(self, request: httpx.Request, at: Expiry) -> httpx.Response:
        what = f"http {request.method}"  # no host: a front door shows this stage name to callers
        left = at.left()
        if left <= 0.0:
            raise _exceeded(what, None, at, "no time left to send the request")
        if self.timeout_header is not None:
            sent = request.headers.get(self.timeout_header)
            mine = format_timeout_ms(left)
            if sent is None or not sent.isdigit() or int(sent) > int(mine):
                request.headers[self.timeout_header] = mine
                request.extensions[_SENT_DEADLINE] = True
        timeouts = dict(request.extensions.get("timeout") or {})
        for key in _TIMEOUT_KEYS:
            given = timeouts.get(key)
            timeouts[key] = left if given is None or given > left else given
        request.extensions["timeout"] = timeouts
        try:
            with anyio.fail_after(left):
                response = await self._transport.handle_async_request(request)
        except (TimeoutError, httpx.TimeoutException):
            if _spent(at):
                raise _exceeded(what, left, at) from None  # see _not_a_timeout
            raise
        if isinstance(response.stream, httpx.AsyncByteStream):
            response.stream = _DeadlineStream(response.stream, at, what, left)
        return response

    async def aclose(self) -> None:
        await self._transport.aclose()


# _not_a_timeout: a DeadlineExceeded raised here keeps the httpx timeout as ``__context__``, not
# ``__cause__``: the breakers' classifiers follow ``__cause__``, and would count the caller's
# spent budget as a timeout of the server.


def _exceeded(what: str, budget_s: float | None, at: Expiry, detail: str = "") -> DeadlineExceeded:
    return DeadlineExceeded(what, budget_s, detail, at.budget_s, set_by=at.set_by)


def _spent(at: Expiry) -> bool:
    # timers may fire a hair before the deadline they were set for
    return at.left() <= 0.001


async def _read_capped(response: httpx.Response, limit: int) -> None:
    """Read at most ``limit`` bytes of ``response``'s body, as sent and as decoded, into
    ``response.content``, and close it. A body that breaks off or does not decode keeps what was
    read of it: the status is the news, so its httpx error is not raised (for a 504, the
    deadline's own DeadlineExceeded is). The body is fed to httpx's decoder 1 KiB at a time, so a
    compressed one inflates no further than what one KiB decodes to before it is cut (gzip:
    about 1 MB)."""
    if not isinstance(response.stream, httpx.AsyncByteStream):
        await response.aclose()
        return
    response.stream = _Capped(response.stream, limit)
    parts: list[bytes] = []
    size = 0
    try:
        async for part in response.aiter_bytes():
            parts.append(part)
            size += len(part)
            if size >= limit:
                break
    except (httpx.TransportError, httpx.DecodingError):
        pass
    finally:
        # what aread() would have stored, cut: httpx keeps a read body there
        response._content = b"".join(parts)[:limit]
        await response.aclose()


_FEED = 1024  # raw bytes handed to the decoder at a time


class _Capped(httpx.AsyncByteStream):
    """The first ``limit`` bytes of a body, in pieces of at most 1 KiB; what comes after is never
    read."""

    def __init__(self, inner: httpx.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        left = self._limit
        chunks = self._inner.__aiter__()
        try:
            async for chunk in chunks:
                chunk = chunk[:left]
                left -= len(chunk)
                for at in range(0, len(chunk), _FEED):
                    yield chunk[at : at + _FEED]
                if left <= 0:
                    return
        finally:
            close = getattr(chunks, "aclose", None)  # an async generator: end it now, not at GC
            if close is not None:
                await close()

    async def aclose(self) -> None:
        await self._inner.aclose()


class _DeadlineStream(httpx.AsyncByteStream):
    """A response body that must arrive by the deadline ``at``."""

    def __init__(self, inner: httpx.AsyncByteStream, at: Expiry, what: str, budget_s: float) -> None:
        self._inner = inner
        self._at = at
        self._what = what
        self._budget_s = budget_s

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._inner.__aiter__()
        while True:
            left = self._at.left()
            if left <= 0.0:
                raise _exceeded(self._what, self._budget_s, self._at, "response body cut")
            try:
                with anyio.fail_after(left):
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            except (TimeoutError, httpx.TimeoutException):
                if _spent(self._at):
                    raise _exceeded(self._what, self._budget_s, self._at, "response body cut") from None
                raise
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
