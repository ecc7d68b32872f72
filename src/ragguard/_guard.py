"""``@guard("stage")`` and :class:`Guard`, the registry of a service's stages.

A guarded function runs its stage's chain of layers (see :mod:`ragguard.layers` for the layers and
their order, :mod:`ragguard.pipeline` for how a chain runs a call and a stream). A :class:`Guard`
builds each stage once from its policy (breaker, retry budget, RAG preset state) and compiles one
chain per decorated function; ``@guard`` uses the default Guard, which :func:`configure` replaces.
"""

from __future__ import annotations

import logging
import random
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from os import PathLike
from typing import Any, Literal, cast

from . import _default, _inject
from ._clock import Clock, monotonic
from ._deadline import deadline as _deadline_block
from ._decorate import GuardDecorator, decorator
from ._errors import ConfigError
from ._http import field_name
from ._services import services
from ._status import snapshot
from .breakers import Breaker
from .groups import ModelGroup
from .layers import Stage
from .layers._presets import preset
from .layers._stage import forget_idle
from .options import GroupPolicy, Policy
from .options._keyed import key_id
from .options._policy import policy_of
from .outcomes._classify import OutcomeClassifier
from .pipeline import Backend
from .quotas import QuotaBackend
from .quotas._tenant import TenantContext

__all__ = ["Guard", "GuardDecorator", "configure", "default_guard", "guard", "tenant"]

_log = logging.getLogger("ragguard.policy")


