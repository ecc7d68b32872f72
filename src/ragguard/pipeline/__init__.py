"""The layer contract and the drivers that run a stage's chain of layers.

See :mod:`ragguard.pipeline._contract` for the three shapes of a layer (Gate, Recovery, Wrapper)
and :mod:`ragguard.pipeline._drivers` for how a chain runs a call and a stream. The layers
themselves live in :mod:`ragguard.layers`, one file each.
"""

from ._build import Backend, BuildContext
from ._contract import NO_EXIT, WAIT, Call, Gate, Layer, Recovery, Scope, Wrapper

__all__ = [
    "NO_EXIT",
    "WAIT",
    "Backend",
    "BuildContext",
    "Call",
    "Gate",
    "Layer",
    "Recovery",
    "Scope",
    "Wrapper",
]
