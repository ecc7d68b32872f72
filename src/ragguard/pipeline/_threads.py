"""Sync callables in worker threads, under the same layers as an async call.

``@guard`` on a plain ``def`` makes an async function whose innermost step runs the original in a
worker thread (:func:`anyio.to_thread.run_sync`, which runs it in a copy of the caller's context:
the tenant, the deadline and the degraded marks are visible inside). Every layer around it is the
chain an async function of the stage gets.

A thread cannot be stopped from outside. When the call's task is cancelled (an attempt timeout, the
deadline, a caller that went away) the driver stops *waiting* (``abandon_on_cancel``) and the
layers see the cancellation at once; the thread runs on to its end. Until it returns, what the call
was admitted with stays taken:

- the stage's thread bulkhead (:func:`limiter_for`, ``StagePolicy.max_threads`` threads at most);
  anyio's own limiter gives its token back when the wait is abandoned, so it cannot count them;
- every gate that says ``holds = True`` (the default tenant's per-call slot, the adaptive limit's
  permit): its ``exit`` is held (:class:`HeldGate`) and runs, with the call's outcome, when the
  thread returns;
- the request's tenant slot (``async with tenant(...)``), released by the request's exit only once
  the threads its calls abandoned have returned (:class:`Pending` on the request scope).

So a tenant's ``max_concurrency`` and the stage's thread bound count threads that really run, and a
dependency that hangs fills its own bulkhead instead of the process. The breaker, the retry and
the fallback act on the outcome when the caller sees it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, cast

from anyio import CapacityLimiter, WouldBlock, to_thread

from .._compat import running_loop
from .._context import current_scope
from ._contract import Call, Gate, Layer, Scope

__all__ = ["HeldGate", "InThread", "Pending", "held", "limiter_for", "thread_call"]

log = logging.getLogger("ragguard")


class Pending:
    """Threads that a call (or a request) stopped waiting for and that still run, and the releases
    held until the last of them returns (run on the event loop, in the order they were held)."""

    __slots__ = ("count", "releases")

    def __init__(self) -> None:
        self.count = 0
        self.releases: list[Callable[[], Any]] = []

    def hold(self, release: Callable[[], Any]) -> None:
        self.releases.append(release)

    def returned(self) -> None:
        self.count -= 1
        if self.count:
            return
        releases, self.releases = self.releases, []
        for release in releases:
            try:
                release()
            except Exception:  # a release that fails must not keep the others held
                log.exception("ragguard: releasing what a returned worker thread held failed")


class _Job:
    """One run of a sync function in a worker thread, and who waits for its end.

    The thread and the event loop agree under ``lock`` whether the caller stopped waiting before
    the function started (it then never runs), while it ran (the thread posts :meth:`returned` to
    the loop when it ends), or after it ended (the caller releases at once)."""

    __slots__ = ("abandoned", "cancelled", "done", "holders", "limiter", "lock", "post", "started")

    def __init__(self, limiter: CapacityLimiter, post: Callable[..., Any]) -> None:
        self.limiter = limiter
        self.post = post
        self.lock = threading.Lock()
        self.started = self.done = self.cancelled = self.abandoned = False
        self.holders: tuple[Pending, ...] = ()

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """In the worker thread: run ``fn`` unless the caller already left."""
        with self.lock:
            if self.cancelled:
                return None
            self.started = True
        try:
            return fn(*args, **kwargs)
        finally:
            with self.lock:
                self.done = True
                abandoned = self.abandoned
            if abandoned:
                try:
                    self.post(self.returned)
                except RuntimeError:  # the event loop is closed: nothing left to release into
                    pass

    def abandon(self) -> bool:
        """On the loop, the caller stopped waiting: True when the function still runs."""
        with self.lock:
            if not self.started:
                self.cancelled = True
                return False
            if self.done:
                return False
            self.abandoned = True
            return True

    def returned(self) -> None:
        """On the loop, the abandoned function returned: release what it held."""
        self.limiter.release_on_behalf_of(self)
        for pending in self.holders:
            pending.returned()


def thread_call(
    stage: str,
    target: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    limiter: CapacityLimiter,
) -> Call:
    """The record of a call of the sync function ``target``: its ``fn`` runs ``target`` in a
    worker thread of ``limiter``, and ``threads`` counts the threads it stopped waiting for."""
    pending = Pending()
    call = Call(stage, InThread(target, limiter, pending), args, kwargs)
    call.threads = pending
    return call


class InThread:
    """``await InThread(target, limiter, pending)(*args, **kwargs)`` runs ``target(*args,
    **kwargs)`` in a worker thread of ``limiter``. When the caller stops waiting for a thread that
    still runs, the thread is counted in ``pending`` (the call's) and in the request scope's, until
    it returns. Holds no reference to the call record."""

    __slots__ = ("limiter", "pending", "target")

    def __init__(self, target: Callable[..., Any], limiter: CapacityLimiter, pending: Pending) -> None:
        self.target = target
        self.limiter = limiter
        self.pending = pending

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        job = _Job(self.limiter, _poster())
        try:  # a free thread: no checkpoint (anyio's awaited acquire costs a loop iteration)
            self.limiter.acquire_on_behalf_of_nowait(job)
        except WouldBlock:
            await self.limiter.acquire_on_behalf_of(job)  # waits inside the attempt's timeout
        try:
            result = await to_thread.run_sync(job.run, self.target, args, kwargs, abandon_on_cancel=True)
        except BaseException:
            if job.abandon():
                self._hold(job)
                raise
            self.limiter.release_on_behalf_of(job)
            raise
        self.limiter.release_on_behalf_of(job)
        return result

    def _hold(self, job: _Job) -> None:
        holders = [self.pending]
        scope = current_scope()
        if scope is not None:
            theirs = scope.threads
            if theirs is None:
                theirs = scope.threads = Pending()
            holders.append(theirs)
        for pending in holders:
            pending.count += 1
        job.holders = tuple(holders)


def _poster() -> Callable[..., Any]:
    """How a worker thread hands a function to the event loop that is running now (asyncio's
    ``call_soon_threadsafe``, trio's token), without waiting for it."""
    loop = running_loop()
    if loop is not None:
        return loop.call_soon_threadsafe
    import trio

    return trio.lowlevel.current_trio_token().run_sync_soon


class HeldGate:
    """A gate of a sync function's chain whose ``exit`` releases a permit (``holds = True``): when
    the call stopped waiting for a thread that still runs, the exit waits for the thread."""

    __slots__ = ("enter", "enter_async", "gate", "scope")

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.scope: Scope = gate.scope
        self.enter = gate.enter
        self.enter_async = gate.enter_async

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        pending = call.threads
        if pending is not None and pending.count:
            pending.hold(partial(self._exit_later, call, token, exc, call.outcome))
            return None
        return self.gate.exit(call, token, exc)

    def _exit_later(self, call: Call, token: Any, exc: BaseException | None, outcome: Any) -> None:
        """The held exit, once the thread returned: with the outcome of ``exc`` on the call again
        (the call may have moved on to another error meanwhile), then the call's own put back."""
        now, call.outcome = call.outcome, outcome
        try:
            self.gate.exit(call, token, exc)
        finally:
            call.outcome = now

    def __repr__(self) -> str:
        return f"HeldGate({self.gate!r})"


def held(layers: Sequence[Layer]) -> list[Layer]:
    """``layers`` for a sync function's chain: each gate that holds a permit, as a :class:`HeldGate`."""
    return [
        cast(Layer, HeldGate(cast(Gate, layer)))
        if getattr(layer, "holds", False)
        else layer
        for layer in layers
    ]


def limiter_for(stage: Any) -> CapacityLimiter:
    """The thread bulkhead of ``stage`` (a :class:`~ragguard.layers.Stage`): at most its policy's
    ``max_threads`` worker threads run its sync calls at once, abandoned ones included."""
    limiter: CapacityLimiter = stage.part("threads", lambda: CapacityLimiter(stage.policy.max_threads))
    return limiter
