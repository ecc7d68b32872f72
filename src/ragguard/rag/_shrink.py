"""The generation preset's shrink: a call the model refused as longer than its context window is
made again with fewer passages, the lowest-ranked dropped, until it fits.

No gateway can do this: only the RAG service knows which part of its prompt is the retrieved
passages and how they rank. The guarded function says where they are, best first
(``@guard("generation", passages="passages")``, a position or a name, as the rerank preset's
``candidates=``), and the shrink calls it again with a shorter list:

- when the refusal states the window and the request's size (OpenAI, vLLM, TGI and Anthropic do:
  :func:`ragguard.outcomes.context_overflow`), as many of the lowest-ranked passages as cover the
  overflow, each estimated at its text / 4 tokens (:func:`ragguard.rag.count_tokens`); when it
  states none, a third of them; at least one each time;
- never fewer than ``min_passages``, at most ``max_shrinks`` times a call
  (:class:`ragguard.GenerationPolicy`), and not once the request's deadline has less than the
  stage's ``min_attempt_s`` left: the refusal is then raised (and a route of the stage,
  ``on_context_length=``, may still serve it, with the passages the caller gave);
- each shrink is named in :func:`ragguard.degraded` (``"shrink: 12 -> 8 passages"``), and a call
  a shrink answered emits :class:`~ragguard.events.FallbackServed` (fallback ``shrink``).

It sits among the preset's layers: inside the fallbacks, the deadline and the tenant's quota (a
shrink takes no second slot, and a stream keeps its one token reservation), outside the retries,
the breaker and the timeout, which see each shrunk call as a call of its own. A stream is shrunk
only before its first item, as a retry would be. Only a refusal whose reason is
``context_length`` is shrunk; every other error passes as it came.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from .._args import ArgRef
from .._context import current_tenant, mark_degraded
from .._deadline import remaining
from ..events import EventBus, FallbackServed, bus
from ..outcomes import CONTEXT_LENGTH, Kind, Outcome, context_overflow, outcome_of
from ..pipeline import Call
from ._counting import count_tokens

__all__ = ["SHRINK", "ShrinkPassages", "passage_tokens"]

SHRINK = "shrink"

_TEXT_FIELDS = ("text", "page_content", "content")


def passage_tokens(passage: Any) -> int:
    """A passage's estimated tokens: its text / 4 (:func:`~ragguard.rag.count_tokens`); the text of
    a ``str``, or of a mapping's or an object's ``text``, ``page_content`` (LangChain's Document)
    or ``content`` field, else of ``str(passage)``."""
    if isinstance(passage, (str, bytes, bytearray)):
        return count_tokens(passage)
    for name in _TEXT_FIELDS:
        value = passage.get(name) if isinstance(passage, Mapping) else getattr(passage, name, None)
        if isinstance(value, str):
            return count_tokens(value)
    try:
        return count_tokens(str(passage))
    except Exception:
        return 1


class ShrinkPassages:
    """Calls ``stage``'s function again with fewer of the passages ``passages`` finds, after a
    context-length refusal (see the module docstring), as the chain classified it (``Call.outcome``)."""

    __slots__ = ("_bus", "max_shrinks", "min_attempt_s", "min_passages", "passages", "stage")

    def __init__(
        self,
        stage: str,
        passages: ArgRef,
        *,
        max_shrinks: int,
        min_passages: int,
        min_attempt_s: float = 0.0,
        event_bus: EventBus = bus,
    ) -> None:
        self.stage = stage
        self.passages = passages
        self.max_shrinks = max_shrinks
        self.min_passages = min_passages
        self.min_attempt_s = max(min_attempt_s, 0.001)
        self._bus = event_bus

    async def recover(self, call: Call, exc: Exception, again: Callable[[], Awaitable[Any]]) -> Any:
        original = call.args, call.kwargs
        shrinks = 0
        try:
            while True:
                passages = self.passages.get(call.args, call.kwargs)
                outcome = call.outcome or outcome_of(exc)
                keep = self.keep(exc, passages, outcome) if shrinks < self.max_shrinks else None
                if keep is None:
                    raise exc
                call.args, call.kwargs = self.passages.replace(*original, passages[:keep])
                shrinks += 1
                mark_degraded(f"{SHRINK}: {len(passages)} -> {keep} passages")
                try:
                    result = await again()
                except Exception as failed:
                    exc = failed
                    continue
                if (events := self._bus).active:
                    events.emit(FallbackServed(self.stage, SHRINK, current_tenant(), type(exc).__name__))
                return result
        finally:
            call.args, call.kwargs = original
            del exc  # no reference cycle between the error raised and this frame

    def keep(self, exc: BaseException, passages: Any, outcome: Outcome | None = None) -> int | None:
        """How many of ``passages`` (best first) to send after ``exc`` (whose outcome is ``outcome``;
        None: the one recorded on it); None: no shrink (not a context-length refusal, no list of
        passages, none left to drop, no time left)."""
        if outcome is None:
            outcome = outcome_of(exc)
        if outcome.kind is not Kind.CALLER_ERROR or outcome.reason != CONTEXT_LENGTH:
            return None
        if not isinstance(passages, (list, tuple)):
            return None
        n = len(passages)
        if n <= self.min_passages:
            return None
        left = remaining()
        if left is not None and left < self.min_attempt_s:
            return None
        keep = n - max(1, n // 3)
        figures = context_overflow(exc)
        if figures is not None:
            keep = _covering(passages, figures[1] - figures[0])
        keep = max(min(keep, n - 1), self.min_passages)
        return keep if keep < n else None


def _covering(passages: Sequence[Any], overflow: int) -> int:
    """How many of ``passages`` stay when the lowest-ranked are dropped until their estimated
    tokens cover ``overflow``."""
    keep, dropped = len(passages), 0
    while keep > 0 and dropped < overflow:
        keep -= 1
        dropped += passage_tokens(passages[keep])
    return keep
