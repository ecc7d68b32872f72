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
wrappers wrap the opening of the stream, up to its first item. A wrapper
may set the opened stream's ``Head.deliver`` hook (called with each item before it is handed over;
it may return a wait: the generation preset's pacing).

A :class:`Call` is the per-call record every layer reads (the function and its arguments, the
stage, the attempt number) and a few layers write (documented per field, grouped by who writes
it). After Polly v8's ``ResilienceStrategy`` / ``ResilienceContext``; no code is shared.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from .._admission import WAIT  # a gate's enter answers as a quota backend's admit_now does
from ..outcomes import Outcome

__all__ = ["NO_EXIT", "WAIT", "Call", "Gate", "Layer", "Recovery", "Resumption", "Scope", "Wrapper"]

NO_EXIT: Any = object()
"""A gate's ``enter`` answers this to admit the call with nothing to do after it: its ``exit`` is
not called for this call (the timeout armed no timer, the quota took no slot)."""

Scope = Literal["call", "attempt", "item"]


class Call:
    """One guarded call (or stream) as it moves through a stage's chain: what every layer reads,
    and the few fields layers write for one another, grouped by who writes them.

    The call itself, set when it is made:

    - ``stage``: the stage name; ``fn``, ``args``, ``kwargs``: what the innermost layer calls
      (a layer may swap ``args``/``kwargs`` while it runs, as the chunked rerank and the
      generation preset's shrink do, and puts the caller's back before it returns);
    - ``stream``: True for an async-generator stage.

    Set by an outer layer for the layers inside it (a record a forking wrapper makes copies these):

    - ``attempt``: 1 for the first attempt, raised by the retry layer before each retry;
    - ``recoverable``: set by a layer that recovers some errors itself (the rerank chunker
      recovers out-of-memory errors above its floor): the breaker gives its permit back instead
      of counting an error this predicate accepts, and the retry layer does not retry it.

    The current attempt's, each written by the one layer that owns it:

    - ``started``: the clock time the breaker admitted the attempt;
    - ``budget_s``, ``by_deadline``: the attempt's time budget and whether the deadline (rather
      than the stage timeout) set it (the timeout layer's, set as it arms a timer and read only
      after: not set before, so a call that arms none pays nothing for them);
    - ``outcome``: the :class:`~ragguard.outcomes.Outcome` of the error a gate's ``exit`` or a
      recovery is handed (and of the one a recovery's ``again`` raised), classified once by the
      chain's classifier (the Guard's) before any layer sees the error: the driver's. The chain
      records it on the error too (:func:`ragguard.outcomes.outcome_of`), for what sees only the
      error; the record holds no reference to the error (its traceback holds the frames that
      hold the record).

    The running call's, looked up once by the first that needs them:

    - ``task``: the asyncio task running the call (the timeout layer, when it arms a timer, or
      the driver), else None; ``loop``: the loop a stream's items are read on, else None;
    - ``items``: items handed to the caller so far (streams; the stream driver's);
    - ``threads``: for a sync function's call, its worker threads the call stopped waiting for
      that still run (:class:`ragguard.pipeline._threads.Pending`), else None;
    - ``meter``: the generation preset's record of an open stream (its token account and
      budgets, :mod:`ragguard.rag._generation`), set by its meter and read by its budget gate;
    - ``share_expiry``: a stream's own deadline (an :class:`~ragguard._deadline.Expiry`) when its
      stage draws a share of the request's (``deadline_share``), set as it opens and made current
      again for each later item by the share layer (:mod:`ragguard.layers._share`);
    - ``share_at``: in a stage with a fallback, the clock time its share of the request's
      deadline ends (None: no share), set by the reserve's gate the share is fused into
      (:mod:`ragguard.layers._reserve`): the fallback serves under it;
    - ``ending``: how a stream ended (:class:`ragguard.StreamEnding`), None until it has: set by
      the stream driver before the layers it held exit (the observe layer reports it).
    """

    __slots__ = (  # noqa: RUF023 - grouped by who writes them, as the docstring
        # the call itself
        "stage", "fn", "args", "kwargs", "stream",
        # set by an outer layer for the layers inside it
        "attempt", "recoverable",
        # the current attempt's
        "started", "budget_s", "by_deadline", "outcome",
        # the running call's (the rest of them, below, only once set: in ``__dict__``)
        "task", "items", "threads", "__dict__",
    )  # fmt: skip

    budget_s: float | None  # (set by the timeout layer before any read, see above)
    by_deadline: bool

    # The running call's that a plain call never sets (a stream's, a preset's, a fallback's share):
    # read from here until the one that writes it does, so making a call stores none of them (one
    # is made per guarded call: 15 ns less of the 1.1 us a stage with nothing configured costs).
    loop: Any = None
    meter: Any = None
    share_expiry: Any = None
    share_at: float | None = None
    ending: Any = None

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
        self.stream = stream
        self.attempt = 1
        self.recoverable: Callable[[BaseException], bool] | None = None
        self.started = 0.0
        self.outcome: Outcome | None = None
        self.task: Any = None
        self.items = 0
        self.threads: Any = None

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
    that outcome stand, or an exception to raise in its place. The one exception: an ``enter`` that
    returns :data:`NO_EXIT` admits the call with nothing to undo, and its ``exit`` is not called.

    Two class attributes say what the drivers cannot see from the methods: ``scope`` (required:
    how long a stream holds the gate, see the module docstring) and ``holds`` (optional, False):
    the ``exit`` releases a permit (a slot, a concurrency permit), so in a sync function's chain
    it waits for a worker thread the call stopped waiting for (:mod:`ragguard.pipeline._threads`).
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

    ``repeats`` (optional, default False) says the recovery does nothing but run the inner layers
    again after a wait, up to a limit (the retry layer with its policy's own strategies): it then
    has ``next_wait(call, exc, attempt) -> float | None`` (the seconds to wait before the next
    attempt after ``exc`` ended attempt number ``attempt``, None to stop: ``recover`` raises
    ``exc`` then) and ``sleep(seconds)``. For the innermost recovery of a node, a chain's driver
    may run that loop in its own frame instead of awaiting ``recover``: after a failed attempt,
    ``next_wait``; then ``sleep``, ``call.attempt`` raised by one, the next attempt (an error
    not repeated goes to the recoveries outside it, as one ``recover`` raised would). Its
    ``recover`` is then :func:`repeat` (that loop, awaited).
    """

    async def recover(self, call: Call, exc: Exception, again: Callable[[], Awaitable[Any]]) -> Any: ...


class Repeating(Protocol):
    """What :func:`repeat` asks of a recovery that ``repeats`` (see :class:`Recovery`)."""

    def next_wait(self, call: Call, exc: Exception, attempt: int) -> float | None: ...

    def sleep(self, seconds: float) -> Awaitable[Any]: ...


async def repeat(
    recovery: Repeating, call: Call, exc: Exception, again: Callable[[], Awaitable[Any]]
) -> Any:
    """The loop of a recovery that ``repeats``, as its ``recover`` runs it: after the attempt
    that failed with ``exc``, ``recovery.next_wait``; None raises the error, a wait is slept
    (``recovery.sleep``), ``call.attempt`` raised by one and ``again()`` awaited (a cancellation
    is never repeated: it propagates). A chain's written-out driver runs the same loop in its
    own frame."""
    attempt = 1  # the number of the attempt that failed with ``exc``
    try:
        while True:
            wait = recovery.next_wait(call, exc, attempt)
            if wait is None:
                raise exc
            await recovery.sleep(wait)
            attempt += 1
            call.attempt += 1
            try:
                return await again()
            except Exception as failed:
                exc = failed
    finally:
        # this frame lets go of the error it raises (and of the recovery, which may hold it): the
        # error's traceback holds the frame, and the two would otherwise be a reference cycle only
        # the garbage collector frees
        del exc, recovery


@runtime_checkable
class Wrapper(Protocol):
    """Runs around each pass through the inner layers: ``await proceed()`` runs them once.

    In a stream's chain a wrapper wraps the opening of the stream, up to its first item (a layer
    that has nothing to do for a stream is not built into one: its builder returns None when
    ``bound.stream``). ``forks`` (optional, default False): the layer runs the inner layers with
    call records of its own (hedging's second leg, with its own attempt timer, permit and start
    time): its ``proceed`` then takes the record to run, ``await proceed(call)`` (``proceed(twin)``
    for a copy), and it never needs to know how the driver put the rest of the chain together. A
    record it makes copies what the layers outside it set (``attempt``, ``recoverable``) and none
    of what the layers inside write (see :class:`Call`).
    """

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
