"""``@guard("stage")`` and :class:`Guard`, the registry of a service's stages.

A guarded function runs its stage's chain of layers (see :mod:`ragguard.layers` for the layers and
their order, :mod:`ragguard.pipeline` for how a chain runs a call and a stream). A :class:`Guard`
builds each stage once from its policy (breaker, retry budget, RAG preset state) and compiles one
chain per decorated function; ``@guard`` uses the default Guard, which :func:`configure` replaces.
"""

from __future__ import annotations

import functools
import inspect
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, Literal, ParamSpec, Protocol, TypeVar, cast, overload

from . import _inject
from . import metrics as _metrics
from ._clock import Clock, monotonic, sleep_of
from ._context import DEFAULT_TENANT
from ._errors import ConfigError
from .breakers import Breaker
from .deadline import deadline as _deadline_block
from .events import bus
from .layers import Bound, Stage
from .layers.breaker import adapt_breaker
from .pipeline import Call, Chain
from .pipeline._threads import ThreadCall, limiter_for
from .policy import Policy
from .quotas import LocalQuotas, QuotaBackend, TenantContext
from .rag import PRESETS, preset

__all__ = ["Guard", "GuardDecorator", "configure", "default_guard", "guard", "tenant"]

log = logging.getLogger("ragguard")

P = ParamSpec("P")
R = TypeVar("R")
Y = TypeVar("Y")


