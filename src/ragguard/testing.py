"""Helpers for your own test suite: a fresh registry per test, the fake clock, an event recorder.

ragguard keeps a little process-wide state: the default :class:`~ragguard.Guard` that ``@guard``
and :func:`ragguard.tenant` use, the process-wide chaos injector, and the event bus. A test that
changes one of them should not leak it into the next test::

    from ragguard.testing import EventRecorder, fresh_guard

    async def test_search_falls_back():
        with fresh_guard({"stages": {"search": {"timeout_s": 0.5}}}) as g, EventRecorder() as seen:
            g.breaker("search").force_open()
            assert await search("q") == ["keyword hit"]     # @guard("search") uses g now
            await seen.settle()
            assert seen.of(FallbackServed)

- :func:`fresh_guard` builds a Guard (policy as :func:`ragguard.configure` takes it) on a
  :class:`~ragguard.FakeClock` by default, makes it the default registry, and puts the previous
  one back on :meth:`FreshGuard.restore` (or at the end of its ``with`` block). It is a
  discrete-event clock: ``g.clock.advance(5)`` opens a half-open window, expires a deadline, fires
  an attempt timeout; and whenever every task waits while one sleeps on the clock (a fake
  dependency's ``await g.clock.sleep(0.05)``, a retry's backoff, a rate wait), time jumps to the next
  sleeper or timer due, so concurrent calls overlap as in real time (see :class:`~ragguard.FakeClock`).
- :class:`EventRecorder` subscribes to :data:`ragguard.events.bus` (events are delivered on the
  next loop iteration: ``await recorder.settle()`` before reading them).
- :func:`reset` forgets the default registry, uninstalls the process-wide chaos injector and forgets
  the fallbacks :func:`ragguard.degraded` reports outside a request.

The pytest plugin (``ragguard.chaos.pytest_plugin``, registered on install) builds its ``guard``
and ``guard_events`` fixtures on these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from os import PathLike
from types import TracebackType
from typing import Any

from . import _default, _inject
from ._clock import Clock, FakeClock
from ._context import forget_loose_fallbacks
from ._guard import Guard
from .events import EventBus, bus
from .options import Policy
from .options._policy import policy_of

__all__ = ["EventRecorder", "fresh_guard", "reset"]

class FreshGuard(Guard):
    """A :class:`~ragguard.Guard` installed as the default registry until :meth:`restore`.

    Usable as ``with fresh_guard(...) as g:``; ``clock`` is the :class:`~ragguard.FakeClock` it
    was built on (unless another clock was given).
    """

    def __init__(self, policy: Policy | None = None, **options: Any) -> None:
        super().__init__(policy, **options)
        self._previous: Guard | None = None
        self._installed = False

    def install(self) -> FreshGuard:
        """Make this Guard the default registry (``@guard``, ``tenant``, ``deadline`` use it)."""
        if not self._installed:
            self._previous = _default.guard
            _default.guard = self
            self._installed = True
        return self

    def restore(self) -> None:
        """Put back the default registry that was there before :meth:`install` (idempotent)."""
        if self._installed:
            self._installed = False
            if _default.guard is self:
                _default.guard = self._previous
            self._previous = None

    def __enter__(self) -> FreshGuard:
        return self.install()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.restore()


def fresh_guard(
    policy: Policy | Mapping[str, Any] | str | PathLike[str] | None = None,
    *,
    clock: Clock | None = None,
    install: bool = True,
    **options: Any,
) -> FreshGuard:
    """A new registry for one test, installed as the default (``install=False``: not installed).

    ``policy``: a :class:`~ragguard.Policy`, a mapping, or a YAML/TOML/JSON path (as
    :func:`ragguard.configure`); ``clock``: default a new :class:`~ragguard.FakeClock` at 0.0 s,
    which then drives the Guard's breakers, quotas, deadlines, retry backoff and attempt timeouts;
    ``options`` go to :class:`~ragguard.Guard` (rng, sleep, quotas, backend, chaos, max_stages).
    Raises ConfigError for a bad policy or option.
    """
    resolved = policy_of(policy, who="fresh_guard")
    g = FreshGuard(resolved, clock=FakeClock() if clock is None else clock, **options)
    return g.install() if install else g


class EventRecorder:
    """Records every event of ``bus`` (default :data:`ragguard.events.bus`) from creation until
    :meth:`close` (or the end of its ``with`` block).

    ``events`` is the list in arrival order; :meth:`of` filters it by type; ``await settle()``
    lets the loop deliver what was emitted (events arrive on a later loop iteration).
    """

    def __init__(self, bus_: EventBus | None = None) -> None:
        self.events: list[Any] = []
        self._unsubscribe: Callable[[], None] | None = (bus if bus_ is None else bus_).subscribe(self)

    def __call__(self, event: Any) -> None:
        self.events.append(event)

    def of(self, kind: type[Any]) -> list[Any]:
        """The recorded events that are instances of ``kind``, in order."""
        return [e for e in self.events if isinstance(e, kind)]

    async def settle(self, rounds: int = 5) -> None:
        """Yield to the event loop ``rounds`` times, so that queued events are delivered."""
        import anyio.lowlevel

        for _ in range(rounds):
            await anyio.lowlevel.checkpoint()

    def clear(self) -> None:
        """Forget the events recorded so far."""
        self.events.clear()

    def close(self) -> None:
        """Stop recording (idempotent)."""
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    def __enter__(self) -> EventRecorder:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventRecorder({len(self.events)} events)"


def reset() -> None:
    """Forget ragguard's process-wide state: the default registry (the next ``@guard`` call builds
    a fresh one from ``Policy()``), the process-wide chaos injector, and the fallbacks
    :func:`ragguard.degraded` reports outside any request (async test runners such as anyio's
    run every test in one context, so they would carry over from test to test)."""
    current = _default.guard
    if isinstance(current, FreshGuard):
        current._installed = False
    _default.guard = None
    _inject.uninstall()
    forget_loose_fallbacks()
