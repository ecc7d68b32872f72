"""What a layer is built with: the :class:`BuildContext` of one Guard.

After Polly v8's strategy builder context (a time provider, a randomizer, telemetry handed to each
strategy as it is built; no code is shared): a layer's builder reads its services here and its
options in its stage's policy, and never reaches back into the Guard that owns the stage. The
Guard makes one context and hands it to each :class:`~ragguard.layers.Stage` it builds; whatever a
layer makes that must be stopped (a shared breaker's Redis link, token accounts) is registered
with :meth:`BuildContext.on_close`, and :meth:`BuildContext.aclose` (``Guard.aclose``) is the one
close path for all of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from .. import _inject, events, outcomes
from .._errors import ConfigError

if TYPE_CHECKING:
    import random

    from .._clock import Clock
    from ..breakers import Breaker
    from ..events import EventBus
    from ..options import Policy, TenantQuota
    from ..outcomes import Outcome
    from ..quotas import QuotaBackend, TokenAccounts

__all__ = ["Backend", "BuildContext", "check_services"]

T = TypeVar("T")


def check_services(*, clock: Any, sleep: Any, rng: Any, quotas: Any, chaos: Any, backend: Any = None) -> None:
    """ConfigError naming the first of a Guard's services that is not what it must be (None:
    the default is used)."""
    if not callable(clock):
        raise ConfigError(f"clock must be a callable returning monotonic seconds, got {clock!r:.60}")
    if sleep is not None and not callable(sleep):
        raise ConfigError(f"sleep must be an async function of seconds, got {sleep!r:.60}")
    if rng is not None and not all(callable(getattr(rng, m, None)) for m in ("random", "uniform")):
        raise ConfigError(f"rng must be a random.Random, got {rng!r:.60}")
    if quotas is not None and not all(
        callable(getattr(quotas, m, None)) for m in ("admit_now", "acquire", "release")
    ):
        raise ConfigError(f"quotas must be a QuotaBackend (admit_now, acquire, release), got {quotas!r:.60}")
    if backend is not None and not all(
        callable(getattr(backend, m, None)) for m in ("quotas", "breaker", "tokens")
    ):
        raise ConfigError(
            "backend must be a ragguard Backend (quotas, breaker, tokens), such as "
            f"ragguard.redis.RedisBackend, got {type(backend).__name__}"
        )
    _check_chaos(chaos)


def _check_chaos(chaos: Any) -> None:
    if chaos is not None and not callable(chaos):
        raise ConfigError(f"chaos must be a ragguard.chaos.Chaos, got {type(chaos).__name__}")


class Backend(Protocol):
    """Where the replicas of a service share a Guard's state: ``Guard(backend=...)``
    (:class:`ragguard.redis.RedisBackend`). The Guard never builds this wiring itself: it asks its
    backend, once per part, for the shared counterpart of what it would keep in the process,
    with the Guard's clock (and for the quotas its sleep and random source); each part falls back
    to the local one while the shared store cannot answer. What a backend returns with an
    ``aclose`` is closed with the Guard (``await guard.aclose()``); one with ``start(strict=...)``
    is checked by ``await guard.start()``.

    - :meth:`quotas`: the tenant quota backend, from the policy (a :class:`~ragguard.quotas.QuotaBackend`);
    - :meth:`breaker`: a stage's breaker ``local``, shared;
    - :meth:`tokens`: the generation stages' token accounts ``local``, shared.
    """

    def quotas(
        self,
        policy: Policy,
        *,
        clock: Clock,
        sleep: Callable[[float], Awaitable[Any]],
        rng: random.Random,
    ) -> QuotaBackend: ...

    def breaker(self, local: Breaker, *, clock: Clock) -> Breaker: ...

    def tokens(self, local: TokenAccounts, *, clock: Clock) -> TokenAccounts: ...


class BuildContext:
    """The services of one Guard that its stages' layers are built with.

    - ``clock`` (monotonic seconds), ``sleep`` (an async function of seconds), ``rng``: the
      Guard's one time source, its waits and its random source;
    - ``quotas``: the tenant quota backend; ``per_call_quota``: whether a call outside a request
      is admitted by it (the default tenant has a bound); ``quota_of(tenant)``: a tenant's
      :class:`~ragguard.TenantQuota`;
    - ``backend``: where the Guard shares state across replicas (:class:`Backend`), else None;
    - ``chaos``: the Guard's own chaos injector; :attr:`injector` the one its chains run through;
    - ``bus``: the event bus the layers emit to (:data:`ragguard.events.bus` unless given);
    - ``classify``: what a dependency said (:func:`ragguard.outcomes.classify` unless given): the
      stage's chains ask it once per error and record the answer on the call (``Call.outcome``,
      what every layer reads) and on the error (:func:`ragguard.outcomes.outcome_of`, what the
      breakers' classifiers and the front doors read); no layer classifies an error itself.
    """

    __slots__ = (
        "_closers",
        "_parts",
        "backend",
        "bus",
        "chaos",
        "classify",
        "clock",
        "per_call_quota",
        "quota_of",
        "quotas",
        "rng",
        "sleep",
    )

    def __init__(
        self,
        *,
        clock: Clock,
        sleep: Callable[[float], Awaitable[Any]],
        rng: random.Random,
        quotas: QuotaBackend,
        quota_of: Callable[[str], TenantQuota],
        per_call_quota: bool,
        backend: Backend | None = None,
        chaos: _inject.Injector | None = None,
        bus: EventBus | None = None,
        classify: Callable[[BaseException], Outcome] | None = None,
    ) -> None:
        self.bus = events.bus if bus is None else bus
        self.classify = outcomes.classify if classify is None else classify
        self.clock = clock
        self.sleep = sleep
        self.rng = rng
        self.quotas = quotas
        self.quota_of = quota_of
        self.per_call_quota = per_call_quota
        self.backend = backend
        self.chaos = chaos
        self._closers: list[Callable[[], Awaitable[Any]]] = []
        self._parts: dict[str, Any] = {}

    def use_chaos(self, injector: _inject.Injector | None) -> None:
        """Make ``injector`` the Guard's own (None: the process-wide one applies); chains compiled
        with or without a chaos layer are rebuilt on their next call. ConfigError if not one."""
        _check_chaos(injector)
        if injector is not self.chaos:
            self.chaos = injector
            _inject.epoch += 1

    @property
    def injector(self) -> _inject.Injector | None:
        """The chaos injector the stages run through: the Guard's own, else the process-wide one."""
        return self.chaos if self.chaos is not None else _inject.active

    def part(self, key: str, make: Callable[[], T]) -> T:
        """The Guard-wide part ``key`` (shared by all its stages: the token accounts), made once."""
        got = self._parts.get(key)
        if got is None:
            got = self._parts[key] = make()
        return got

    def built(self, key: str) -> Any:
        """The Guard-wide part ``key`` if it was made, else None."""
        return self._parts.get(key)

    def on_close(self, close: Callable[[], Awaitable[Any]]) -> None:
        """Call ``await close()`` when the Guard closes (in registration order)."""
        self._closers.append(close)

    def share(self, kind: Literal["breaker", "tokens"], local: T) -> T:
        """``local`` (a stage's breaker, the token accounts) shared across replicas through the
        Guard's :class:`Backend` and closed with the Guard, or ``local`` itself without one."""
        if self.backend is None:
            return local
        shared = getattr(self.backend, kind)(local, clock=self.clock)
        close = getattr(shared, "aclose", None)
        if close is not None:
            self.on_close(close)
        return shared  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Close what the layers registered (each once; a second call closes nothing)."""
        closers, self._closers = self._closers, []
        for close in closers:
            await close()
