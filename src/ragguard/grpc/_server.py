"""The grpc.aio server interceptor: tenant, deadline and quota in, mapped statuses out."""

from __future__ import annotations

import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any

import grpc
from grpc import aio

from .._clock import monotonic
from .._context import DEFAULT_TENANT
from .._deadline import current_expiry
from .._errors import ConfigError, InvalidInput, PermissionDenied, TellsDeadline, Unauthenticated
from .._handler_deadline import handler_deadline
from .._identity import (
    GrpcCaller,
    HeaderResolver,
    Identity,
    TenantResolver,
    check_anonymous,
    check_resolver,
    request_priority,
    resolve_identity,
)
from ..overload._priority import reset_priority, set_priority
from ..quotas._server import server_bulkhead
from ._handlers import Behavior, rebuild
from ._status import ending_trailers, status_for

if TYPE_CHECKING:
    from .._guard import Guard

__all__ = ["EXEMPT_SERVICES", "NO_DEADLINE_ABOVE_S", "TENANT_KEY", "GuardServerInterceptor"]

TENANT_KEY = "x-tenant-id"
EXEMPT_SERVICES: tuple[str, ...] = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
)
"""Services the interceptor leaves alone by default: health checks and server reflection, whose
long-lived ``Watch`` and reflection streams would otherwise hold tenant slots for ever."""
NO_DEADLINE_ABOVE_S = 10 * 365 * 24 * 3600.0
"""A client deadline further away than this (seconds) is treated as no deadline at all."""

_METADATA_KEY = re.compile(r"[0-9a-z_.-]+")
_SERVICE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def client_budget(context: aio.ServicerContext[Any, Any]) -> float | None:
    """The client's deadline as seconds left (>= 0), or None when the client set none.

    grpc.aio reports "no deadline" as None; an absurdly far deadline (some clients send
    "infinity" as a date centuries away) is None too, so it is never forwarded downstream.
    """
    left = context.time_remaining()
    if left is None or left > NO_DEADLINE_ABOVE_S:
        return None
    return max(0.0, float(left))


class GuardServerInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Run every RPC inside a ragguard tenant block with the client's deadline.

    Per call, before the handler runs:

    - the tenant comes from ``tenant_resolver``: a callable, plain or async, given the call as a
      :class:`~ragguard.grpc.Caller` (metadata, peer, and the servicer context for
      ``auth_context()``) and returning its tenant id, an :class:`~ragguard.grpc.Identity` or
      None. The default, ``HeaderResolver(tenant_key)``, takes metadata ``x-tenant-id`` as sent:
      trust it only behind a proxy that sets it. A call with no identity runs as the
      ``anonymous`` tenant (default ``"default"``; None refuses it with UNAUTHENTICATED). A
      resolver's Unauthenticated fails the call with UNAUTHENTICATED, PermissionDenied with
      PERMISSION_DENIED, InvalidInput (a malformed id, a key sent twice) with INVALID_ARGUMENT;
      any other error or result of the resolver with UNAUTHENTICATED, logged;
    - the request's priority comes from metadata ``x-priority`` (``critical``, ``interactive`` or
      ``batch``), read by the stages' adaptive limits: it may lower the tenant's configured
      priority, and raise it only for a trusted identity; a bad value fails with
      INVALID_ARGUMENT;
    - the client's deadline (``context.time_remaining()``) becomes the ragguard deadline, or no
      deadline when the client set none;
    - the tenant's quota admits the call (``guard.tenant(id)``; the default registry when
      ``guard`` is None); over quota fails with RESOURCE_EXHAUSTED and ``retry-after``.

    Errors leaving the handler are mapped by their outcome (:func:`ragguard.grpc.status_for`,
    :mod:`ragguard.outcomes`): BreakerOpen, Overloaded and a dependency's failure or rejection to
    UNAVAILABLE (with ``retry-after`` trailers when a wait helps), QuotaExceeded to
    RESOURCE_EXHAUSTED, DeadlineExceeded and timeouts to DEADLINE_EXCEEDED, InvalidInput to
    INVALID_ARGUMENT; details never name an upstream host. A status the handler set itself
    (``context.abort``) is kept; other errors are left to gRPC. The request's deadline (the
    client's, or the tenant's shorter ``timeout_s``) bounds the whole handler
    (``enforce_deadline``, default True): past it the handler is cancelled and the call fails
    with DEADLINE_EXCEEDED. Messages a streaming handler sent before failing reach
    the client, then the status. Async handlers of all four kinds are guarded (streaming ones as
    async generators or with ``context.write()``); sync handlers pass through unguarded.

    ``exempt_services``: fully qualified service names (``"grpc.health.v1.Health"``) whose calls
    pass through with no tenant, deadline or quota; default :data:`EXEMPT_SERVICES` (health
    checking and server reflection). Raises :class:`~ragguard.ConfigError` for an invalid
    ``tenant_key`` or ``exempt_services``.

    A call whose handler streamed a guarded stream (a server-streaming handler reading a guarded
    generation stream) tells how that stream ended in trailing metadata, whatever its status
    (:func:`ragguard.grpc.ending_trailers`): ``ragguard-stream-ending`` (``completed``,
    ``continued`` or ``incomplete``), ``ragguard-stream-items``, and for a continued stream
    ``ragguard-stream-continued-by`` and ``ragguard-stream-continued-after``; the last guarded
    stream that ended in the call is the one told.

    ``max_concurrent_rpcs``: the calls the server serves at once, all tenants together (None, the
    default: no server-wide bound here). Give it here instead of as the server's own
    ``maximum_concurrent_rpcs``, and leave that one unset: gRPC counts a call from its arrival and
    refuses the excess before the tenant is known. The interceptor counts a call from the moment
    its tenant is known, waiting in its tenant's quota or running, until its task ends; once the
    server is full (less ``headroom``, default 0), it sheds the waiting call of the tenant holding
    the most calls per unit of its ``weight``, or refuses the arrival when its own tenant holds the
    most (:class:`~ragguard.quotas.ServerBulkhead`; docs/grpc.md). A call refused or shed so fails
    with RESOURCE_EXHAUSTED and ``retry-after`` (:class:`~ragguard.QuotaExceeded`, reason
    ``server``), and gives its seat back at once: a refusal does no work.

    A cancelled call (the client went away, or its deadline passed) releases its slot at once,
    streams included: a streaming handler written as an async generator is driven from the call's
    own task, so it is closed there on cancellation rather than left to the garbage collector.
    """

    def __init__(
        self,
        *,
        guard: Guard | None = None,
        tenant_resolver: TenantResolver | None = None,
        anonymous: str | None = DEFAULT_TENANT,
        tenant_key: str = TENANT_KEY,
        exempt_services: Iterable[str] = EXEMPT_SERVICES,
        enforce_deadline: bool = True,
        max_concurrent_rpcs: int | None = None,
        headroom: int | None = None,
    ) -> None:
        if (
            not isinstance(tenant_key, str)
            or not _METADATA_KEY.fullmatch(tenant_key)
            or tenant_key.endswith("-bin")
        ):
            raise ConfigError(
                f"tenant_key must be a lowercase ASCII metadata key (not '-bin'), got {tenant_key!r}"
            )
        if tenant_resolver is None:
            tenant_resolver = HeaderResolver(tenant_key)
        elif tenant_key != TENANT_KEY:
            raise ConfigError("GuardServerInterceptor: give tenant_resolver or tenant_key, not both")
        self._guard = guard
        self.tenant_key = tenant_key
        self.tenant_resolver = check_resolver(tenant_resolver)
        self.anonymous = anonymous
        self._anonymous = check_anonymous(anonymous)
        self.exempt_services = _service_names(exempt_services)
        self.enforce_deadline = bool(enforce_deadline)
        self.bulkhead = server_bulkhead(
            "max_concurrent_rpcs", max_concurrent_rpcs, headroom, monotonic if guard is None else guard.clock
        )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if self.exempt_services:
            name = handler_call_details.method
            if name[1 : name.rfind("/")] in self.exempt_services:
                return handler
        method = handler_call_details.method
        metadata = handler_call_details.invocation_metadata

        def wrap(behavior: Behavior, request_streaming: bool, response_streaming: bool) -> Behavior:
            return self._wrap(behavior, method, metadata)

        return rebuild(handler, wrap=wrap)

    def _wrap(self, behavior: Behavior, method: str = "", metadata: Any = None) -> Behavior:
        scope = self._scope
        if inspect.isasyncgenfunction(behavior):
            # Driven with context.write() from the call's task, not handed to grpc.aio as a
            # generator: grpc.aio abandons a generator parked at `yield` when the call is
            # cancelled, and Python then closes it from another task, where the tenant and
            # deadline context cannot be reset and the slot waits for the garbage collector.

            async def guarded_stream(request: Any, context: aio.ServicerContext[Any, Any]) -> None:
                async with (
                    scope(context, method, metadata),
                    aclosing(behavior(request, context)) as responses,
                ):
                    async for response in responses:
                        await context.write(response)

            return guarded_stream
        if inspect.iscoroutinefunction(behavior):

            async def guarded(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
                async with scope(context, method, metadata):
                    return await behavior(request, context)

            return guarded
        return behavior

    @asynccontextmanager
    async def _scope(
        self, context: aio.ServicerContext[Any, Any], method: str, metadata: Any
    ) -> AsyncIterator[None]:
        registry = self._guard if self._guard is not None else _default_guard()
        identity, priority = await self._identify(context, method, metadata, registry)
        token = None if priority is None else set_priority(priority)
        request = expiry = None
        try:
            with registry.deadline(client_budget(context), set_by="client"):
                request = registry.tenant(identity.tenant)
                async with request if self.bulkhead is None else self.bulkhead.seat(request):
                    expiry = current_expiry()  # the client's deadline, or the tenant's if sooner
                    if expiry is None or not self.enforce_deadline:
                        yield
                    else:
                        with handler_deadline(expiry):
                            yield
        except aio.AbortError:
            raise  # the handler set its own status
        except Exception as exc:
            if expiry is not None and isinstance(exc, TellsDeadline):
                exc.told_by(expiry.budget_s, expiry.set_by)
            status = status_for(exc)
            ending = ending_trailers(request)
            if status is None:
                if ending:
                    context.set_trailing_metadata((*_trailing(context), *ending))
                raise
            code, details, trailing = status
            if ending:
                told = {key for key, _ in ending}
                trailing = (*(kv for kv in trailing if kv[0] not in told), *ending)
            await context.abort(code, details, trailing_metadata=trailing)
        else:
            ending = ending_trailers(request)
            if ending:
                context.set_trailing_metadata((*_trailing(context), *ending))
        finally:
            if token is not None:
                reset_priority(token)

    async def _identify(
        self, context: aio.ServicerContext[Any, Any], method: str, metadata: Any, registry: Guard
    ) -> tuple[Identity, str | None]:
        """Who the call is and the priority it runs at; fails the call when its resolver refuses."""
        caller = GrpcCaller(context, method, metadata)
        try:
            identity = resolve_identity(self.tenant_resolver, caller, self._anonymous)
            if not isinstance(identity, Identity):
                identity = await identity  # an async resolver
            return identity, request_priority(caller, identity, registry.policy)
        except (Unauthenticated, PermissionDenied, InvalidInput) as exc:
            # UNAUTHENTICATED, PERMISSION_DENIED or INVALID_ARGUMENT: the table answers each
            code, details, _ = status_for(exc) or (grpc.StatusCode.UNAUTHENTICATED, str(exc), ())
        await context.abort(code, details)
        raise AssertionError("context.abort() returned")  # it raises AbortError


def _trailing(context: aio.ServicerContext[Any, Any]) -> tuple[tuple[str, Any], ...]:
    """The trailing metadata the handler set itself (kept beside ragguard's)."""
    try:
        return tuple(context.trailing_metadata() or ())
    except Exception:  # pragma: no cover - a context without the getter (older grpcio)
        return ()


def _service_names(names: Iterable[str]) -> frozenset[str]:
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise ConfigError(f"exempt_services must be a collection of service names, got {names!r}")
    checked = []
    for name in names:
        if not isinstance(name, str) or not _SERVICE_NAME.fullmatch(name):
            raise ConfigError(
                f"exempt_services: {name!r} is not a fully qualified service name "
                "(like 'grpc.health.v1.Health')"
            )
        checked.append(name)
    return frozenset(checked)


def _default_guard() -> Guard:
    from .._guard import default_guard

    return default_guard()