class Guard:
    """An independent registry of guarded stages, breakers and tenant quotas built from a policy.

    - ``clock`` (monotonic seconds; :class:`~ragguard.FakeClock` in tests) is the Guard's one time
      source: breakers, quotas, deadlines (:meth:`deadline`, :meth:`tenant`), retry budgets and
      backoff, attempt timers (a FakeClock's own);
    - ``rng`` seeds breaker and retry jitter; ``sleep`` (an async function of seconds) performs
      retry backoff (default: the clock's own ``sleep``, else ``anyio.sleep``);
    - ``quotas`` replaces the in-memory quota backend;
    - ``redis`` (a ``redis.asyncio.Redis`` client) shares state across replicas: tenant quotas
      become :class:`ragguard.distributed.RedisQuotas` and every breaker the policy builds a
      :class:`ragguard.distributed.SharedCircuitBreaker`, under keys starting with
      ``redis_prefix``; ``redis_options`` tunes them: ``{"quotas": {...}, "breakers": {...}}``,
      keyword options of those two classes (``lease_s``, ``local_lease``, ``redis_timeout_s``,
      ``staleness_s``...), and ``"tokens"`` those of :class:`ragguard.distributed.RedisTokens`,
      the generation stages' shared token accounts. Give the client short timeouts and no
      retries of its own (see docs/distributed.md); call ``await guard.aclose()`` at shutdown;
    - ``chaos``: a :class:`ragguard.chaos.Chaos` injector for this Guard's stages only;
    - ``max_stages``: stages kept at most (stage names name code paths, not data; past the bound
      the oldest idle stages are forgotten, with a warning: idle means no live decorated function
      runs it and its breaker is closed, so a stage in use or with a breaker that is not closed
      is never forgotten).

    Raises ConfigError naming the option for a bad value.
    """

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        clock: Clock = monotonic,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        quotas: QuotaBackend | None = None,
        redis: Any = None,
        redis_prefix: str = "ragguard",
        redis_options: Mapping[str, Mapping[str, Any]] | None = None,
        chaos: _inject.Injector | None = None,
        max_stages: int = 1000,
    ) -> None:
        if policy is not None and not isinstance(policy, Policy):
            raise ConfigError(f"policy must be a ragguard.Policy, got {type(policy).__name__}")
        if not callable(clock):
            raise ConfigError(f"clock must be a callable returning monotonic seconds, got {clock!r:.60}")
        if sleep is not None and not callable(sleep):
            raise ConfigError(f"sleep must be an async function of seconds, got {sleep!r:.60}")
        if rng is not None and not all(callable(getattr(rng, m, None)) for m in ("random", "uniform")):
            raise ConfigError(f"rng must be a random.Random, got {rng!r:.60}")
        if quotas is not None and not all(
            callable(getattr(quotas, m, None)) for m in ("admit_now", "acquire", "release")
        ):
            raise ConfigError(
                f"quotas must be a QuotaBackend (admit_now, acquire, release), got {quotas!r:.60}"
            )
        if chaos is not None and not callable(chaos):
            raise ConfigError(f"chaos must be a ragguard.chaos.Chaos, got {type(chaos).__name__}")
        if isinstance(max_stages, bool) or not isinstance(max_stages, int) or max_stages < 1:
            raise ConfigError(f"max_stages must be an int >= 1, got {max_stages!r:.40}")
        self.policy = policy if policy is not None else Policy()
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self.sleep = sleep if sleep is not None else sleep_of(clock)
        self.quotas: Any = (
            quotas if quotas is not None else LocalQuotas(self.policy.quota, clock=clock, sleep=self.sleep)
        )
        self.per_call_quota = not (
            self.policy.default_quota.max_concurrency is None and self.policy.default_quota.rate_per_s is None
            and self.policy.pool(DEFAULT_TENANT) is None  # calls outside a request count in the pool too
        )
        self._stages: dict[str, Stage] = {}
        self._closers: list[Callable[[], Awaitable[Any]]] = []
        self._chaos = chaos
        self.max_stages = max_stages
        self._warned_stages = False
        self.redis = redis
        self.redis_prefix = redis_prefix
        options = dict(redis_options or {})
        unknown = set(options) - {"quotas", "breakers", "tokens"}
        if unknown or not all(isinstance(v, Mapping) for v in options.values()):
            raise ConfigError(
                "redis_options must map 'quotas', 'breakers' and/or 'tokens' to keyword options, "
                f"got {sorted(map(str, options))!r:.80}"
            )
        self.redis_options: dict[str, dict[str, Any]] = {k: dict(v) for k, v in options.items()}
        if redis is not None:
            if not callable(getattr(redis, "evalsha", None)):
                raise ConfigError(f"redis must be a redis.asyncio client, got {type(redis).__name__}")
            if quotas is None:
                from .distributed import RedisQuotas

                shared = {
                    "clock": None if clock is monotonic else clock,  # None: Redis server time
                    "link_clock": clock,
                    "rng": self.rng,
                    "fallback": LocalQuotas(self.policy.quota, clock=clock, sleep=self.sleep),
                    **self.redis_options.get("quotas", {}),
                }
                try:
                    self.quotas = RedisQuotas(self.policy.quota, redis, key_prefix=redis_prefix, **shared)
                except TypeError as exc:  # an option RedisQuotas does not take
                    raise ConfigError(f"redis_options['quotas']: {exc}") from None
                self._closers.append(self.quotas.aclose)

    # -- stages -----------------------------------------------------------------------------------

    def stage(self, name: str, *, breaker: Breaker | Literal[False] | None = None) -> Stage:
        """The runtime of stage ``name``, created on first use (``breaker`` overrides its breaker;
        False: the stage has none, whatever its policy says).

        Raises ConfigError for a bad name, or a second different breaker for one stage."""
        st = self._stages.get(name)
        if st is None:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"stage name must be a non-empty str, got {name!r:.60}")
            policy = self.policy.stage(name)
            if len(self._stages) >= self.max_stages:
                self._forget_idle_stages()
            st = self._stages[name] = Stage(self, name, policy, preset(policy.preset), breaker)
        elif breaker is False:
            if st.breaker is not None:
                raise ConfigError(f"stage {name!r} has a breaker; breaker=False needs a stage without")
        elif (
            breaker is not None
            and st.breaker is not breaker
            and getattr(st.breaker, "wrapped", None) is not breaker
        ):
            raise ConfigError(f"stage {name!r} already has a breaker; give one breaker per stage")
        return st

    def _forget_idle_stages(self) -> None:
        """Forget the oldest idle stages down to 90% of ``max_stages``. Idle: no live decorated
        function runs it (see :attr:`Stage.users`) and its breaker is closed (or absent), so
        a stage in use, or with an open, half-open or forced breaker, is never forgotten (health
        checks keep seeing it); a forgotten stage starts afresh if its name comes back."""
        if not self._warned_stages:
            self._warned_stages = True
            log.warning(
                "Guard holds %d stages (max_stages): stage names should name code paths, not data; "
                "forgetting the oldest idle ones",
                len(self._stages),
            )
        target = int(self.max_stages * 0.9)
        for name, st in list(self._stages.items()):
            if len(self._stages) <= target:
                return
            if st.users:
                continue
            state = getattr(st.breaker, "state", None)
            if st.breaker is None or getattr(state, "value", state) == "closed":
                del self._stages[name]

    def breaker(self, stage: str) -> Any:
        """The breaker guarding ``stage`` (None when the stage has none)."""
        return self.stage(stage).breaker

    def stage_names(self) -> tuple[str, ...]:
        """The names of the stages this Guard has built, in the order they were first used."""
        return tuple(self._stages)

    def breakers(self) -> dict[str, Any]:
        """Stage name -> its breaker, for every built stage that has one."""
        return {name: st.breaker for name, st in self._stages.items() if st.breaker is not None}

    def status(self) -> dict[str, Any]:
        """A JSON-ready snapshot for health endpoints and ``ragguard top``: breakers, adaptive
        limits, throttles, hedges, quotas (per configured tenant and the others added up) and each
        Redis link; see :mod:`ragguard.status` for its shape. ``ok`` is False while any breaker
        is open, forced open or half-open (``open`` names those stages)."""
        from .status import snapshot

        return snapshot(self)

    # -- chaos ------------------------------------------------------------------------------------

    @property
    def chaos(self) -> _inject.Injector | None:
        """This Guard's own chaos injector (None: the process-wide one applies, if installed)."""
        return self._chaos

    @chaos.setter
    def chaos(self, injector: _inject.Injector | None) -> None:
        if injector is not None and not callable(injector):
            raise ConfigError(f"chaos must be a ragguard.chaos.Chaos, got {type(injector).__name__}")
        if injector is not self._chaos:
            self._chaos = injector
            _inject.epoch += 1  # chains compiled with or without a chaos layer are rebuilt

    @property
    def injector(self) -> _inject.Injector | None:
        """The injector this Guard's stages run through: its own, else the process-wide one."""
        return self._chaos if self._chaos is not None else _inject.active

    # -- requests ---------------------------------------------------------------------------------

    async def start(self, *, strict: bool = False) -> Guard:
        """Check Redis now for the shared quotas, the shared breakers and token accounts built so
        far (each runs its health probe; see docs/distributed.md); returns self. A no-op without
        ``redis``.

        Redis unreachable: they start on local state and keep probing. Redis refusing the
        configuration (a wrong password, a missing ACL permission, an untrusted TLS certificate):
        logged at ERROR, then the same, or with ``strict=True`` :class:`ConfigError` naming the
        cause (never the secret)."""
        from .rag._tokens import built_accounts

        for component in (self.quotas, *self.breakers().values(), built_accounts(self)):
            start = getattr(component, "start", None)
            if start is not None and getattr(component, "shared", None) is not None:
                await start(strict=strict)
        return self

    async def aclose(self) -> None:
        """Stop the background work of shared (Redis) breakers and quotas; a no-op otherwise."""
        closers, self._closers = self._closers, []
        for close in closers:
            await close()

    def tenant(self, tenant_id: str) -> TenantContext:
        """``async with guard.tenant("acme"):`` admits one request of the tenant (see :func:`tenant`)."""
        return TenantContext(tenant_id, self.quotas, self.policy.quota(tenant_id), self.clock)

    def deadline(self, seconds: float | None) -> _deadline_block:
        """``async with guard.deadline(0.8):`` a :func:`ragguard.deadline` on this Guard's clock."""
        return _deadline_block(seconds, clock=self.clock)

    def guard(self, stage: str, **options: Any) -> GuardDecorator:
        """``@g.guard("stage", fallback=...)``: like :func:`ragguard.guard`, bound to this Guard.

        Raises ConfigError for an unknown option."""
        return cast(GuardDecorator, _decorator(stage, self, options))


