"""The stage presets by name (:class:`~ragguard.layers.StagePreset`).

They register themselves here (:func:`register_preset`: the RAG presets of :mod:`ragguard.rag`
when ``ragguard`` is imported); a Guard finds a stage's preset with :func:`preset`. Kept apart from
the layers' registry (:mod:`ragguard.layers._registry`): the stages' runtime imports that one to
build its chains, and the preset contract names the runtime's classes, so only this one imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import ConfigError
from ..options import _layers as _options

if TYPE_CHECKING:
    from ._stage import StagePreset

__all__ = ["PRESETS", "preset", "register_preset"]


PRESETS: dict[str, StagePreset] = {}
"""The stage presets by name (those of :mod:`ragguard.rag` and those registered)."""


def preset(name: str | None) -> StagePreset | None:
    """The preset called ``name`` (None for None); ConfigError naming the known ones otherwise."""
    if name is None:
        return None
    found = PRESETS.get(name)
    if found is None:
        raise ConfigError(f"unknown stage preset {name!r:.60}; known: {', '.join(sorted(PRESETS))}")
    return found


def register_preset(new: StagePreset) -> None:
    """Add ``new`` to the registry under ``new.name`` (replacing one of that name): stage policies
    may name it (``StagePolicy.preset``). ConfigError when ``new`` lacks part of the contract."""
    needed = ("name", "streams", "option_names", "resolve", "state", "layers", "attempt_layers", "fallbacks")
    for attr in needed:
        if not hasattr(new, attr):
            raise ConfigError(f"register_preset: {type(new).__name__} has no {attr!r} (see StagePreset)")
    if not isinstance(new.name, str) or not new.name:
        raise ConfigError(f"register_preset: name must be a non-empty str, got {new.name!r:.40}")
    PRESETS[new.name] = new
    _options.add_preset(new.name)  # stage policies may name it
