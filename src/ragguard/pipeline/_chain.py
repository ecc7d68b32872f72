"""A compiled chain: the layers of one decorated function of a stage, ready to run."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from .. import outcomes
from ._contract import Call, Gate, Layer
from ._drivers import Classifier, Node, compile_chain, run_stream

__all__ = ["Chain"]


class Chain:
    """``layers`` (outermost first), put together once: ``await chain.run(call)`` drives a call,
    :meth:`stream` a stream, through the same layer objects; ``classify`` (the Guard's classifier)
    classifies each error once, for every layer.

    ``run`` is the root node's compiled driver itself (no frame of the chain's own around it:
    the guarded function awaits it directly); ``stream`` pairs the root with the item gates the
    stream driver needs."""

    __slots__ = ("_item_gates", "layers", "root", "run")

    def __init__(self, layers: Sequence[Layer], classify: Classifier = outcomes.classify) -> None:
        self.layers: tuple[Layer, ...] = tuple(layers)
        self.root: Node
        self._item_gates: tuple[Gate, ...]
        self.root, self._item_gates = compile_chain(self.layers, classify)
        self.run: Callable[[Call], Awaitable[Any]] = self.root.run
        """Run a call through the chain; returns what the call (or a fallback) returned."""

    def stream(self, call: Call) -> AsyncIterator[Any]:
        """Run the stream ``call`` through the chain: an async generator of its items."""
        return run_stream(self.root, self._item_gates, call)

    def __repr__(self) -> str:
        return "Chain(" + " > ".join(type(layer).__name__ for layer in self.layers) + ")"
