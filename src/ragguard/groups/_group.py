"""A model group: one call goes to one of its deployments, picked by a strategy, and fails over to
the next within the request's deadline.

For each call (:meth:`ModelGroup.__call__`; a stream: :meth:`ModelGroup.stream`)::

    for each deployment, lowest priority first, in the strategy's order within a priority:
        skip it when its breaker is open with time left (its cooldown) or forced open
        the deadline spent: DeadlineExceeded
        call it (its key's chain: its breaker, retries, limits, timeouts)
        it answered (a stream: its first item came): that is the answer
        it failed, was rejected, timed out, was refused (breaker, limits, adaptive limit): next
        it refused the request as longer than its context window: next, among the deployments
            whose ``context_window`` holds the request (the figures the refusal states), else that
            refusal is raised (a caller's error: the request is too long for all of them)
        any other caller's error, the tenant's quota, a cancellation: raised as it is
    none answered: NoDeploymentAvailable, with the soonest time one comes back

A stream fails over only before its first item (the commit point); after it, its errors reach the
caller. Strategies (``GroupPolicy.strategy``) order the deployments of one priority: ``ordered``
(as declared), ``weighted`` (a random order drawn by weight: Efraimidis and Spirakis, "Weighted
random sampling with a reservoir", 2006: key ``u ** (1 / weight)``, highest first),
``least_busy`` (fewest calls in flight: the adaptive limiter's count when the key has one, else
its gate's), ``latency`` (lowest recent latency: the adaptive limiter's last round-trip figure,
else the key's average of its successes; a key without one first, so it gets measured).
"""

from __future__ import annotations

import inspect
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, cast

from .. import _inject, events
from .._context import current_tenant, mark_degraded
from .._deadline import current_expiry, remaining
from .._errors import BreakerOpen, DeadlineExceeded, NoDeploymentAvailable, Overloaded, QuotaExceeded
from ..events import EventBus, FailedOver, bus
from ..options import GroupPolicy
from ..outcomes import CONTEXT_LENGTH, Kind, classify, context_overflow
from ..pipeline import Call
from ._deployments import Deployment, bind, check_bindings

if TYPE_CHECKING:
    from ..layers import Stage

__all__ = ["ModelGroup"]

_OPEN_STATES = frozenset({"open", "forced_open"})
_FAILED_OVER = frozenset({Kind.FAILURE, Kind.TIMEOUT, Kind.REJECTION, Kind.REFUSED})
_EMPTY: Any = object()


