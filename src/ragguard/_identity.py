"""Who is calling: the tenant a front door admits a request as, from a tenant resolver.

Quotas, priorities and shedding are only as strong as the identity they are keyed on, so a front
door (the ASGI middleware, the gRPC server interceptor) never takes the tenant from the client's
word alone unless told to: it hands each request, as a :class:`Caller`, to its tenant resolver,
a callable (plain or ``async``) that returns

- a tenant id (``str``): the request runs as that tenant;
- an :class:`Identity`: the tenant, and whether the caller is ``trusted`` (only a trusted caller's
  ``x-priority`` may raise the tenant's configured priority; anyone may lower it);
- ``None``: the request carries no identity. It runs as the door's ``anonymous`` tenant
  (``"default"`` unless configured otherwise), or, with ``anonymous=None``, is refused as
  :class:`~ragguard.Unauthenticated` (whose HTTP challenge is the resolver's ``challenge``
  attribute when it has one, else ``Bearer``).

A resolver refuses a request by raising :class:`~ragguard.Unauthenticated` (no valid
credentials: HTTP 401, gRPC UNAUTHENTICATED), :class:`~ragguard.PermissionDenied` (known, but not
allowed: 403, PERMISSION_DENIED) or :class:`~ragguard.InvalidInput` (malformed or ambiguous: 400,
INVALID_ARGUMENT). Any other exception, or a result of another type, refuses the request as
Unauthenticated and is logged (logger ``ragguard.identity``, at WARNING with the traceback the
first time for each exception type, then at INFO): a broken resolver fails closed, never admits a
request and never answers 500. A tenant id that is not a valid id is InvalidInput, as from a
header.

Two resolvers ship: :class:`HeaderResolver` (the tenant as a header says it; trust it only behind
a proxy that sets that header itself) and :class:`APIKeyResolver` (the tenant looked up by API
key). A verified token's claim is a few lines over a JWT library (see docs/http.md).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from ._context import MAX_TENANT_ID_LEN, validate_tenant_id
from ._errors import ConfigError, InvalidInput, PermissionDenied, Unauthenticated
from ._http import TENANT_HEADER, check_field_name
from ._validate import bounded
from .options import Policy
from .overload._priority import PRIORITY_HEADER, sent_priority

__all__ = [
    "API_KEY_HEADER",
    "APIKeyResolver",
    "Caller",
    "HeaderResolver",
    "Identity",
    "TenantResolver",
    "check_anonymous",
    "check_resolver",
    "request_priority",
    "resolve_identity",
]

log = logging.getLogger("ragguard.identity")

API_KEY_HEADER = "x-api-key"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request is: its ``tenant`` id, and whether the caller is ``trusted`` (then its
    ``x-priority`` is taken as sent, and may raise the tenant's configured priority)."""

    tenant: str
    trusted: bool = False


class Caller:
    """What a tenant resolver sees of one request.

    ``door``: ``"http"`` or ``"grpc"``. ``method``: the request path (HTTP) or the full RPC method
    name (``/package.Service/Method``). ``peer``: the client's address as the door reports it
    (``"127.0.0.1:50321"`` over HTTP, grpc's ``context.peer()`` such as
    ``"ipv4:127.0.0.1:50321"``), None when unknown. ``scope`` (HTTP): the ASGI scope, for TLS or
    server extensions. ``context`` (gRPC): the ``grpc.aio.ServicerContext``, for
    ``auth_context()`` (the client certificate's names under mutual TLS) and
    ``peer_identities()``. A Caller is valid while the resolver it was given to runs: keep what
    you need of it, not the Caller (grpc's context must not be used after its call ended).
    """

    __slots__ = ("context", "door", "method", "scope")

    door: str
    method: str
    scope: Any
    context: Any

    def values(self, name: str) -> tuple[str | bytes, ...]:
        """Every value of header (metadata key) ``name``, lowercase, in the order received."""
        raise NotImplementedError

    def header(self, name: str) -> str | None:
        """The one value of header (metadata key) ``name``, or None when absent.

        Raises :class:`~ragguard.InvalidInput` when it was sent more than once (an ambiguous
        identity is refused, never resolved to the first or the last value) or, over gRPC, as
        binary metadata."""
        found = self.values(name)
        if not found:
            return None
        if len(found) > 1:
            raise InvalidInput(f"{name} was sent {len(found)} times; send it once")
        value = found[0]
        if not isinstance(value, str):
            raise InvalidInput(f"{name} must be text, not binary metadata")
        return value

    @property
    def peer(self) -> str | None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"Caller(door={self.door!r}, method={self.method!r}, peer={self.peer!r})"


