"""A model group's deployments: each bound to what it calls, and to the runtime (a key of a keyed
stage) whose breaker, limits and figures say whether it may take a call.

A deployment's target is one of:

- a guarded callable that says where its calls run (``__ragguard_deployment__(model) -> (guard,
  stage, key)``, ``guard`` a function returning the Guard): a wrapped OpenAI or Anthropic
  client's ``create`` (a wrapped client itself: its ``chat.completions.create`` or
  ``messages.create``), called with the deployment's ``model``; a guarded LangChain runnable, its
  ``ainvoke`` and ``astream`` called;
- any other callable (an ``async def``, an async generator function, a plain function), which the
  group guards itself as the key ``<deployment name>`` of its stage, called with ``model=`` when
  the deployment names one and the callable takes it.

The key is declared on its stage (kept always, with the deployment's ``limits``), so the group reads
the same runtime the calls run on.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import _inject, events
from .._errors import ConfigError
from ..events import bus
from ..layers._keys import Fixed
from ..options import DeploymentPolicy
from ..pipeline import Call

if TYPE_CHECKING:
    from ..layers import Stage
    from ..pipeline._chain import Chain

__all__ = ["Deployment", "bind"]

Where = Callable[[str | None], tuple[Callable[[], Any], str, "str | None"]]
"""``target.__ragguard_deployment__``: a model -> (the Guard's getter, the stage, the key)."""

_TOKENS = (
    "deployment {name!r}: limits.tpm counts the tokens of the generation preset's streams: give stage "
    "{stage!r} the generation preset (stages: {{{stage}: {{preset: generation}}}}) and bind an async "
    "generator function, a wrapped client or a guarded runnable, or set only rpm"
)
_CLIENT_METHODS = (("chat", "completions", "create"), ("messages", "create"))


class Deployment:
    """One deployment of a group: its ``policy``, declared position ``index``, how to call it
    (:meth:`invoke`: a call; :meth:`open`: a stream) and its runtime (:meth:`runtime`).

    ``call`` and ``stream`` are the target's callables; ``model``, when set, is passed as
    ``model=`` (replacing the caller's); ``static``: the Guard its calls run in never changes
    (a plain callable's, guarded by the group's Guard)."""

    __slots__ = (
        "_cached", "_chain", "_compiled", "_declared", "_epoch", "_guard", "_key", "_stage", "call", "fn",
        "index", "model", "name", "policy", "static", "stream",
    )  # fmt: skip

    def __init__(
        self,
        policy: DeploymentPolicy,
        index: int,
        call: Callable[..., Any],
        stream: Callable[..., Any],
        where: tuple[Callable[[], Any], str, str | None],
        *,
        model: str | None,
        static: bool = False,
        fn: Callable[..., Any] | None = None,
    ) -> None:
        self.policy = policy
        self.name = policy.name
        self.index = index
        self.call = call
        self.stream = stream
        self.model = model
        self.static = static
        self.fn = fn  # a coroutine function the group guarded itself: its key's chain is run directly
        self._compiled: Callable[[], Any] | None = getattr(call, "__ragguard_compiled__", None)
        self._chain: list[Any] | None = None  # [runtime, plain chain, ...] of its key, as compiled
        self._epoch = -1
        self._guard, self._stage, self._key = where
        self._declared: dict[str, Any] = {} if policy.limits is None else {"limits": policy.limits}
        self._cached: tuple[Any, Stage] | None = None

    @property
    def context_window(self) -> int | None:
        return self.policy.context_window

    def invoke(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call the target (what it returns: a coroutine, for the targets a group takes), with
        the deployment's ``model`` over the caller's.

        A coroutine function the group guarded itself, unobserved, runs its key's chain directly:
        the guarded function's frame, its look-ups and the count of its calls left out (a
        declared key is never forgotten, so nothing needs the count; a group whose strategy
        reads it, ``least_busy`` or ``latency``, goes through the guarded function)."""
        model = self.model
        if model is not None:
            kwargs = {**kwargs, "model": model}
        fn = self.fn
        if fn is not None and not bus.active and events.tracer is None:
            entry = self._chain
            if entry is None or self._epoch != _inject.epoch or not entry[0].alive:
                entry = self._direct()
            if entry is not None:
                return entry[1].run(Call(self._stage, fn, args, kwargs))
        return self.call(*args, **kwargs)

    def _direct(self) -> list[Any] | None:
        """Its key's entry as compiled now (None: the guarded function must run it)."""
        compiled = self._compiled
        if compiled is None:
            return None
        epoch = _inject.epoch
        keyed = compiled().keyed
        entry = None if keyed is None else keyed.for_key(self._key, False)
        self._chain, self._epoch = entry, epoch
        return entry

    def chain_with(self, first: Any) -> tuple[int, Stage, Chain] | None:
        """``(epoch, runtime, chain)``: its key's chain compiled now with the layer ``first``
        outermost, for the injection ``epoch`` (None: its calls must run as :meth:`invoke` runs
        them: a target the group did not guard itself, or a key whose calls are counted by a gate)."""
        compiled = self._compiled
        if compiled is None or self.fn is None:
            return None
        epoch = _inject.epoch
        made = compiled()
        keyed = made.keyed
        entry = None if keyed is None else keyed.for_key(self._key, False)
        if entry is None or entry[3]:
            return None
        runtime = entry[0]
        return epoch, runtime, runtime.chain(made.bound, first=first)

    def open(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Start the target's stream (an async iterator, or an awaitable of one)."""
        model = self.model
        if model is None:
            return self.stream(*args, **kwargs)
        return self.stream(*args, **{**kwargs, "model": model})

    def runtime(self) -> Stage:
        """The runtime its calls run on: its key of its stage (declared there on first use, in
        the Guard its target runs in now)."""
        cached = self._cached
        if cached is not None and cached[1].alive and (self.static or cached[0] is self._guard()):
            return cached[1]
        guard = self._guard()
        root = guard.stage(self._stage)
        limits = self.policy.limits
        if limits is not None and limits.tpm is not None and not root.counts_tokens:
            field = f"{self.name}.limits.tpm"
            raise ConfigError(_TOKENS.format(name=self.name, stage=self._stage), field=field)
        key = self._key
        runtime = root if key is None else root.keyed().declare(key, **self._declared)
        self._cached = (guard, runtime)
        return runtime  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<Deployment {self.name!r} of {self._stage!r}[{self._key}]>"


def bind(guard: Any, stage: str, policy: DeploymentPolicy, index: int, target: Any) -> Deployment:
    """``policy`` bound to ``target`` (see the module docstring); ``guard`` and ``stage``: where
    a plain callable runs. ConfigError when ``target`` is not callable."""
    where_of, target = _located(target)
    model = policy.model
    if where_of is not None:
        where = where_of(model)
        if hasattr(target, "ainvoke") and hasattr(target, "astream"):  # a guarded runnable: its own model
            return Deployment(policy, index, target.ainvoke, target.astream, where, model=None)
        return Deployment(policy, index, target, target, where, model=model)
    if not callable(target):
        raise ConfigError(
            f"deployment {policy.name!r}: bind a wrapped client, its create, a guarded runnable or a "
            f"callable, got {type(target).__name__}",
            field=policy.name,
        )
    if policy.limits is not None and policy.limits.tpm is not None and not inspect.isasyncgenfunction(target):
        raise ConfigError(_TOKENS.format(name=policy.name, stage=stage), field=f"{policy.name}.limits.tpm")
    key = Fixed(policy.name)
    guarded = guard.guard(stage, key=key)(target)
    passed = model if model is not None and _takes_model(target) else None
    direct = target if inspect.iscoroutinefunction(target) else None
    return Deployment(policy, index, guarded, guarded, (lambda: guard, stage, key), model=passed, static=True,
                      fn=direct)  # fmt: skip


def _located(target: Any) -> tuple[Where | None, Any]:
    """The target's ``__ragguard_deployment__`` and the callable that has it (a wrapped client's
    generation ``create``), or (None, target)."""
    where = getattr(target, "__ragguard_deployment__", None)
    if where is not None:
        return where, target
    for path in _CLIENT_METHODS:
        found: Any = target
        for name in path:
            found = getattr(found, name, None)
            if found is None:
                break
        where = getattr(found, "__ragguard_deployment__", None)
        if where is not None:
            return where, found
    return None, target


def _takes_model(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "model" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def check_bindings(group: str, declared: list[str], given: Mapping[str, Any]) -> None:
    """ConfigError naming a declared deployment without a target, or a target of none."""
    missing = [name for name in declared if name not in given]
    extra = [name for name in given if name not in declared]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"no target bound for {', '.join(map(repr, missing[:8]))}")
        if extra:
            parts.append(f"{', '.join(map(repr, extra[:8]))} not among its deployments")
        raise ConfigError(f"group {group!r}: {'; '.join(parts)} (deployments: {', '.join(declared[:16])})",
                          field=f"groups.{group}")  # fmt: skip
