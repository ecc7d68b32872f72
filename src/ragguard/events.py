"""Events: what ragguard saw, handed to listeners after the guarded call has moved on.

Every event is a frozen dataclass. A listener is any callable taking one event; an ``async def``
listener runs as its own task. Listeners never run inside the guarded call: events are queued and
delivered on the next loop iteration (asyncio ``call_soon``, trio ``run_sync_soon``), so a listener
that raises or is slow cannot break or delay the call that produced the event. A listener that
raises is logged once and kept.

When nobody listens, producers check :attr:`EventBus.active` first and build no event at all.

A *tap* (:meth:`EventBus.tap`) is the one exception to "never inside the call": it runs synchronously
where the event is emitted, in the producing call's context, for what must happen there (ragguard's
OpenTelemetry tracer adds each decision as an event of the span current at that moment). It must be
quick and never wait; one that raises is logged once and kept.

:data:`tracer` is the hook through which the observe layer opens a span per guarded stage; it is
None (no span, no cost) until :func:`ragguard.metrics.enable_tracing` sets it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any, NamedTuple, Protocol

from ._compat import running_loop

__all__ = [
    "BreakerTransition",
    "CallOutcome",
    "CallRejected",
    "Event",
    "EventBus",
    "FailedOver",
    "FallbackServed",
    "Listener",
    "QuotaRejected",
    "RetryBudgetExhausted",
    "RetryScheduled",
    "StageCompleted",
    "StreamContinued",
    "StreamCut",
    "StreamEnded",
    "StreamSettled",
    "Where",
    "bus",
]

log = logging.getLogger("ragguard.events")


class Event(Protocol):
    """Marker protocol: every ragguard event is a frozen dataclass."""


class Listener(Protocol):
    def __call__(self, event: Any, /) -> Any: ...


def quick_init(cls: type[Any]) -> type[Any]:
    """Give a frozen, slotted dataclass an ``__init__`` that stores each field through its slot
    descriptor: half the cost of the generated one, which calls ``object.__setattr__`` per field.
    The class stays a frozen dataclass (same fields, defaults, equality, repr, immutability).

    For the events made on every guarded call while someone listens (a stage's completion, a
    breaker's call outcome): with one listener they were a quarter of the full stack's cost."""
    names = [f.name for f in fields(cls)]
    ns: dict[str, Any] = {}
    params: list[str] = []
    for f in fields(cls):
        if f.default is not MISSING:
            ns[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        elif f.default_factory is not MISSING:  # pragma: no cover - events have plain defaults
            raise TypeError(f"quick_init: {cls.__name__}.{f.name} has a default_factory")
        else:
            params.append(f.name)
    for name in names:
        for klass in cls.__mro__:  # a field of a base class has its slot on the base
            if name in vars(klass):
                ns[f"_s_{name}"] = vars(klass)[name].__set__
                break
    body = "".join(f"    _s_{n}(self, {n})\n" for n in names) or "    pass\n"
    exec(f"def __init__(self, {', '.join(params)}):\n{body}", ns)
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init
    return cls


@dataclass(frozen=True, slots=True)
class BreakerTransition:
    """Breaker ``breaker`` moved from ``old`` to ``new`` (BreakerState values) at clock time ``at``."""

    breaker: str
    old: str
    new: str
    at: float
    reason: str = ""


@quick_init
@dataclass(frozen=True, slots=True)
class CallOutcome:
    """A call through breaker ``breaker`` ended.

    ``outcome`` is one of ``success``, ``failure``, ``slow_success``, ``slow_failure``,
    ``ignored`` (an error the classifier does not count) or ``cancelled``; ``duration_s`` in seconds.
    """

    breaker: str
    outcome: str
    duration_s: float
    error: str | None = None


class Where(NamedTuple):
    """Where a guarded call ran, as events and metrics name it: ``key``, the deployment's key of a
    keyed stage ("" for the stage's own instance: unkeyed calls, and keys past its bound);
    ``operation``, ``provider`` and ``model``, the GenAI semantic conventions'
    ``gen_ai.operation.name``, ``gen_ai.provider.name`` and ``gen_ai.request.model`` ("" when not
    known: a stage of no GenAI preset, a function of no provider's integration). Made once per
    compiled chain."""

    key: str = ""
    operation: str = ""
    provider: str = ""
    model: str = ""


@quick_init
@dataclass(frozen=True, slots=True)
class StageCompleted:
    """Guarded stage ``stage`` ended for ``tenant`` after ``duration_s`` seconds.

    ``outcome`` is ``success``, ``fallback`` (answered by ``fallback``), ``error`` or
    ``cancelled``; ``breaker_state`` the stage breaker's state when it ran ("" when none);
    ``error`` the class name of the error it ended with ("" when none: see
    :func:`ragguard.metrics.error_type`); ``first_item_s`` for a stream, the seconds until its
    first item reached the caller (None for a call, or a stream that failed before it);
    ``deadline_s`` the seconds the request's deadline had left when the stage started (None
    without a deadline): ``duration_s`` of it is what the stage spent of the request's budget.
    ``where`` where it ran (:class:`Where`: the deployment's key, the GenAI operation, provider
    and model; None when not said). One per operation, as its caller sees it: its retries,
    hedges, failovers and fallbacks are inside it (each attempt through a breaker is a
    :class:`CallOutcome`). Emitted by the observe layer (and :func:`ragguard.metrics.otel_span`)
    when the bus has listeners.
    """

    stage: str
    tenant: str
    outcome: str
    duration_s: float
    fallback: str = ""
    breaker_state: str = ""
    error: str = ""
    first_item_s: float | None = None
    deadline_s: float | None = None
    where: Where | None = None


@dataclass(frozen=True, slots=True)
class CallRejected:
    """Breaker ``breaker`` rejected a call while ``state``; ``retry_after_s`` as in BreakerOpen."""

    breaker: str
    state: str
    retry_after_s: float | None


@dataclass(frozen=True, slots=True)
class FallbackServed:
    """Stage ``stage`` answered from fallback ``fallback`` because of ``cause`` (an error class name)."""

    stage: str
    fallback: str
    tenant: str
    cause: str


@dataclass(frozen=True, slots=True)
class QuotaRejected:
    """Tenant ``tenant`` was refused for ``reason`` (concurrency, rate, deadline, tokens)."""

    tenant: str
    reason: str
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class RetryScheduled:
    """Stage ``stage`` will retry: attempt ``attempt`` (2 = first retry) after ``wait_s`` seconds,
    for tenant ``tenant``; ``error`` is the class name of the failed attempt's error."""

    stage: str
    attempt: int
    wait_s: float
    error: str
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class RetryBudgetExhausted:
    """Stage ``stage`` wanted to retry but its retry budget was spent."""

    stage: str
    tenant: str


@dataclass(frozen=True, slots=True)
class StreamCut:
    """A stream of stage ``stage`` (tenant ``tenant``) was cut when its ``budget`` ran out
    (``first_item``, ``idle`` or ``total``: the generation preset's), after ``items`` items had
    been handed to the caller (0: a fallback or retry may still serve it)."""

    stage: str
    tenant: str
    budget: str
    items: int


@dataclass(frozen=True, slots=True)
class StreamContinued:
    """A stream of stage ``stage`` (tenant ``tenant``) failed with ``error`` (a class name) after
    ``items`` items had reached the caller, and ``continuation`` took it over from there (its
    first item is there)."""

    stage: str
    tenant: str
    continuation: str
    items: int
    error: str


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """A guarded stream of stage ``stage`` (tenant ``tenant``) ended: ``ending`` is
    ``completed``, ``continued`` or ``incomplete`` (:class:`ragguard.StreamEnding`), after
    ``items`` items reached the caller; ``continued_by`` the continuation that took over after
    ``continued_after`` items ("" and 0 when none did); ``error`` what ended it, or what the
    continuation took over from ("" when completed; ``closed`` or ``cancelled`` when the caller
    stopped reading). Emitted by the observe layer when the bus has listeners."""

    stage: str
    tenant: str
    ending: str
    items: int
    continued_by: str = ""
    continued_after: int = 0
    error: str = ""


@dataclass(frozen=True, slots=True)
class StreamSettled:
    """A stream of a generation stage ended: ``items`` and ``tokens`` (as counted) were handed to
    tenant ``tenant``; ``reserved`` tokens had been reserved from its token quota before it opened
    (0 without a quota) and are now settled; ``paced_s`` seconds were spent pacing its items;
    ``outcome`` is ``ok``, ``error`` or ``cancelled`` (cancelled or closed early).

    ``input_tokens`` and ``output_tokens``: what the provider reported before the stream ended
    (its usage, which it bills), None for a count it did not report: a stream that failed part
    way keeps what was reported before the failure. ``key``, ``provider`` and ``model``: its
    deployment's key ("" for the stage's own instance), the GenAI provider ("" when not known)
    and the model its call named ("" when none)."""

    stage: str
    tenant: str
    items: int
    tokens: int
    reserved: int
    paced_s: float
    outcome: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    key: str = ""
    provider: str = ""
    model: str = ""


@dataclass(frozen=True, slots=True)
class FailedOver:
    """Model group ``group`` left deployment ``deployment`` for a call: ``reason`` why (``open``:
    its breaker was open, skipped without a call; ``limits``: its requests or tokens per minute
    were spent; ``failure``, ``timeout``, ``rejection``, ``overloaded``, ``refused``,
    ``context_length``: its call failed so), ``error`` the class name of its error (``BreakerOpen``
    when its breaker refused the call, "" when the group skipped it without asking),
    ``breaker`` its breaker's name (``stage[key]``, "" when none);
    ``to`` the deployment that answered the call ("" when none did: the call raised
    :class:`~ragguard.NoDeploymentAvailable`, or a refusal none could take), for tenant
    ``tenant``. One per deployment left, when the call ends. Emitted when the bus has listeners."""

    group: str
    deployment: str
    reason: str
    to: str
    error: str = ""
    breaker: str = ""
    tenant: str = ""


class EventBus:
    """Delivers events to listeners outside the producing call.

    ``parent`` buses also receive every event (a breaker's bus forwards to the global :data:`bus`).
    """

    __slots__ = (
        "__weakref__",
        "_children",
        "_listeners",
        "_parent",
        "_pending",
        "_scheduled",
        "_taps",
        "_warned",
        "active",
    )

    def __init__(self, parent: EventBus | None = None) -> None:
        self._listeners: list[Callable[[Any], Any]] = []
        self._taps: list[Callable[[Any], Any]] = []
        self._parent = parent
        self._children: weakref.WeakSet[EventBus] = weakref.WeakSet()
        self._pending: deque[tuple[EventBus, Any]] = deque()
        self._scheduled = False
        self._warned: set[int] = set()
        self.active = False
        """True when this bus or a parent has a listener: producers check it before building events.
        A plain attribute, kept current on (un)subscribe, because it is read on every guarded call."""
        if parent is not None:
            parent._children.add(self)
            self.active = parent.active

    def _refresh(self) -> None:
        parent = self._parent
        self.active = bool(self._listeners or self._taps) or (parent is not None and parent.active)
        for child in list(self._children):
            child._refresh()

    def subscribe(self, listener: Callable[[Any], Any]) -> Callable[[], None]:
        """Add ``listener``; returns a function that removes it again."""
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {listener!r}")
        self._listeners.append(listener)
        self._refresh()

        def unsubscribe() -> None:
            try:
                self._listeners.remove(listener)
            except ValueError:
                pass
            self._refresh()

        return unsubscribe

    def tap(self, fn: Callable[[Any], Any]) -> Callable[[], None]:
        """Call ``fn(event)`` synchronously inside every :meth:`emit` that reaches this bus, in the
        emitting call's own context (see the module docstring); returns a function that removes it.
        ``fn`` must be quick and never wait; an exception it raises is logged once and dropped."""
        if not callable(fn):
            raise TypeError(f"tap must be callable, got {fn!r}")
        self._taps.append(fn)
        self._refresh()

        def untap() -> None:
            try:
                self._taps.remove(fn)
            except ValueError:
                pass
            self._refresh()

        return untap

    def emit(self, event: Any) -> None:
        """Queue ``event`` for this bus's listeners and its parents' (and hand it to their taps
        at once); never raises."""
        b: EventBus | None = self
        root = self
        while b is not None:
            if b._taps:
                for fn in tuple(b._taps):
                    try:
                        fn(event)
                    except Exception:
                        b._failed(fn)
            if b._listeners:
                root._pending.append((b, event))
            b = b._parent
        if root._pending and not root._scheduled:
            root._schedule()

    def _schedule(self) -> None:
        loop = running_loop()
        if loop is not None:
            self._scheduled = True
            loop.call_soon(self._drain)
            return
        if "trio" in sys.modules:
            import trio

            try:
                token = trio.lowlevel.current_trio_token()
            except RuntimeError:
                pass
            else:
                self._scheduled = True
                token.run_sync_soon(self._drain)
                return
        self._drain()

    def _drain(self) -> None:
        self._scheduled = False
        pending = self._pending
        while pending:
            target, event = pending.popleft()
            for listener in tuple(target._listeners):
                try:  # _deliver, inlined for the usual listener: a plain function that returns
                    result = listener(event)
                    if result is not None and inspect.isawaitable(result):
                        _spawn(result)
                except Exception:
                    self._failed(listener)

    def _deliver(self, listener: Callable[[Any], Any], event: Any) -> None:
        try:
            result = listener(event)
            if result is not None and inspect.isawaitable(result):
                _spawn(result)
        except Exception:
            self._failed(listener)

    def _failed(self, listener: Callable[[Any], Any]) -> None:
        key = id(listener)
        if key not in self._warned:
            self._warned.add(key)
            log.exception(
                "ragguard event listener %r raised; it is kept, further errors are silent", listener
            )


_tasks: set[asyncio.Task[Any]] = set()


def _spawn(awaitable: Any) -> None:
    loop = running_loop()
    if loop is not None:
        task = loop.create_task(_guarded(awaitable))
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)
        return
    if "trio" in sys.modules:
        import trio

        try:
            trio.lowlevel.spawn_system_task(_guarded, awaitable)
            return
        except RuntimeError:
            pass
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()


async def _guarded(awaitable: Any) -> None:
    try:
        await awaitable
    except Exception:
        log.exception("ragguard async event listener raised")


bus = EventBus()
"""The global bus: metrics exporters, monitors and ``ragguard doctor`` subscribe here."""


class StageTracer(Protocol):
    """What the observe layer asks to trace one guarded stage (ragguard.metrics implements it for
    OpenTelemetry). ``start`` opens the stage's span; ``attach`` makes it current (returns a token
    for ``detach``, which must run in the same context); ``end`` closes it with the outcome
    (``success``, ``fallback``, ``error``, ``cancelled``), the error (None unless ``error``), the
    fallback that served ("" when none) and, for a stream, the seconds to its first item;
    ``attributes``: more of the span's attributes, fixed for the stage's chain (its key, the GenAI
    provider and model), None for none."""

    def start(
        self, stage: str, tenant: str, breaker_state: str, operation: str, attributes: Any = None
    ) -> Any: ...

    def attach(self, span: Any) -> Any: ...

    def detach(self, token: Any) -> None: ...

    def end(
        self, span: Any, outcome: str, exc: BaseException | None, fallback: str, first_item_s: float | None
    ) -> None: ...


def error_type(exc: BaseException | None) -> str:
    """The ``error.type`` of an error, as spans, metrics and events name it: the exception's class
    name for now ("" for None). The one place to change when the outcome classification (one
    answer per call: failure, rejection, timeout, caller error) names errors instead."""
    return "" if exc is None else type(exc).__name__


tracer: StageTracer | None = None
"""The stage tracer, None while tracing is off (set by :func:`ragguard.metrics.enable_tracing`)."""