class ModelGroup:
    """The deployments of group ``name`` (its :class:`~ragguard.options.GroupPolicy`), each bound
    to a target (see :mod:`ragguard.groups._deployments`); see the module docstring.

    ``await group(*args, **kwargs)`` calls one (a wrapped client's ``create`` with
    ``stream=True`` returns its opened stream: it failed over before its first token);
    ``group.stream(*args, **kwargs)`` is an async iterator of the items of one deployment's stream
    (async generator functions, guarded runnables' ``astream``); :meth:`deployments` lists them with
    their runtimes. Raises what :meth:`__call__` says."""

    def __init__(self, guard: Any, name: str, policy: GroupPolicy, targets: Mapping[str, Any]) -> None:
        check_bindings(name, [d.name for d in policy.deployments], targets)
        self.name = name
        self.policy = policy
        stage = policy.stage or name
        self.stage = stage
        bound = [bind(guard, stage, d, i, targets[d.name]) for i, d in enumerate(policy.deployments)]
        self._router = router = _Router(name, policy, bound, guard.rng, guard.context.bus)
        # what ``group.__call__`` is to whoever asks (``guard()``, LangChain's RunnableLambda ask
        # inspect.iscoroutinefunction): a coroutine function, while calling the group runs the
        # class's __call__ (Python looks special methods up on the type), which returns one.
        # setattr, not self.__dict__[...]: reading __dict__ would make every attribute slower
        setattr(self, "__call__", router.call)  # noqa: B010 - mypy refuses assigning a method
        self._run = router.run
        counted = policy.strategy in ("least_busy", "latency")
        first = router.ordered[0]
        self._quick: _Quick | None = None  # the ordered strategy's first choice's chain (see __call__)
        if router.fixed_order is not None and first.fn is not None:
            self._quick = _Quick(-1, first.runtime(), None, stage, first.fn, first.model)
        for deployment in bound:
            runtime = deployment.runtime()  # declared now: a bad limit fails here, and status lists it
            if policy.strategy == "latency" and not runtime.timed:
                runtime.timed = True
                _inject.epoch += 1  # chains compiled for the key before: rebuilt with its timing gate
            if counted:
                deployment.fn = None  # through the guarded function, which counts the calls

    def deployments(self) -> list[tuple[str, Stage]]:
        """``(name, runtime)`` of each deployment, in declared priority order."""
        return [(d.name, d.runtime()) for d in self._router.ordered]

    # -- calls and streams -------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """The answer of the first deployment that answers (see the module docstring): a
        coroutine (``await group(...)``).

        Raises NoDeploymentAvailable (every deployment out: ``retry_after_s``, ``out``),
        DeadlineExceeded, a context-length refusal none of the larger deployments could take, or
        a deployment's caller's error as it is.

        The ``ordered`` strategy's first choice, a coroutine function the group guarded itself,
        unobserved: the coroutine is its key's chain itself, whose outermost layer hands a
        failure to the failover loop (:class:`_Failover`), so the group adds no frame of its own."""
        quick = self._quick
        if quick is not None:
            if quick.epoch != _inject.epoch or not quick.runtime.alive:
                quick = self._requick(quick)
            run = quick.run
            if run is not None and not bus.active and events.tracer is None:
                model = quick.model
                if model is None:
                    return run(Call(quick.stage, quick.fn, args, kwargs))
                if "model" not in kwargs:  # kwargs is this call's own dict
                    kwargs["model"] = model
                    return run(Call(quick.stage, quick.fn, args, kwargs))
        return self._run(args, kwargs)

    async def create(self, *args: Any, **kwargs: Any) -> Any:
        """``await group.create(...)``: a call to the group, as a client's ``create`` is called;
        a coroutine function to whoever asks (``inspect.iscoroutinefunction``), and so is
        ``group.__call__`` (see ``__init__``)."""
        return await self(*args, **kwargs)

    def _requick(self, stale: _Quick) -> _Quick:
        """The first choice's chain with the failover layer, compiled anew (the injection epoch
        moved, or its key was forgotten); ``run`` None: the router runs its calls."""
        router = self._router
        first = router.ordered[0]
        model = first.model
        made = first.chain_with(_Failover(router, model is not None))
        if made is None:
            quick = _Quick(_inject.epoch, first.runtime(), None, stale.stage, stale.fn, model)
        else:
            epoch, runtime, chain = made
            run = cast(Callable[[Call], Coroutine[Any, Any, Any]], chain.run)  # an ``async def``'s
            quick = _Quick(epoch, runtime, run, stale.stage, stale.fn, model)
        self._quick = quick
        return quick

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        """The items of the first deployment whose stream gives its first item (failing over
        before it only); raises as :meth:`__call__`, and after the first item what the stream
        raises. An async generator: closing it (``aclose()``, ``contextlib.aclosing``) closes the
        deployment's stream there and then."""
        router = self._router
        items, first = await router.serve(args, kwargs, _open, router.fixed_order or router.order())
        try:
            if first is _EMPTY:
                return
            yield first
            async for item in items:
                yield item
        finally:
            await _close(items)

    def __repr__(self) -> str:
        router = self._router
        return f"<ModelGroup {self.name!r} {router.strategy} {[d.name for d in router.ordered]}>"


