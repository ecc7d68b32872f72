"""The chaos injector: which faults hit which stage and tenant.

:class:`Chaos` implements the injection point of guarded calls (:mod:`ragguard._inject`). Once
installed, every guarded attempt runs ``await chaos(stage, tenant, call)``; the faults whose
stage and tenant match, that are enabled, inside their schedule and win their draw, wrap the
call in the order they were injected (the first injected is the outermost). With chaos
disabled or uninstalled, ``_inject.active`` is None and a guarded call pays nothing.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any

from .. import _inject
from .._clock import Clock, monotonic
from .._errors import ConfigError
from ..events import bus
from ._faults import Fault, FaultContext, Sleep, _as_names

__all__ = ["Chaos", "FaultHandle", "FaultInjected"]


@dataclass(frozen=True, slots=True)
class FaultInjected:
    """Fault ``fault`` (its kind) hit a call of stage ``stage`` for tenant ``tenant``."""

    stage: str
    tenant: str
    fault: str


async def _default_sleep(seconds: float) -> None:
    import anyio

    await anyio.sleep(seconds)


class FaultHandle:
    """One injected fault and its target; ``remove()`` takes it out (idempotent).

    ``injected`` counts the calls it hit; usable as a context manager that removes it on exit.
    """

    __slots__ = ("_chaos", "fault", "injected", "stages", "tenants")

    def __init__(self, chaos: Chaos, fault: Fault, stages: frozenset[str] | None,
                 tenants: frozenset[str] | None) -> None:
        self._chaos: Chaos | None = chaos
        self.fault = fault
        self.stages = stages
        self.tenants = tenants
        self.injected = 0

    def matches(self, stage: str, tenant: str) -> bool:
        return (self.stages is None or stage in self.stages) and (
            self.tenants is None or tenant in self.tenants
        )

    @property
    def active(self) -> bool:
        """False once removed."""
        return self._chaos is not None

    def remove(self) -> None:
        """Stop injecting the fault and release what it holds."""
        chaos, self._chaos = self._chaos, None
        if chaos is not None:
            chaos._remove(self)

    def __enter__(self) -> FaultHandle:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()

    def __repr__(self) -> str:
        stages = "*" if self.stages is None else ",".join(sorted(self.stages))
        tenants = "*" if self.tenants is None else ",".join(sorted(self.tenants))
        return f"FaultHandle({self.fault!r}, stage={stages}, tenant={tenants}, injected={self.injected})"


class Chaos:
    """A set of faults targeted by stage and tenant; an injector for :mod:`ragguard._inject`.

    ``install()`` makes it the process's injector; ``install(guard)`` that one Guard's only (its
    ``chaos``), so two Guards in one process can run different faults.
    ``rng`` draws injection rates and random effects (seed it in tests; default: a fresh
    ``random.Random()``); ``clock`` is what schedules and scenario runners read (monotonic
    seconds); ``sleep`` is awaited for delays (default ``anyio.sleep``: asyncio and trio).

    >>> chaos = Chaos(rng=random.Random(7))
    >>> handle = chaos.inject(Error(kind="connection_refused"), stage="search")
    >>> chaos.install()          # guarded calls of stage "search" now fail, in every Guard
    >>> handle.remove(); chaos.close()
    """

    def __init__(
        self,
        *,
        rng: random.Random | None = None,
        clock: Clock = monotonic,
        sleep: Sleep | None = None,
    ) -> None:
        if rng is not None and not isinstance(rng, random.Random):
            raise ConfigError(f"Chaos: rng must be a random.Random, got {type(rng).__name__}")
        self.rng = rng if rng is not None else random.Random()
        self.clock = clock
        self.sleep: Sleep = sleep or _default_sleep
        self._handles: list[FaultHandle] = []
        self._installed = False
        self._guards: list[weakref.ref[Any]] = []  # the Guards it is installed on (weakly)
        self._enabled = True

    # -- targeting -------------------------------------------------------------------------------

    def inject(
        self,
        fault: Fault,
        *,
        stage: str | Iterable[str] | None = None,
        tenant: str | Iterable[str] | None = None,
    ) -> FaultHandle:
        """Apply ``fault`` to calls of ``stage`` (None: every stage) for ``tenant`` (None: every one).

        ``stage``/``tenant`` take a name or several. Returns the handle that removes it. Raises
        ConfigError for something that is not a Fault or an empty name.
        """
        if not isinstance(fault, Fault):
            raise ConfigError(f"inject: expected a ragguard.chaos fault, got {type(fault).__name__}")
        handle = FaultHandle(self, fault, _as_names(stage, "stage"), _as_names(tenant, "tenant"))
        self._handles.append(handle)
        return handle

    @property
    def faults(self) -> tuple[FaultHandle, ...]:
        """The handles of the faults currently injected, oldest first."""
        return tuple(self._handles)

    def clear(self) -> None:
        """Remove every fault (releasing what they hold)."""
        for handle in list(self._handles):
            handle.remove()

    def _remove(self, handle: FaultHandle) -> None:
        try:
            self._handles.remove(handle)
        except ValueError:
            return
        handle.fault.release()

    # -- on and off ------------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self._enabled

    def install(self, guard: Any = None) -> Chaos:
        """Make this the injector of ``guard`` (a :class:`ragguard.Guard`: that Guard's stages
        only, over any process-wide injector), or with None of the whole process (replacing any
        other); returns self. Two Guards in one process can run different faults this way.
        Raises ConfigError when ``guard`` is not a Guard."""
        if guard is None:
            self._installed = True
            if self._enabled:
                _inject.install(self)
            return self
        if not hasattr(type(guard), "chaos") or not hasattr(guard, "stage"):
            raise ConfigError(
                f"Chaos.install: guard must be a ragguard.Guard or None, got {type(guard).__name__}"
            )
        if not any(ref() is guard for ref in self._guards):
            self._guards.append(weakref.ref(guard))
        if self._enabled:
            guard.chaos = self
        return self

    def uninstall(self, guard: Any = None) -> None:
        """Stop wrapping guarded calls: of ``guard`` only when given, else of the whole process
        and of every Guard it was installed on (only where this is the installed injector)."""
        targets = [guard] if guard is not None else [ref() for ref in self._guards]
        for g in targets:
            if g is not None and g.chaos is self:
                g.chaos = None
        self._guards = [ref for ref in self._guards if ref() is not None and ref() not in targets]
        if guard is None:
            self._installed = False
            _inject.uninstall(self)

    def disable(self) -> None:
        """Switch every fault off: uninstalls the injector, so guarded calls pay nothing."""
        self._enabled = False
        _inject.uninstall(self)
        for ref in self._guards:
            g = ref()
            if g is not None and g.chaos is self:
                g.chaos = None

    def enable(self) -> None:
        """Switch back on (re-installs the injector where it was installed)."""
        self._enabled = True
        if self._installed:
            _inject.install(self)
        for ref in self._guards:
            g = ref()
            if g is not None and g.chaos is None:
                g.chaos = self

    def close(self) -> None:
        """Remove every fault and uninstall."""
        self.clear()
        self.uninstall()

    def __enter__(self) -> Chaos:
        return self.install()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- the injection point ---------------------------------------------------------------------

    async def __call__(
        self, stage: str, tenant: str, call: Callable[[], Awaitable[Any]], *, stream: bool = False
    ) -> Any:
        """Run ``call()`` for ``stage``/``tenant`` through the faults that fire for it.

        ``stream=True`` when ``call`` opens a stream (up to its first item): faults that rewrite a
        result (partial, empty, stale, corrupt) leave it alone."""
        if not self._enabled or not self._handles:
            return await call()
        matching = [
            h for h in self._handles if h.matches(stage, tenant) and not (stream and h.fault.rewrites_result)
        ]
        if not matching:
            return await call()
        ctx = FaultContext(stage, tenant, self.rng, self.sleep)
        firing: list[FaultHandle] = []
        watching: list[Fault] = []
        for h in matching:
            if h.fault.fires(self.rng, call):
                firing.append(h)
            elif type(h.fault).observe is not Fault.observe:
                watching.append(h.fault)
        if not firing:
            result = await call()
            for fault in watching:
                fault.observe(ctx, result)
            return result
        emit = bus.active
        wrapped: Callable[[], Awaitable[Any]] = call
        for h in reversed(firing):
            h.injected += 1
            if emit:
                bus.emit(FaultInjected(stage, tenant, h.fault.kind))
            wrapped = partial(h.fault.wrap, wrapped, ctx)
        return await wrapped()

    async def run(self, stage: str, call: Callable[[], Awaitable[Any]], *, tenant: str = "default") -> Any:
        """Run ``call()`` as if it were a guarded call of ``stage`` (for code without ``@guard``)."""
        return await self(stage, tenant, call)

    def __repr__(self) -> str:
        state = "enabled" if self._enabled else "disabled"
        return f"Chaos({state}, installed={self._installed}, faults={len(self._handles)})"