class Guard:
    """An independent registry of guarded stages, breakers and tenant quotas built from a policy.

    - ``clock`` (monotonic seconds; :class:`~ragguard.FakeClock` in tests) is the Guard's one time
      source: breakers, quotas, deadlines (:meth:`deadline`, :meth:`tenant`), retry budgets and
      backoff, attempt timers (a FakeClock's own);
    - ``rng`` seeds breaker and retry jitter; ``sleep`` (an async function of seconds) performs
      retry backoff (default: the clock's own ``sleep``, else ``anyio.sleep``);
    - ``quotas`` replaces the in-memory quota backend;
    - ``backend`` shares state across replicas (a :class:`ragguard.pipeline.Backend`):
      ``backend=ragguard.redis.RedisBackend(client)`` keeps the tenant quotas, every breaker the
      policy builds and the generation stages' token accounts in Redis (see docs/distributed.md);
      call ``await guard.aclose()`` at shutdown;
    - ``chaos``: a :class:`ragguard.chaos.Chaos` injector for this Guard's stages only;
    - ``classifier``: an outcome classifier of this Guard's own (``exc -> Outcome | None``, as
      :func:`ragguard.outcomes.register_classifier` takes), asked about its calls' errors after
      ragguard's own errors and before the process-wide classifiers (None: it passes the error
      on). Each error is classified once; every layer, the breakers and both front doors read
      that answer;
    - ``max_stages``: stages kept at most (stage names name code paths, not data; past the bound
      the oldest idle stages are forgotten, with a warning: idle means no live decorated function
      runs it and its breaker is closed, so a stage in use or with a breaker that is not closed
      is never forgotten).
    - ``tenant_header``: an HTTP field name (``"x-tenant-id"``; case-insensitive, kept lowercase)
      in which every client wrapped by :mod:`ragguard.integrations` for this Guard sends
      :func:`ragguard.current_tenant` with each request (OpenAI, Anthropic, their fallback clients,
      LangChain chat models, Qdrant, LlamaIndex; see docs/integrations.md); None (the default):
      none is sent unless a wrapper names its own.

    Building a Guard logs a warning (logger ``ragguard.policy``) for every limit of the policy
    that no call can ever reach (:meth:`Policy.unreachable_limits`: a burst without its rate, a
    model's limit the tenant's own is always tighter than...): it changes nothing, and it is
    almost always a mistake.

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
        backend: Backend | None = None,
        chaos: _inject.Injector | None = None,
        classifier: OutcomeClassifier | None = None,
        max_stages: int = 1000,
        tenant_header: str | None = None,
    ) -> None:
        if policy is not None and not isinstance(policy, Policy):
            raise ConfigError(f"policy must be a ragguard.Policy, got {type(policy).__name__}")
        if isinstance(max_stages, bool) or not isinstance(max_stages, int) or max_stages < 1:
            raise ConfigError(f"max_stages must be an int >= 1, got {max_stages!r:.40}")
        self.policy = policy if policy is not None else Policy()
        self.context = services(
            self.policy, clock=clock, rng=rng, sleep=sleep, quotas=quotas, backend=backend, chaos=chaos,
            classifier=classifier,
        )  # fmt: skip
        self.max_stages = max_stages
        self.tenant_header = None if tenant_header is None else field_name("tenant_header", tenant_header)
        self.clock, self.rng, self.sleep = clock, self.context.rng, self.context.sleep
        self.quotas: Any = self.context.quotas
        self.backend = backend
        self._stages: dict[str, Stage] = {}
        self._groups: weakref.WeakValueDictionary[str, ModelGroup] = weakref.WeakValueDictionary()
        self._warned_stages = False
        for unreachable in self.policy.unreachable_limits():
            _log.warning("ragguard policy: %s", unreachable)
        for stage in self.policy.stages:  # a misspelt layer is refused here, not at a first call
            self.policy.stage(stage)
        if self.policy.default_stage.pending:
            self.policy.default_stage.check_layers("default_stage")

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
                forget_idle(self._stages, self.max_stages, warn=not self._warned_stages)
                self._warned_stages = True
            st = self._stages[name] = Stage(self.context, name, policy, preset(policy.preset), breaker)
        else:
            st.check_breaker(breaker)
        return st

    def breaker(self, stage: str, key: str | None = None) -> Any:
        """The breaker guarding ``stage`` (None when the stage has none); with ``key``, the one of
        that key of the keyed stage (None when the key has no runtime now: it never ran, was
        forgotten, or runs on the stage's own instance)."""
        st = self.stage(stage)
        if key is None:
            return st.breaker
        found = None if st.keys is None else st.keys.peek(key)
        return None if found is None else found.breaker

    def stage_names(self) -> tuple[str, ...]:
        """The names of the stages this Guard has built, in the order they were first used."""
        return tuple(self._stages)

    def breakers(self) -> dict[str, Any]:
        """Stage name -> its breaker, for every built stage that has one."""
        return {name: st.breaker for name, st in self._stages.items() if st.breaker is not None}

    def status(self) -> dict[str, Any]:
        """A JSON-ready snapshot for health endpoints and ``ragguard top``: breakers, adaptive
        limits, throttles, hedges, quotas (per configured tenant and the others added up) and each
        Redis link; see :mod:`ragguard._status` for its shape. ``ok`` is False while any breaker
        is open, forced open or half-open (``open`` names those stages)."""
        return snapshot(self)

    @property
    def chaos(self) -> _inject.Injector | None:
        """This Guard's own chaos injector (None: the process-wide one applies, if installed)."""
        return self.context.chaos

    @chaos.setter
    def chaos(self, injector: _inject.Injector | None) -> None:
        self.context.use_chaos(injector)

    @property
    def injector(self) -> _inject.Injector | None:
        """The injector this Guard's stages run through: its own, else the process-wide one."""
        return self.context.injector

    # -- requests ---------------------------------------------------------------------------------

    async def start(self, *, strict: bool = False) -> Guard:
        """Check the backend now (Redis) for the shared quotas, the shared breakers and token
        accounts built so far (each runs its health probe; see docs/distributed.md); returns self.
        A no-op without a ``backend``.

        Redis unreachable: they start on local state and keep probing. Redis refusing the
        configuration (a wrong password, a missing ACL permission, an untrusted TLS certificate):
        logged at ERROR, then the same, or with ``strict=True`` :class:`ConfigError` naming the
        cause (never the secret)."""
        for component in (self.quotas, *self.breakers().values(), self.context.built("tokens")):
            start = getattr(component, "start", None)
            if start is not None and getattr(component, "shared", None) is not None:
                await start(strict=strict)
        return self

    async def aclose(self) -> None:
        """Stop the background work of shared (backend) breakers and quotas; a no-op otherwise."""
        await self.context.aclose()

    def group(
        self, name: str, targets: Mapping[str, Any], *, policy: GroupPolicy | Mapping[str, Any] | None = None
    ) -> ModelGroup:
        """The model group ``name`` of the policy's ``groups`` (or ``policy``, a
        :class:`~ragguard.options.GroupPolicy` or its mapping), each deployment bound by name to
        its target in ``targets``: a wrapped OpenAI or Anthropic client (or its ``create``), a
        guarded LangChain runnable, or any callable (guarded here as the key of its deployment
        name in the group's stage). See :mod:`ragguard.groups`.

        Raises ConfigError for an unknown group, a deployment without a target or a target of
        none, or a deployment's limits its stage cannot apply."""
        if policy is None:
            found = self.policy.groups.get(name) if isinstance(name, str) else None
            if found is None:
                known = ", ".join(sorted(self.policy.groups)) or "none"
                raise ConfigError(f"no model group {name!r:.60} in the policy (its groups: {known})",
                                  field="groups")  # fmt: skip
            policy = found
        elif not isinstance(policy, GroupPolicy):
            policy = GroupPolicy.model_validate(dict(policy)) if isinstance(policy, Mapping) else policy
        if not isinstance(policy, GroupPolicy):
            raise ConfigError(f"group {name!r}: policy must be a GroupPolicy, got {type(policy).__name__}")
        if not isinstance(targets, Mapping):
            raise ConfigError(f"group {name!r}: targets must map deployment names to targets",
                              field="targets")  # fmt: skip
        group = ModelGroup(self, key_id(name), policy, targets)
        self._groups[group.name] = group
        return group

    def groups(self) -> dict[str, ModelGroup]:
        """The model groups bound on this Guard (:meth:`group`) that are still in use, by name
        (the last one bound of a name), as :meth:`status` lists them."""
        return dict(self._groups)

    def tenant(self, tenant_id: str) -> TenantContext:
        """``async with guard.tenant("acme"):`` admits one request of the tenant (see :func:`tenant`)."""
        return TenantContext(tenant_id, self.quotas, self.policy.quota(tenant_id), self.clock)

    def deadline(self, seconds: float | None, *, set_by: str = "handler") -> _deadline_block:
        """``async with guard.deadline(0.8):`` a :func:`ragguard.deadline` on this Guard's clock
        (``set_by``: what set it, as there)."""
        return _deadline_block(seconds, clock=self.clock, set_by=set_by)

    def guard(self, stage: str, **options: Any) -> GuardDecorator:
        """``@g.guard("stage", fallback=...)``: like :func:`ragguard.guard`, bound to this Guard.

        Raises ConfigError for an unknown option."""
        return cast(GuardDecorator, decorator(stage, self, options))


def default_guard() -> Guard:
    """The registry ``@guard`` and ``tenant`` use (built from ``Policy()`` until :func:`configure`)."""
    current = _default.guard
    if current is None:
        current = _default.guard = Guard()
    return current  # type: ignore[no-any-return]


def configure(
    policy: Policy | Mapping[str, Any] | str | PathLike[str] | None = None, **options: Any
) -> Guard:
    """Replace the default registry: ``policy`` is a Policy, a mapping, or a YAML/TOML/JSON path.

    ``options`` (clock, rng, sleep, quotas, backend, chaos...) go to :class:`Guard`. Breaker states
    start fresh. Raises ConfigError for an invalid policy or option.
    """
    made = _default.guard = Guard(policy_of(policy, who="configure"), **options)
    return made


def tenant(tenant_id: str) -> TenantContext:
    """``async with tenant("acme"):`` one request of tenant ``acme`` in the default registry.

    On entry the tenant's quota admits the request (concurrency slot and rate token, waiting first
    come first served up to ``max_wait_s`` or the deadline), else raises QuotaExceeded with
    ``tenant`` and ``retry_after_s``; the tenant's ``timeout_s`` becomes the deadline. A bad id
    raises InvalidInput (a ValueError). Slots are released on exit, error and cancellation.
    """
    return default_guard().tenant(tenant_id)


def guard(
    stage: str,
    *,
    fallback: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
    breaker: Any = None,
    on_context_length: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
    on_content_policy: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
    key: str | int | Callable[..., Any] | None = None,
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
      until the first item; they may be async generator functions. A fallback that declares a
      keyword-only parameter ``error`` also gets the exception it replaces (``error=``).
    - ``on_context_length``, ``on_content_policy``: fallbacks (a callable or a sequence, as
      ``fallback``) for the refusals a provider answers for the request itself, which no other
      fallback serves (they are the caller's errors): a request longer than the model's context
      window (OpenAI's ``context_length_exceeded``, Anthropic's "prompt is too long", vLLM's and
      TGI's), or one its content policy refused (see :mod:`ragguard.outcomes`). E.g. the same
      question to a model with a larger context; the generation preset's ``passages=`` tries
      fewer passages first.
    - ``key``: the stage is keyed by deployment for this function (docs/layers.md, "Keyed
      stages"): a parameter name or position whose value (a str) is the call's key, or a
      function of the call's arguments returning it (``lambda q, *, model: model``); each key
      runs with its own breaker, adaptive limit, budgets and limits under the stage's policy. A
      call whose key is not a str runs on the stage's own instance. None: the stage policy's
      ``key``, if it names one.
    - ``breaker``: a ragguard breaker or an ``aiobreaker.CircuitBreaker`` for this stage, instead
      of the one its policy builds; ``False`` for none (a step that composes guarded stages, whose
      own breakers already count their dependencies' failures).
    - the stage preset's options (see :mod:`ragguard.rag`): ``texts=`` (embedding: where the texts
      are, a position or a name, default 0), ``candidates=`` (rerank: where the candidate list is,
      default 1), ``score=`` (rerank: a reranked item's score, default its ``score``) and
      ``passages=`` (generation: where the passages are, best first, to send fewer of them when
      the model refuses the request as too long), ``continuation=`` (generation streams: a
      callable or a sequence that carries a stream cut after its first item on from what the
      caller has, given ``partial=``; see docs/generation.md).

    Raises ConfigError at decoration for a bad option, a sync generator function, a preset
    option or a key the function's signature does not have, or a key with a breaker of its own.
    At call time, raises what the call raised when no fallback serves, or BreakerOpen,
    QuotaExceeded, DeadlineExceeded, StageTimeout.
    """
    return cast(
        GuardDecorator,
        decorator(
            stage,
            default_guard,
            {
                "fallback": fallback,
                "breaker": breaker,
                "on_context_length": on_context_length,
                "on_content_policy": on_content_policy,
                "key": key,
                **preset_options,
            },
        ),
    )
