"""The layer contract: what one layer of a guarded stage is, in three shapes.

A stage's chain is a list of layers, outermost first, built once per decorated function from the
stage's policy (see :mod:`ragguard.layers`). A layer takes one of three shapes, chosen by what it
does to the flow of the call:

- :class:`Gate`: a check before and a record after, run synchronously in the driver's own frame
  (quota slot, deadline, breaker permit, attempt timer). ``enter`` returns a token, or :data:`WAIT`
  when admission needs ``await enter_async``; ``exit`` receives the token and the outcome and may
  replace the error that is raised (the timer turns its cancellation into a timeout).
- :class:`Recovery`: acts only after a failure (retry, fallback): ``recover`` may run the layers
  inside it again through ``again``, return something else, or raise.
- :class:`Wrapper`: runs around every pass through the layers inside it (chaos injection, chunked
  rerank, the embedding-cache tap): ``around`` calls ``proceed`` zero or more times.

The unary driver and the stream driver (:mod:`ragguard.pipeline._drivers`) run the same layer
objects. For a stream, a gate's ``scope`` says how long it holds: ``call`` and ``attempt`` gates
from opening the stream to its end, ``item`` gates around the wait for each item (for the first
item, at their place in the chain, so they bound the whole opening, wrappers included, as they
bound a call); recoveries act only before the first item reaches the caller (the commit point);
wrappers with ``streams = True`` wrap the opening of the stream, up to its first item. A wrapper
may set the opened stream's ``Head.deliver`` hook (called with each item before it is handed over;
it may return a wait: the generation preset's pacing).

A :class:`Call` is the per-call record every layer reads (the function and its arguments, the
stage, the attempt number) and a few layers write (documented per field). After Polly v8's
``ResilienceStrategy`` / ``ResilienceContext``; no code is shared.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from .._admission import WAIT  # a gate's enter answers as a quota backend's admit_now does

__all__ = ["WAIT", "Call", "Gate", "Layer", "Recovery", "Resumption", "Scope", "Wrapper"]

Scope = Literal["call", "attempt", "item"]


class Call:
    """One guarded call (or stream) as it moves through a stage's chain.

    - ``stage``: the stage name; ``fn``, ``args``, ``kwargs``: what the innermost layer calls
      (a layer may swap ``args``/``kwargs`` while it runs, as the chunked rerank and the
      generation preset's shrink do, and puts the caller's back before it returns);
    - ``stream``: True for an async-generator stage;
    - ``attempt``: 1 for the first attempt, raised by the retry layer before each retry;
    - ``recoverable``: set by an outer layer that recovers some errors itself (the rerank chunker
      recovers out-of-memory errors above its floor): the breaker gives its permit back instead of
      counting an error this predicate accepts;
    - ``started``: the clock time the current attempt was admitted by the breaker;
    - ``budget_s``, ``by_deadline``: the current attempt's time budget and whether the deadline
      (rather than the stage timeout) set it (the timeout layer's);
    - ``items``: items handed to the caller so far (streams);
    - ``task``: the asyncio task running the call, once a layer looked it up (the timeout layer
      does when it arms a timer), else None;
    - ``loop``: the asyncio loop a stream's items are read on, once the stream driver looked it up
      (an async generator stays on one loop), else None;
    - ``threads``: for a sync function's call, the worker threads it stopped waiting for that
      still run (:class:`ragguard.pipeline._threads.Pending`), else None;
    - ``meter``: the generation preset's record of an open stream (its token account and
      budgets, :mod:`ragguard.rag._generation`), set by its meter and read by its budget gate;
    - ``share_expiry``: a stream's own deadline (an :class:`~ragguard._deadline.Expiry`) when its
      stage draws a share of the request's (``deadline_share``), set as it opens and made current
      again for each later item by the share layer (:mod:`ragguard.layers._share`);
    - ``ending``: how a stream ended (:class:`ragguard.StreamEnding`), None until it has: set by
      the stream driver before the layers it held exit (the observe layer reports it).

    Every layer may read every field; :data:`WRITERS` names the modules that may write each one
    (tests/pipeline/test_call_fields.py holds the code to it): a layer that needs to tell another
    something through the call adds the field here first.
    """

    # Not slotted on purpose: the fields a layer may set later (attempt, started, task...) are class
    # attributes until then, so a call costs four stores to create instead of twelve (a guarded call
    # creates one every time; benchmarks/overhead.py measured 120 ns of 250 saved).
    stream: bool = False
    attempt: int = 1
    recoverable: Callable[[BaseException], bool] | None = None
    started: float = 0.0
    budget_s: float | None = None
    by_deadline: bool = False
    items: int = 0
    task: Any = None
    loop: Any = None
    threads: Any = None
    meter: Any = None
    share_expiry: Any = None
    ending: Any = None

    WRITERS: ClassVar[Mapping[str, frozenset[str]]] = {
        # a chunk's candidates while the chunker runs; fewer passages while the shrink runs
        "args": frozenset({"ragguard.rag._rerank", "ragguard.rag._shrink"}),
        "kwargs": frozenset({"ragguard.rag._rerank", "ragguard.rag._shrink"}),
        "attempt": frozenset({"ragguard.layers._retry", "ragguard.layers._hedge"}),  # hedge: its twin's
        "recoverable": frozenset({"ragguard.rag._rerank", "ragguard.layers._hedge"}),
        "started": frozenset({"ragguard.layers._breaker"}),
        "budget_s": frozenset({"ragguard.layers._timeout"}),
        "by_deadline": frozenset({"ragguard.layers._timeout"}),
        "items": frozenset({"ragguard.pipeline._drivers"}),
        "task": frozenset({
            "ragguard.pipeline._drivers", "ragguard.layers._timeout", "ragguard.rag._generation",
        }),
        "loop": frozenset({"ragguard.pipeline._drivers"}),
        "threads": frozenset({"ragguard.pipeline._threads"}),
        "meter": frozenset({"ragguard.rag._generation"}),
        "share_expiry": frozenset({"ragguard.layers._share"}),
        "ending": frozenset({"ragguard.pipeline._drivers"}),
    }
    """Field -> the modules that may write it (``stage``, ``fn`` and ``stream`` are set once, here)."""

    def __init__(
        self,
        stage: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        stream: bool = False,
    ) -> None:
        self.stage = stage
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        if stream:
            self.stream = True

    def __repr__(self) -> str:
        return f"<Call {self.stage!r} attempt={self.attempt} stream={self.stream}>"


@runtime_checkable
class Gate(Protocol):
    """A synchronous check before the inner layers and a record after them.

    ``enter(call)`` admits the call and returns a token (anything; None is fine), raises a
    rejection (a :class:`~ragguard.RagguardError`), or returns :data:`WAIT` when admission must
    wait: the driver then awaits ``enter_async(call)`` for the token. ``exit(call, token, exc)``
    runs exactly once per successful ``enter``, innermost gate first, with the exception the inner
    layers raised (None on success, a ``BaseException`` on cancellation); it returns None to let
    that outcome stand, or an exception to raise in its place. A gate whose ``exit`` does nothing
    may say so with a class attribute ``exits = False``: the drivers then never call it; one whose
    ``exit`` does nothing for the token None (no timer was armed, no slot taken) with
    ``exits_none = False``: the call driver then skips it for that token. A gate whose ``exit``
    releases a permit (a slot, a concurrency permit) says ``holds = True``: in a sync function's
    chain its exit then waits for a worker thread the call stopped waiting for
    (:mod:`ragguard.pipeline._threads`).
    """

    scope: ClassVar[Scope]

    def enter(self, call: Call) -> Any: ...

    async def enter_async(self, call: Call) -> Any: ...

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None: ...


@runtime_checkable
class Recovery(Protocol):
    """Acts after the inner layers failed with ``exc`` (an ``Exception``; never a cancellation).

    ``recover`` returns a result in place of the failed one, or raises (``exc`` itself when it
    does not apply). ``again()`` runs the inner layers once more and returns their result. For a
    stream the result is the opened stream (the driver's), and a fallback returns an async
    iterable of items instead.
    """

    async def recover(self, call: Call, exc: Exception, again: Callable[[], Awaitable[Any]]) -> Any: ...


@runtime_checkable
class Wrapper(Protocol):
    """Runs around each pass through the inner layers: ``await proceed()`` runs them once.

    ``streams``: whether the layer also wraps the opening of a stream (up to its first item).
    ``forks`` (optional, default False): the layer runs the inner layers with call records of its
    own (hedging's second leg, with its own attempt timer, permit and start time): its ``proceed``
    then takes the record to run, ``await proceed(call)`` (``proceed(twin)`` for a copy), and it
    never needs to know how the driver put the rest of the chain together. A record it makes
    copies what the layers outside it set (``attempt``, ``recoverable``) and none of what the
    layers inside write (see :class:`Call`).
    """

    streams: ClassVar[bool]

    async def around(self, call: Call, proceed: Callable[..., Awaitable[Any]]) -> Any: ...


@runtime_checkable
class Resumption(Protocol):
    """What a layer that can carry a stream on past its commit point (the generation preset's
    continuation) sets on the opened stream's head (``Head.resume``), from its ``around``.

    ``inside``: the head's held entries (``Head.held``) of the layers inside it, as they were when
    the stream opened. When the stream fails after items reached the caller, the stream driver
    closes it, exits those layers with the error (a breaker counts it, a token meter settles) and
    awaits ``take_over(call, exc, items)`` with the error (or the one a gate replaced it with) and
    the items handed over: None leaves the error to end the stream; ``(name, rest)`` carries it on
    with ``rest``, an async iterator of the items still to hand over (whose opening, up to its
    first item, is already done), ``name`` saying who took over. The layers outside stay held
    until ``rest`` ends, and their item gates (a stage's deadline share) bound the takeover and
    each of ``rest``'s items: a wrapper that sets ``resume`` says so with ``resumes = True``."""

    inside: tuple[Any, ...]

    async def take_over(self, call: Call, exc: Exception, items: list[Any]) -> tuple[str, Any] | None: ...


Layer = Gate | Recovery | Wrapper
