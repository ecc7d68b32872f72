"""Recording fake layers for the driver tests (imported as ``pipeline_helpers``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from ragguard.pipeline import NO_EXIT, WAIT, Call
from ragguard.pipeline._contract import repeat


def outcome_name(exc: BaseException | None) -> str | None:
    return None if exc is None else type(exc).__name__


class LogGate:
    """A gate that logs enter/exit; ``wait``: enter returns WAIT and enter_async awaits ``hold``;
    ``replace(exc) -> exc | None`` gives the error exit raises instead."""

    def __init__(
        self,
        name: str,
        log: list[Any],
        *,
        scope: str = "call",
        wait: bool = False,
        hold: anyio.Event | None = None,
        replace: Callable[[BaseException | None], BaseException | None] | None = None,
        refuse: BaseException | None = None,
    ) -> None:
        self.name = name
        self.log = log
        self.scope = scope
        self.wait = wait
        self.hold = hold
        self.replace = replace
        self.refuse = refuse

    def enter(self, call: Call) -> Any:
        self.log.append(("enter", self.name))
        if self.refuse is not None:
            raise self.refuse
        return WAIT if self.wait else f"t-{self.name}"

    async def enter_async(self, call: Call) -> Any:
        self.log.append(("enter_async", self.name))
        if self.hold is not None:
            await self.hold.wait()
        return f"ta-{self.name}"

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        self.log.append(("exit", self.name, token, outcome_name(exc)))
        return None if self.replace is None else self.replace(exc)


class NoExitGate(LogGate):
    """A gate that admits with nothing to undo (its enter answers NO_EXIT)."""

    def enter(self, call: Call) -> Any:
        self.log.append(("enter", self.name))
        return NO_EXIT


class LogRecovery:
    """A recovery that logs and then runs ``act(call, exc, again)``."""

    def __init__(
        self,
        name: str,
        log: list[Any],
        act: Callable[[Call, Exception, Callable[[], Awaitable[Any]]], Awaitable[Any]],
    ) -> None:
        self.name = name
        self.log = log
        self.act = act

    async def recover(self, call: Call, exc: Exception, again: Callable[[], Awaitable[Any]]) -> Any:
        self.log.append(("recover", self.name, outcome_name(exc)))
        return await self.act(call, exc, again)


class LogWrapper:
    def __init__(self, name: str, log: list[Any]) -> None:
        self.name = name
        self.log = log

    async def around(self, call: Call, proceed: Callable[[], Awaitable[Any]]) -> Any:
        self.log.append(("around", self.name))
        try:
            return await proceed()
        finally:
            self.log.append(("around-done", self.name))


class RetryLike(LogGate):
    """A layer that is a recovery and a gate, as the retry layer is."""

    def __init__(self, name: str, log: list[Any], times: int = 1) -> None:
        super().__init__(name, log)
        self.times = times

    async def recover(self, call: Call, exc: Exception, again: Callable[[], Awaitable[Any]]) -> Any:
        self.log.append(("recover", self.name, outcome_name(exc)))
        for _ in range(self.times - 1):
            try:
                call.attempt += 1
                return await again()
            except Exception as failed:
                self.log.append(("recover", self.name, outcome_name(failed)))
        call.attempt += 1
        return await again()


class RepeatLike(LogGate):
    """A recovery that ``repeats`` (the retry layer's shape): ``attempts`` in all, ``waits``
    logged; its ``recover`` is the loop a driver may run itself (see Recovery)."""

    repeats = True

    def __init__(self, name: str, log: list[Any], attempts: int = 3) -> None:
        super().__init__(name, log)
        self.attempts = attempts

    def next_wait(self, call: Call, exc: Exception, attempt: int) -> float | None:
        self.log.append(("next_wait", self.name, outcome_name(exc), attempt, call.attempt))
        return None if attempt >= self.attempts or isinstance(exc, KeyError) else 0.0

    async def sleep(self, seconds: float) -> None:
        self.log.append(("sleep", self.name, seconds))
        await asyncio.sleep(seconds)

    async def recover(self, call: Call, exc: Exception, again: Callable[[], Awaitable[Any]]) -> Any:
        return await repeat(self, call, exc, again)


class MaybeTokenGate(LogGate):
    """A gate whose enter returns ``token`` (NO_EXIT: nothing held, not exited)."""

    def __init__(self, name: str, log: list[Any], token: Any) -> None:
        super().__init__(name, log)
        self.token = token

    def enter(self, call: Call) -> Any:
        self.log.append(("enter", self.name))
        return self.token
