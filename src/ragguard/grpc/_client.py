"""The grpc.aio client interceptor: tenant and remaining deadline out, classified errors in."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Generator
from typing import Any

from grpc import aio
from grpc.aio import AioRpcError, ClientCallDetails, Metadata

from .._context import DEFAULT_TENANT, current_tenant
from .._deadline import remaining
from .._errors import ConfigError
from ._errors import remote_error
from ._server import _METADATA_KEY, TENANT_KEY

__all__ = ["client_interceptors"]


def client_interceptors(*, tenant_key: str = TENANT_KEY) -> list[aio.ClientInterceptor]:
    """The ragguard interceptors for a grpc.aio channel, one per RPC kind.

    - The current tenant (:func:`ragguard.current_tenant`) goes out as metadata ``tenant_key``
      (default ``x-tenant-id``), unless it is the default tenant or the call already sets it.
    - The remaining deadline (:func:`ragguard.remaining`) becomes the call's ``timeout``, or
      shortens the timeout the caller gave; it never lengthens it.
    - Failures come back classified: UNAVAILABLE as :class:`RemoteUnavailable` (a
      ConnectionError), DEADLINE_EXCEEDED as :class:`RemoteDeadlineExceeded` (a TimeoutError;
      ``request_deadline`` True when the call's timeout was the request's deadline, which then
      ran out: classified as the request's deadline, not as the server's slowness; ``set_by``
      and ``deadline_s``: what a ragguard server said set the deadline and its budget),
      RESOURCE_EXHAUSTED as :class:`RemoteQuotaExceeded` (a ragguard QuotaExceeded); each is
      still an ``AioRpcError`` with the original as ``__cause__``. Other statuses pass unchanged.

    Usage: ``grpc.aio.insecure_channel(target, interceptors=client_interceptors())``. (A channel
    files each interceptor object under one RPC kind only, hence four objects.)
    Raises :class:`~ragguard.ConfigError` for an invalid ``tenant_key``.
    """
    core = _Outgoing(tenant_key)
    return [
        _UnaryUnary(core),
        _UnaryStream(core),
        _StreamUnary(core),
        _StreamStream(core),
    ]


class _Outgoing:
    __slots__ = ("tenant_key",)

    def __init__(self, tenant_key: str) -> None:
        if (
            not isinstance(tenant_key, str)
            or not _METADATA_KEY.fullmatch(tenant_key)
            or tenant_key.endswith("-bin")
        ):
            raise ConfigError(
                f"tenant_key must be a lowercase ASCII metadata key (not '-bin'), got {tenant_key!r}"
            )
        self.tenant_key = tenant_key

    def __call__(self, details: ClientCallDetails) -> tuple[ClientCallDetails, str, bool]:
        """The call's details with the tenant and the deadline, its tenant, and whether its
        timeout is the request's deadline."""
        tenant = current_tenant()
        metadata = details.metadata
        if tenant != DEFAULT_TENANT and not _has_key(metadata, self.tenant_key):
            metadata = Metadata(*(metadata or ()), (self.tenant_key, tenant))
        timeout = details.timeout
        left = remaining()
        bound = left is not None and (timeout is None or left <= timeout)
        if bound:
            timeout = left
        if metadata is details.metadata and timeout == details.timeout:
            return details, tenant, bound
        return (
            ClientCallDetails(details.method, timeout, metadata, details.credentials, details.wait_for_ready),
            tenant,
            bound,
        )


Continuation = Callable[..., Awaitable[Any]]


class _UnaryUnary(aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, outgoing: _Outgoing) -> None:
        self._outgoing = outgoing

    async def intercept_unary_unary(
        self, continuation: Continuation, client_call_details: ClientCallDetails, request: Any
    ) -> Any:
        details, tenant, bound = self._outgoing(client_call_details)
        return _ClassifiedUnaryCall(await continuation(details, request), tenant, bound)


class _StreamUnary(aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, outgoing: _Outgoing) -> None:
        self._outgoing = outgoing

    async def intercept_stream_unary(
        self, continuation: Continuation, client_call_details: ClientCallDetails, request_iterator: Any
    ) -> Any:
        details, tenant, bound = self._outgoing(client_call_details)
        return _ClassifiedUnaryCall(await continuation(details, request_iterator), tenant, bound)


class _UnaryStream(aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, outgoing: _Outgoing) -> None:
        self._outgoing = outgoing

    async def intercept_unary_stream(
        self, continuation: Continuation, client_call_details: ClientCallDetails, request: Any
    ) -> Any:
        details, tenant, bound = self._outgoing(client_call_details)
        return _classified_stream(await continuation(details, request), tenant, bound)


class _StreamStream(aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, outgoing: _Outgoing) -> None:
        self._outgoing = outgoing

    async def intercept_stream_stream(
        self, continuation: Continuation, client_call_details: ClientCallDetails, request_iterator: Any
    ) -> Any:
        details, tenant, bound = self._outgoing(client_call_details)
        return _classified_stream(await continuation(details, request_iterator), tenant, bound)


def _has_key(metadata: Any, key: str) -> bool:
    return bool(metadata) and any(item[0] == key for item in metadata)


async def _classified_stream(call: AsyncIterable[Any], tenant: str, bound: bool) -> AsyncIterator[Any]:
    try:
        async for response in call:
            yield response
    except AioRpcError as err:
        mapped = remote_error(err, tenant, request_deadline=bound)
        if mapped is None:
            raise
        raise mapped from err


class _ClassifiedUnaryCall(aio.UnaryUnaryCall, aio.StreamUnaryCall):  # type: ignore[misc]
    """A unary-response call whose awaited result raises classified errors.

    Everything else (metadata, ``code()``, ``write()`` for client-streaming calls) is the
    underlying call's; returning a call rather than awaiting the response inside the interceptor
    keeps ``call.write()`` usable, which waits for the interceptor to finish.
    """

    def __init__(self, call: Any, tenant: str, bound: bool) -> None:
        self._call = call
        self._tenant = tenant
        self._bound = bound

    def __await__(self) -> Generator[Any, None, Any]:
        try:
            return (yield from self._call.__await__())
        except AioRpcError as err:
            mapped = remote_error(err, self._tenant, request_deadline=self._bound)
            if mapped is None:
                raise
            raise mapped from err

    def __getattr__(self, name: str) -> Any:  # _done_writing_flag and other internals
        return getattr(self._call, name)

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    def cancelled(self) -> bool:
        return bool(self._call.cancelled())

    def done(self) -> bool:
        return bool(self._call.done())

    def add_done_callback(self, callback: Any) -> None:
        self._call.add_done_callback(callback)

    def time_remaining(self) -> float | None:
        left: float | None = self._call.time_remaining()
        return left

    async def initial_metadata(self) -> Any:
        return await self._call.initial_metadata()

    async def trailing_metadata(self) -> Any:
        return await self._call.trailing_metadata()

    async def code(self) -> Any:
        return await self._call.code()

    async def details(self) -> Any:
        return await self._call.details()

    async def debug_error_string(self) -> Any:
        return await self._call.debug_error_string()

    async def wait_for_connection(self) -> None:
        await self._call.wait_for_connection()

    async def write(self, request: Any) -> None:
        await self._call.write(request)

    async def done_writing(self) -> None:
        await self._call.done_writing()
