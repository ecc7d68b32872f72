"""Where an argument of a guarded function lives: declared, then found by position or name."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ._errors import ConfigError

__all__ = ["MISSING", "ArgRef"]

MISSING: Any = object()
"""What :meth:`ArgRef.get` returns when the call did not pass the argument."""

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class ArgRef:
    """One parameter of a function, resolved once from its signature: ``position`` among the
    positional parameters (None for keyword-only) and ``name`` (None for positional-only), so the
    argument is found whether the caller passed it by position or by keyword."""

    __slots__ = ("name", "position")

    def __init__(self, position: int | None, name: str | None) -> None:
        self.position = position
        self.name = name

    @classmethod
    def resolve(cls, fn: Callable[..., Any], which: int | str, option: str) -> ArgRef:
        """The parameter ``which`` (a position among the positional parameters, or a name) of
        ``fn``. Raises ConfigError naming ``option`` when ``fn`` has no such parameter."""
        if isinstance(which, bool) or not isinstance(which, (int, str)):
            raise ConfigError(f"{option} must be a parameter position (int) or name (str), got {which!r:.40}")
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # no signature (a builtin): trust a position, refuse a name
            if isinstance(which, int) and which >= 0:
                return cls(which, None)
            raise ConfigError(f"{option}={which!r:.40}: cannot read the signature of {fn!r:.60}") from None
        positional = [p for p in params if p.kind in _POSITIONAL]
        if isinstance(which, int):
            if not 0 <= which < len(positional):
                raise ConfigError(
                    f"{option}={which}: {getattr(fn, '__qualname__', fn)!r:.60} has "
                    f"{len(positional)} positional parameter(s); name the parameter instead"
                )
            p = positional[which]
            return cls(which, None if p.kind is inspect.Parameter.POSITIONAL_ONLY else p.name)
        for i, p in enumerate(positional):
            if p.name == which:
                return cls(i, None if p.kind is inspect.Parameter.POSITIONAL_ONLY else p.name)
        if any(p.name == which and p.kind is inspect.Parameter.KEYWORD_ONLY for p in params) or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params
        ):
            return cls(None, which)
        names = ", ".join(p.name for p in params)
        raise ConfigError(f"{option}={which!r:.40}: no such parameter (the function takes: {names:.200})")

    def get(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """The argument in this call, or :data:`MISSING`."""
        position = self.position
        if position is not None and position < len(args):
            return args[position]
        if self.name is not None:
            return kwargs.get(self.name, MISSING)
        return MISSING

    def replace(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], value: Any
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``args``, ``kwargs`` with this argument set to ``value`` (new objects; the caller's stay)."""
        position = self.position
        if position is not None and position < len(args):
            return (*args[:position], value, *args[position + 1 :]), kwargs
        return args, {**kwargs, str(self.name): value}

    def __repr__(self) -> str:
        return f"ArgRef(position={self.position}, name={self.name!r})"