class HttpCaller(Caller):
    """A :class:`Caller` over an ASGI HTTP scope."""

    __slots__ = ()

    def __init__(self, scope: Any) -> None:
        self.door = "http"
        self.scope = scope
        self.context = None
        self.method = scope.get("path", "")

    def values(self, name: str) -> tuple[str | bytes, ...]:
        key = _field_key(name)
        return tuple(v.decode("latin-1") for k, v in self.scope["headers"] if k == key)

    def header(self, name: str) -> str | None:
        key = _field_key(name)
        found: bytes | None = None
        for k, v in self.scope["headers"]:
            if k == key:
                if found is not None:
                    return super().header(name)  # raises: sent more than once
                found = v
        return None if found is None else found.decode("latin-1")

    @property
    def peer(self) -> str | None:
        client = self.scope.get("client")
        if not client:
            return None
        host, port = client[0], client[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


_field_keys: dict[str, bytes] = {}


def _field_key(name: str) -> bytes:
    """``name`` as an ASGI header name (lowercase latin-1 bytes), memoised for names in code."""
    key = _field_keys.get(name)
    if key is None:
        key = name.lower().encode("latin-1")
        if len(_field_keys) < 256:
            _field_keys[name] = key
    return key


class GrpcCaller(Caller):
    """A :class:`Caller` over a grpc.aio call (its servicer context)."""

    __slots__ = ("_metadata",)

    def __init__(self, context: Any, method: str = "", metadata: Any = None) -> None:
        self.door = "grpc"
        self.scope = None
        self.context = context
        self.method = method
        self._metadata = context.invocation_metadata() if metadata is None else metadata

    def values(self, name: str) -> tuple[str | bytes, ...]:
        key = name.lower()
        return tuple(item[1] for item in self._metadata or () if item[0] == key)

    @property
    def peer(self) -> str | None:
        peer: str | None = self.context.peer()
        return peer


Resolved: TypeAlias = "str | Identity | None"
TenantResolver: TypeAlias = "Callable[[Caller], Resolved | Awaitable[Resolved]]"
"""A callable (plain or async) from a :class:`Caller` to its tenant: see the module docstring."""


class HeaderResolver:
    """The tenant is the value of header (gRPC: metadata key) ``header``, as the client sent it.

    Trusted only behind a proxy that sets this header itself and drops any value the client sent:
    anyone who can reach the service directly can claim any tenant with it. Absent: None (the
    door's anonymous tenant). Sent twice: InvalidInput (400, INVALID_ARGUMENT), at both doors.
    ``trusted=True`` says the proxy also vouches for ``x-priority``, which then may raise the
    tenant's configured priority. Raises :class:`~ragguard.ConfigError` for a bad header name.
    """

    __slots__ = ("header", "trusted")

    def __init__(self, header: str = TENANT_HEADER, *, trusted: bool = False) -> None:
        self.header = check_field_name("header", header)
        self.trusted = bool(trusted)

    def __call__(self, caller: Caller) -> str | Identity | None:
        value = caller.header(self.header)
        if value is None or not self.trusted:
            return value
        return Identity(value, trusted=True)

    def __repr__(self) -> str:
        return f"HeaderResolver({self.header!r}, trusted={self.trusted})"


class APIKeyResolver:
    """The tenant is looked up by the API key the caller sends in ``header`` (default
    ``x-api-key``; with ``header="authorization"``, the value is ``Bearer <key>``).

    ``keys``: API key -> tenant id, or an :class:`Identity` for a trusted caller. Only SHA-256
    digests of the keys are kept, and a lookup compares digests, so neither the time it takes nor
    anything this object holds gives a key away. No key: None (the door's anonymous tenant). An
    unknown key: :class:`~ragguard.Unauthenticated`, whose HTTP challenge (``challenge``) is
    ``Bearer`` for ``authorization``, else ``APIKey header="<header>"``. Raises
    :class:`~ragguard.ConfigError` for an empty key, a bad tenant id (named by its tenant, never
    by its key) or a bad header name.
    """

    __slots__ = ("_digests", "challenge", "header")

    def __init__(self, keys: Mapping[str, str | Identity], *, header: str = API_KEY_HEADER) -> None:
        self.header = check_field_name("header", header)
        self.challenge = "Bearer" if self.header == "authorization" else f'APIKey header="{self.header}"'
        if not isinstance(keys, Mapping):
            raise ConfigError(
                f"APIKeyResolver: keys must be a mapping of API key to tenant, got {type(keys).__name__}"
            )
        digests: dict[bytes, Identity] = {}
        for key, who in keys.items():
            if not isinstance(key, str) or not key or key != key.strip():
                raise ConfigError(
                    "APIKeyResolver: every API key must be a non-empty str without surrounding spaces"
                )
            identity = who if isinstance(who, Identity) else Identity(who)
            try:
                validate_tenant_id(identity.tenant)
            except InvalidInput as exc:
                raise ConfigError(f"APIKeyResolver: {exc}", field="keys") from None
            digests[_digest(key)] = identity
        self._digests = digests

    def __call__(self, caller: Caller) -> Identity | None:
        value = caller.header(self.header)
        if value is None:
            return None
        key = value.strip()
        if self.header == "authorization":
            scheme, _, key = key.partition(" ")
            if scheme.lower() != "bearer":
                raise Unauthenticated("authorization must be 'Bearer <API key>'", challenge=self.challenge)
            key = key.strip()
        identity = self._digests.get(_digest(key))
        if identity is None:
            raise Unauthenticated("unknown API key", challenge=self.challenge)
        return identity

    def __repr__(self) -> str:
        return f"APIKeyResolver(<{len(self._digests)} keys>, header={self.header!r})"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def check_resolver(resolver: object) -> TenantResolver:
    """``resolver`` when it is callable, else ConfigError."""
    if not callable(resolver):
        raise ConfigError(
            f"tenant_resolver must be a callable taking a Caller, got {bounded(repr(resolver), 60)}"
        )
    return resolver


def check_anonymous(anonymous: object) -> Identity | None:
    """The door's ``anonymous`` option (a tenant id or None) as the identity it gives."""
    if anonymous is None:
        return None
    try:
        return Identity(validate_tenant_id(anonymous))
    except InvalidInput as exc:
        raise ConfigError(f"anonymous: {exc}", field="anonymous") from None


_REFUSALS = (Unauthenticated, PermissionDenied, InvalidInput)
_reported: set[tuple[type, type]] = set()
_plain: dict[str, Identity] = {}
"""The untrusted Identity of each tenant id a resolver returned as a str, kept (at most 4096 ids of
at most 64 characters, the oldest half forgotten when full) so the common case allocates nothing
per request."""


def resolve_identity(
    resolver: TenantResolver, caller: Caller, anonymous: Identity | None
) -> Identity | Awaitable[Identity]:
    """Who ``caller`` is, by ``resolver``: the Identity, or an awaitable of it when the resolver
    is async. Raises (or the awaitable raises) Unauthenticated, PermissionDenied or InvalidInput
    to refuse it (see the module docstring)."""
    try:
        found: Any = resolver(caller)
    except _REFUSALS:
        raise
    except Exception as exc:
        raise _broken(resolver, exc) from exc
    if type(found) is not str and inspect.isawaitable(found):
        return _resolved_later(resolver, found, anonymous)
    return _identity(resolver, found, anonymous)


async def _resolved_later(
    resolver: TenantResolver, found: Awaitable[Any], anonymous: Identity | None
) -> Identity:
    try:
        result = await found
    except _REFUSALS:
        raise
    except Exception as exc:
        raise _broken(resolver, exc) from exc
    return _identity(resolver, result, anonymous)


def _broken(resolver: TenantResolver, exc: Exception) -> Unauthenticated:
    _report(resolver, exc, f"raised {type(exc).__name__}")
    return Unauthenticated()


def _identity(resolver: TenantResolver, found: object, anonymous: Identity | None) -> Identity:
    if type(found) is str:
        identity = _plain.get(found)
        if identity is None:
            identity = Identity(found)
            if len(found) <= MAX_TENANT_ID_LEN:  # a longer one is no tenant id: never kept
                if len(_plain) >= 4096:
                    for old in list(_plain)[:2048]:
                        del _plain[old]
                _plain[found] = identity
        return identity
    if isinstance(found, Identity):
        if type(found.tenant) is not str:
            validate_tenant_id(found.tenant)  # raises InvalidInput
        return found
    if found is None:
        if anonymous is None:
            challenge = getattr(resolver, "challenge", None)
            raise Unauthenticated(
                "this service needs credentials: the request carries none",
                challenge=challenge if isinstance(challenge, str) else "Bearer",
            )
        return anonymous
    _report(resolver, found, f"returned a {type(found).__name__}, not a tenant id, an Identity or None")
    raise Unauthenticated()


def request_priority(caller: Caller, identity: Identity, policy: Policy) -> str | None:
    """The priority to run ``caller``'s request at, from its ``x-priority`` (None: the tenant's
    own): see :func:`ragguard.overload.sent_priority`. InvalidInput for a bad or repeated value."""
    sent = caller.header(PRIORITY_HEADER)
    if sent is None:
        return None
    return sent_priority(sent, policy.quota(identity.tenant).priority, trusted=identity.trusted)


def _report(resolver: object, what: object, happened: str) -> None:
    key = (type(resolver), type(what))
    first = key not in _reported and len(_reported) < 256
    if first:
        _reported.add(key)
    log.log(
        logging.WARNING if first else logging.INFO,
        "tenant resolver %s %s; the request is refused as Unauthenticated",
        bounded(repr(resolver), 80),
        happened,
        exc_info=what if first and isinstance(what, BaseException) else None,
    )
