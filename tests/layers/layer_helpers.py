"""Fakes for driving one layer directly (imported as ``layer_helpers``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ragguard import Guard, Policy, StagePolicy
from ragguard.layers import Bound, Stage
from ragguard.pipeline import Call


async def _never(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - a Call needs an fn
    raise AssertionError("the layer under test must not call the function itself")


def make_call(
    *args: Any, stage: str = "s", fn: Callable[..., Any] = _never, stream: bool = False, **kwargs: Any
) -> Call:
    return Call(stage, fn, args, kwargs, stream)


class Script:
    """A fake ``proceed``/``again``: each call takes the next outcome (an exception instance is
    raised, anything else returned) and records the call's arguments at that moment."""

    def __init__(self, *outcomes: Any, call: Call | None = None) -> None:
        self.outcomes = list(outcomes)
        self.call = call
        self.seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    @property
    def calls(self) -> int:
        return len(self.seen)

    async def __call__(self) -> Any:
        if self.call is not None:
            self.seen.append((self.call.args, dict(self.call.kwargs)))
        else:
            self.seen.append(((), {}))
        if not self.outcomes:
            raise AssertionError("called more often than scripted")
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        if callable(outcome):
            return await outcome()
        return outcome


def stage_of(
    guard: Guard,
    name: str,
    fn: Callable[..., Any] = _never,
    *,
    stream: bool = False,
    fallbacks: tuple[Callable[..., Any], ...] = (),
    **options: Any,
) -> tuple[Stage, Bound]:
    """Guard ``guard``'s stage ``name`` and a Bound for ``fn`` (what a layer's ``build`` takes)."""
    return guard.stage(name), Bound(name, fn, stream=stream, fallbacks=fallbacks, options=options)


def guard_with(clock: Any = None, **stages: StagePolicy) -> Guard:
    options: dict[str, Any] = {}
    if clock is not None:
        options["clock"] = clock
    return Guard(Policy(stages=dict(stages)), **options)
