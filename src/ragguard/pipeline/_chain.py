"""A compiled chain: the layers of one decorated function of a stage, ready to run."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

from .. import outcomes
from .._endings import StreamEnding
from ._contract import Call, Gate, Layer
from ._drivers import Classifier, Node, compile_chain, run_stream

__all__ = ["Chain", "GuardedStream"]

Y = TypeVar("Y")


class GuardedStream(AsyncGenerator[Y, None]):
    """What a guarded async generator function returns: its items, as the async generator it
    replaces reads (``async for``, ``anext``, ``asend``, ``athrow``, ``aclose``,
    ``contextlib.aclosing``), and :attr:`ending` once it has ended. ``aiter(stream)`` is the
    generator inside (``async for`` reads it directly); closing either closes the stream.

    ``call`` is the stream's record (anything with ``stage`` and ``ending``: the guarded call, or
    another GuardedStream whose items ``agen`` hands on, as :func:`ragguard.asgi.primed` does)."""

    __slots__ = ("_agen", "_call")

    def __init__(self, agen: AsyncGenerator[Y, None], call: Call | GuardedStream[Any]) -> None:
        self._agen = agen
        self._call = call

    @property
    def ending(self) -> StreamEnding | None:
        """How the stream ended (:class:`ragguard.StreamEnding`: ``completed``, ``continued`` or
        ``incomplete``, with the items handed over), None while it runs or before it starts."""
        ending: StreamEnding | None = self._call.ending
        return ending

    @property
    def stage(self) -> str:
        """The stage the stream runs as."""
        return self._call.stage

    def __aiter__(self) -> AsyncGenerator[Y, None]:
        # the generator itself: `async for` then reads its items with no call of ours per item
        # (this wrapper's own __anext__ doubled the cost of reading a bare generator's item)
        return self._agen

    def __anext__(self) -> Coroutine[Any, Any, Y]:
        return self._agen.__anext__()  # the generator's own awaitable: no frame of ours per item

    def asend(self, value: None) -> Coroutine[Any, Any, Y]:
        return self._agen.asend(value)

    def athrow(
        self, typ: Any, val: Any = None, tb: TracebackType | None = None
    ) -> Coroutine[Any, Any, Y]:
        if val is None and tb is None:
            return self._agen.athrow(typ)
        return self._agen.athrow(typ, val, tb)

    def aclose(self) -> Coroutine[Any, Any, None]:
        return self._agen.aclose()

    def __repr__(self) -> str:
        return f"<GuardedStream {self._call.stage!r} ending={self._call.ending!s}>"


class Chain:
    """``layers`` (outermost first), put together once: ``await chain.run(call)`` drives a call,
    :meth:`stream` a stream, through the same layer objects; ``classify`` (the Guard's classifier)
    classifies each error once, for every layer.

    ``run`` is the root node's compiled driver itself (no frame of the chain's own around it:
    the guarded function awaits it directly); ``stream`` pairs the root with the item gates the
    stream driver needs."""

    __slots__ = ("_item_gates", "inner", "layers", "root", "run")

    def __init__(
        self, layers: Sequence[Layer], classify: Classifier = outcomes.classify, *, inner: bool = False
    ) -> None:
        self.layers: tuple[Layer, ...] = tuple(layers)
        self.inner = inner
        """A chain a layer runs inside a guarded stream of its own (a continuation's): its
        streams' endings are the outer stream's to report, not recorded in the request."""
        self.root: Node
        self._item_gates: tuple[Gate, ...]
        self.root, self._item_gates = compile_chain(self.layers, classify)
        self.run: Callable[[Call], Awaitable[Any]] = self.root.run
        """Run a call through the chain; returns what the call (or a fallback) returned."""

    def stream(self, call: Call) -> GuardedStream[Any]:
        """Run the stream ``call`` through the chain: an async generator of its items, with the
        stream's ending once it has ended (:class:`GuardedStream`)."""
        stream = run_stream(self.root, self._item_gates, call, record=not self.inner)
        return GuardedStream(stream, call)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return "Chain(" + " > ".join(type(layer).__name__ for layer in self.layers) + ")"