class _Router:
    """Group ``name``'s deployments in order and its failover loop: what a call needs, and no
    reference to the :class:`ModelGroup` (the chain of its first choice holds the router through
    :class:`_Failover`: a group no longer used is freed at once, as :meth:`Guard.groups
    <ragguard.Guard.groups>` expects)."""

    def __init__(
        self, name: str, policy: GroupPolicy, bound: list[Deployment], rng: random.Random, bus: EventBus
    ) -> None:
        self.name = name
        self.rng = rng
        self.bus = bus
        self.tiers = _tiers(bound)
        self.ordered = [d for tier in self.tiers for d in tier]
        self.strategy = policy.strategy
        self.fixed_order = self.ordered if policy.strategy == "ordered" else None
        self.max_tries = policy.max_tries or len(bound)

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        """A call to the group (``group.__call__`` to whoever asks: see ``ModelGroup.__init__``)."""
        return await self.run(args, kwargs)

    async def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        order = self.fixed_order or self.order()
        try:  # the common case, inline: the first answers (an open breaker refuses without a call)
            return await order[0].invoke(args, kwargs)
        except Exception as exc:
            return await self.serve(args, kwargs, _call, order, exc)

    async def serve(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        run: Callable[[Deployment, tuple[Any, ...], dict[str, Any]], Awaitable[Any]],
        order: list[Deployment],
        failed: Exception | None = None,
    ) -> Any:
        """Try ``order``'s deployments in turn (``failed``: the first's error, tried inline).
        Each deployment left is said (:class:`~ragguard.events.FailedOver`) when the call ends."""
        out: dict[str, str] = {}
        errors: dict[str, str] = {}  # deployment -> the class name of its error
        answered = ""
        soonest: float | None = None
        last: Exception | None = None
        refusal: Exception | None = None
        need: int | None = None  # the context window a deployment needs (a refusal said so)
        tried = 0
        try:
            for deployment in order:
                if tried >= self.max_tries:
                    break
                tried += 1
                if failed is None:
                    if need is not None:
                        window = deployment.context_window
                        if window is None or window < need:
                            tried -= 1
                            continue
                    back = _closed_for(deployment.runtime())
                    if back is not None:
                        tried -= 1
                        out[deployment.name] = "open"
                        soonest = _sooner(soonest, back)
                        continue
                    left = remaining()
                    if left is not None and left <= 0.0:
                        spent = "spent before a deployment answered"
                        expiry = current_expiry()
                        by = None if expiry is None else expiry.set_by
                        whole = None if expiry is None else expiry.budget_s
                        raise DeadlineExceeded(self.name, None, spent, whole, set_by=by) from last
                    try:
                        result = await run(deployment, args, kwargs)
                    except Exception as exc:
                        failed = exc
                    else:
                        if out:
                            mark_degraded(f"{self.name}/{deployment.name}")
                            answered = deployment.name
                        return result
                error, failed = failed, None
                verdict = self.judge(error, deployment, out)
                if verdict is None:
                    raise error
                errors[deployment.name] = type(error).__name__
                last = error
                wait, needed = verdict
                if needed is not None:
                    refusal, need = error, needed
                soonest = _sooner(soonest, wait)
            if refusal is not None and not any(r != CONTEXT_LENGTH for r in out.values()):
                raise refusal  # no deployment could take a request this long
            raise NoDeploymentAvailable(self.name, soonest, out=out) from last
        finally:
            if out and self.bus.active:
                self.said(out, errors, answered)

    def said(self, out: dict[str, str], errors: dict[str, str], answered: str) -> None:
        """A :class:`~ragguard.events.FailedOver` per deployment ``out`` names."""
        tenant = current_tenant()
        named = {d.name: d for d in self.ordered}
        for left, reason in out.items():  # in the order they were left
            deployment = named[left]
            breaker = deployment.runtime().breaker
            name = "" if breaker is None else str(getattr(breaker, "name", ""))
            self.bus.emit(FailedOver(self.name, deployment.name, reason, answered,
                                     errors.get(deployment.name, ""), name, tenant))  # fmt: skip

    @staticmethod
    def judge(
        exc: Exception, deployment: Deployment, out: dict[str, str]
    ) -> tuple[float | None, int | None] | None:
        """What ``deployment``'s failure ``exc`` means for the call: None to raise it, else (when
        it comes back, the context window the next one needs or None); ``out`` says why it is out."""
        outcome = classify(exc)
        if outcome.kind is Kind.CALLER_ERROR and outcome.reason == CONTEXT_LENGTH:
            out[deployment.name] = CONTEXT_LENGTH
            return None, _needed(exc, deployment)
        runtime = deployment.runtime()
        if not _fails_over(exc, outcome.kind, runtime):
            return None
        out[deployment.name] = _why(exc, outcome.kind)
        return _comes_back(outcome.retry_after_s, runtime), None

    def order(self) -> list[Deployment]:
        strategy = self.strategy
        if strategy == "ordered":
            return self.ordered
        rng = self.rng
        ordered: list[Deployment] = []
        for tier in self.tiers:
            if len(tier) == 1:
                ordered.append(tier[0])
            elif strategy == "weighted":
                ordered += sorted(tier, key=lambda d: -(rng.random() ** (1.0 / d.policy.weight)))
            elif strategy == "least_busy":
                ordered += sorted(tier, key=lambda d: _in_flight(d.runtime()))
            else:
                ordered += sorted(tier, key=lambda d: _latency(d.runtime()))
        return ordered