_default: Guard | None = None


def default_guard() -> Guard:
    """The registry ``@guard`` and ``tenant`` use (built from ``Policy()`` until :func:`configure`)."""
    global _default
    if _default is None:
        _default = Guard()
    return _default


def configure(
    policy: Policy | Mapping[str, Any] | str | PathLike[str] | None = None, **options: Any
) -> Guard:
    """Replace the default registry: ``policy`` is a Policy, a mapping, or a YAML/TOML/JSON path.

    ``options`` (clock, rng, sleep, quotas, redis, chaos...) go to :class:`Guard`. Breaker states
    start fresh. Raises ConfigError for an invalid policy or option.
    """
    global _default
    if policy is None:
        resolved = Policy()
    elif isinstance(policy, Policy):
        resolved = policy
    elif isinstance(policy, Mapping):
        resolved = Policy.parse(policy)
    elif isinstance(policy, (str, PathLike)):
        resolved = Policy.from_file(Path(policy))
    else:
        raise ConfigError(
            f"configure() takes a Policy, a mapping or a file path, not {type(policy).__name__}"
        )
    _default = Guard(resolved, **options)
    return _default


def tenant(tenant_id: str) -> TenantContext:
    """``async with tenant("acme"):`` one request of tenant ``acme`` in the default registry.

    On entry the tenant's quota admits the request (concurrency slot and rate token, waiting first
    come first served up to ``max_wait_s`` or the deadline), else raises QuotaExceeded with
    ``tenant`` and ``retry_after_s``; the tenant's ``timeout_s`` becomes the deadline. A bad id
    raises InvalidInput (a ValueError). Slots are released on exit, error and cancellation.
    """
    return default_guard().tenant(tenant_id)