class _Quick:
    """How :meth:`ModelGroup.__call__` runs its first choice's calls while the injection
    ``epoch`` holds and its key's ``runtime`` is alive: ``run`` (its chain's, None for the
    failover loop's way), with ``Call(stage, fn, args, kwargs)``, ``model`` put in ``kwargs``."""

    __slots__ = ("epoch", "fn", "model", "run", "runtime", "stage")

    def __init__(
        self,
        epoch: int,
        runtime: Stage,
        run: Callable[[Call], Coroutine[Any, Any, Any]] | None,
        stage: str,
        fn: Callable[..., Any],
        model: str | None,
    ) -> None:
        self.epoch = epoch
        self.runtime = runtime
        self.run = run
        self.stage = stage
        self.fn = fn
        self.model = model


class _Failover:
    """The outermost layer (a recovery) of the chain :meth:`ModelGroup.__call__` runs its first
    choice on: the chain's failure goes to the group's failover loop, as the first deployment's
    failure (``put_model``: the deployment put its ``model`` in the call's kwargs, taken out for
    the next ones, which put their own)."""

    __slots__ = ("put_model", "router")

    def __init__(self, router: _Router, put_model: bool) -> None:
        self.router = router
        self.put_model = put_model

    def recover(
        self, call: Call, exc: Exception, again: Callable[[], Awaitable[Any]]
    ) -> Coroutine[Any, Any, Any]:
        kwargs = call.kwargs
        if self.put_model:
            kwargs = {name: value for name, value in kwargs.items() if name != "model"}
        router = self.router
        return router.serve(call.args, kwargs, _call, router.ordered, exc)


def _tiers(deployments: list[Deployment]) -> list[list[Deployment]]:
    tiers: dict[int, list[Deployment]] = {}
    for d in sorted(deployments, key=lambda d: (d.policy.priority, d.index)):
        tiers.setdefault(d.policy.priority, []).append(d)
    return list(tiers.values())


async def _call(deployment: Deployment, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return await deployment.invoke(args, kwargs)


async def _open(deployment: Deployment, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """The deployment's stream, opened up to its first item (the commit point)."""
    produced = deployment.open(args, kwargs)
    if inspect.isawaitable(produced):
        produced = await produced
    items = produced.__aiter__()
    try:
        first = await items.__anext__()
    except StopAsyncIteration:
        return items, _EMPTY
    except BaseException:
        await _close(items)
        raise
    return items, first


async def _close(items: Any) -> None:
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()


def _closed_for(runtime: Stage) -> float | None:
    """Seconds the runtime's breaker keeps it out (its cooldown), None when it may take a call
    (closed, half-open, or open with its time up: the next call is its trial)."""
    breaker = runtime.breaker
    if breaker is None:
        return None
    state = getattr(breaker.state, "value", breaker.state)
    if state not in _OPEN_STATES:
        return None
    left = getattr(breaker, "retry_after_s", None)
    if state == "forced_open":
        return float("inf")
    return left if isinstance(left, (int, float)) and left > 0 else None


def _fails_over(exc: Exception, kind: Kind, runtime: Stage) -> bool:
    if isinstance(exc, QuotaExceeded):
        return False  # the tenant's own share: no other deployment changes it
    if kind in _FAILED_OVER:
        return True
    return kind is Kind.UNKNOWN and bool(runtime.counts(exc))


def _why(exc: Exception, kind: Kind) -> str:
    if isinstance(exc, BreakerOpen):
        return "open"
    if isinstance(exc, Overloaded):
        return "limits" if exc.reason in ("requests", "tokens") else "overloaded"
    return "failure" if kind is Kind.UNKNOWN else kind.value


def _comes_back(stated: float | None, runtime: Stage) -> float | None:
    """When a deployment that just failed takes calls again: the wait it stated, else the time
    its breaker stays open, else unknown (None)."""
    if stated is not None:
        return stated
    closed = _closed_for(runtime)
    return None if closed is None or closed == float("inf") else closed


def _sooner(a: float | None, b: float | None) -> float | None:
    if b is None or b == float("inf"):
        return a
    return b if a is None or b < a else a


def _needed(exc: Exception, deployment: Deployment) -> int:
    """The context window a request refused as too long needs: the size the refusal states, else
    more than the refusing deployment's window."""
    figures = context_overflow(exc)
    if figures is not None:
        return figures[1]
    window = deployment.context_window
    return 1 if window is None else window + 1


def _in_flight(runtime: Stage) -> int:
    limiter = runtime.parts().get("limiter")
    return int(limiter.in_flight) if limiter is not None else runtime.in_flight


def _latency(runtime: Stage) -> float:
    limiter = runtime.parts().get("limiter")
    figure = getattr(getattr(limiter, "gradient", None), "last_rtt", None) or runtime.latency_s
    return 0.0 if figure is None else float(figure)