class GuardDecorator(Protocol):
    """What ``guard(...)`` returns: keeps the decorated function's signature (ParamSpec)."""

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Callable[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __call__(self, fn: Callable[P, AsyncIterator[Y]], /) -> Callable[P, AsyncGenerator[Y, None]]: ...  # type: ignore[overload-overlap]
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Callable[P, Coroutine[Any, Any, R]]: ...


def guard(
    stage: str,
    *,
    fallback: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
    breaker: Any = None,
    **preset_options: Any,
) -> GuardDecorator:
    """Guard an async function (or async generator function) as stage ``stage``; a sync function
    becomes an async one that runs it in a worker thread under the same layers (docs/sync.md: a
    timeout stops the waiting, not the thread, and what the call holds stays held until the
    thread returns).

    - ``fallback``: a callable, or a sequence of them tried in order, called with the same
      arguments when the stage fails in a way its breaker counts, the dependency is unreachable
      or timed out, its breaker is open, or the deadline is spent; the first that answers serves
      the call and is named in :func:`ragguard.degraded`. For a stream, the fallbacks serve only
      until the first item; they may be async generator functions.
    - ``breaker``: a ragguard breaker or an ``aiobreaker.CircuitBreaker`` for this stage, instead
      of the one its policy builds; ``False`` for none (a step that composes guarded stages, whose
      own breakers already count their dependencies' failures).
    - the stage preset's options (see :mod:`ragguard.rag`): ``texts=`` (embedding: where the texts
      are, a position or a name, default 0), ``candidates=`` (rerank: where the candidate list is,
      default 1) and ``score=`` (rerank: a reranked item's score, default its ``score``).

    Raises ConfigError at decoration for a bad option, a sync generator function, or a preset
    option the function's signature does not have. At call time, raises what the call raised when no fallback
    serves, or BreakerOpen, QuotaExceeded, DeadlineExceeded, StageTimeout.
    """
    return cast(
        GuardDecorator,
        _decorator(stage, default_guard, {"fallback": fallback, "breaker": breaker, **preset_options}),
    )


class _Compiled:
    """A decorated function's chains for one Guard, valid while ``epoch`` is the injection epoch."""

    __slots__ = ("__weakref__", "epoch", "guard", "observed", "plain", "run", "stage")

    def __init__(self, guard: Guard | None, stage: Stage | None, plain: Chain | None) -> None:
        self.guard = guard
        self.stage = stage
        self.plain = plain
        self.run: Callable[..., Awaitable[Any]] | None = None if plain is None else plain.root.run
        self.observed: Chain | None = None
        self.epoch = _inject.epoch
        if stage is not None:
            stage.users.add(self)  # the stage is in use while this function's chains live


def _decorator(stage: str, registry: Guard | Callable[[], Guard], options: Mapping[str, Any]) -> Any:
    if not isinstance(stage, str) or not stage:
        raise ConfigError(f"guard: stage must be a non-empty str, got {stage!r:.60}")
    known = frozenset({"fallback", "breaker"}).union(*(p.option_names for p in PRESETS.values()))
    unknown = set(options) - known
    if unknown:
        raise ConfigError(f"guard: unknown option(s) {sorted(unknown)}; allowed: {sorted(known)}")
    fallbacks = _fallbacks(options.get("fallback"))
    breaker = options.get("breaker")
    if breaker is not None and breaker is not False:
        breaker = adapt_breaker(breaker)
    preset_options = {k: v for k, v in options.items() if k not in ("fallback", "breaker") and v is not None}

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise ConfigError(f"guard({stage!r}) decorates a callable, got {type(fn).__name__}")
        stream = inspect.isasyncgenfunction(fn)
        # every callable has a __call__: test that it is async, else a sync function slips through
        method = getattr(fn, "__call__", None)  # noqa: B004 - the method itself, not callability
        threaded = not stream and not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(method))
        if threaded and (inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(method)):
            raise ConfigError(
                f"guard({stage!r}) does not guard a sync generator function ({fn!r:.60}): its "
                "items would each cross a thread and could not be closed while one waits; guard "
                "an async generator (an async client's stream) instead"
            )
        bound = Bound(
            stage, fn, stream=stream, fallbacks=fallbacks, breaker=breaker, options=preset_options,
            threaded=threaded,
        )
        fixed = registry if isinstance(registry, Guard) else None
        _check_preset(fixed or cast(Callable[[], Guard], registry)(), bound)
        slot = _Compiled(None, None, None)

        def compiled(g: Guard) -> _Compiled:
            nonlocal slot
            current = slot
            if current.guard is not g or current.epoch != _inject.epoch:
                st = g.stage(stage, breaker=breaker)
                _check_preset(g, bound)
                current = slot = _Compiled(g, st, st.chain(bound))
            return current

        def chain(g: Guard) -> Chain:
            c = compiled(g)
            if bus.active or _metrics._tracer is not None:
                if c.observed is None:
                    assert c.stage is not None
                    c.observed = c.stage.chain(bound, observed=True)
                return c.observed
            return cast(Chain, c.plain)

        get_guard = cast(Callable[[], Guard], registry) if fixed is None else None
        compiled(fixed if fixed is not None else get_guard())  # type: ignore[misc]
        # built at decoration: a bad breaker or preset option fails here, and the stage is listed by
        # Guard.status() before its first call

        if threaded:

            @functools.wraps(fn)
            async def guarded_sync(*args: Any, **kwargs: Any) -> Any:
                g = fixed if fixed is not None else get_guard()  # type: ignore[misc]
                c = compiled(g)
                return await chain(g).root.run(ThreadCall(stage, fn, args, kwargs, limiter_for(c.stage)))

            guarded_sync.__ragguard_stage__ = stage  # type: ignore[attr-defined]
            return guarded_sync

        if stream:

            @functools.wraps(fn)
            def guarded_stream(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                g = fixed if fixed is not None else get_guard()  # type: ignore[misc]
                return chain(g).stream(Call(stage, fn, args, kwargs, True))

            guarded_stream.__ragguard_stage__ = stage  # type: ignore[attr-defined]
            return guarded_stream

        @functools.wraps(fn)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            g = fixed if fixed is not None else get_guard()  # type: ignore[misc]
            c = slot
            if c.guard is g and c.epoch == _inject.epoch:
                if not bus.active and _metrics._tracer is None:
                    return await c.run(Call(stage, fn, args, kwargs))  # type: ignore[misc]
                if c.observed is not None:  # observed: one driver frame, no Chain.run around it
                    return await c.observed.root.run(Call(stage, fn, args, kwargs))
            return await chain(g).root.run(Call(stage, fn, args, kwargs))

        guarded.__ragguard_stage__ = stage  # type: ignore[attr-defined]
        return guarded

    return decorate


def _fallbacks(given: Any) -> tuple[Callable[..., Any], ...]:
    if given is None:
        return ()
    chain = tuple(given) if isinstance(given, (list, tuple)) else (given,)
    for i, fn in enumerate(chain):
        if not callable(fn):
            where = (
                "fallback" if len(chain) == 1 and not isinstance(given, (list, tuple)) else f"fallback[{i}]"
            )
            raise ConfigError(f"guard: {where} must be callable, got {type(fn).__name__}")
    return chain


def _check_preset(g: Guard, bound: Bound) -> None:
    """Validate ``bound``'s preset options against the preset its stage runs in ``g`` (at decoration,
    and again if a new policy gives the stage another preset)."""
    chosen = preset(g.policy.stage(bound.stage).preset)
    given = set(bound.options)
    if chosen is None:
        if given:
            raise ConfigError(
                f"guard({bound.stage!r}): option(s) {sorted(given)} belong to a stage preset, and "
                "this stage has none (set its policy's preset)"
            )
        return
    foreign = given - chosen.option_names
    if foreign:
        raise ConfigError(
            f"guard({bound.stage!r}): option(s) {sorted(foreign)} do not apply to the "
            f"{chosen.name!r} preset (its options: {sorted(chosen.option_names) or 'none'})"
        )
    if bound.stream and not chosen.streams:
        raise ConfigError(
            f"guard({bound.stage!r}): the {chosen.name!r} preset does not guard async generators"
        )
    bound.resolved(chosen)
