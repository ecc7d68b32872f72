"""Names of what serves a call: :func:`named` gives a fallback the name :func:`ragguard.degraded`,
the ``FallbackServed`` event and the metrics report it by."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

from ._errors import ConfigError
from ._validate import shown

__all__ = ["named"]

F = TypeVar("F", bound=Callable[..., Any])

MAX_NAME_LEN = 100


def named(name: str, fn: F) -> F:
    """``fn`` under the name ``name`` when it serves as a fallback: :func:`ragguard.degraded`,
    the ``FallbackServed`` event and the metrics report ``name`` where they would report
    ``fn.__name__`` (``<lambda>`` for a lambda, the method's name for a bound method such as
    another client's ``create``)::

        @guard("vector_store", fallback=ragguard.named("bm25", lambda query, k: bm25.search(query, k)))

    ``fn`` is called as it is, with the same arguments; what it returns (a value, a coroutine, an
    async iterator) is returned. Raises ConfigError for a name that is not 1 to 100 printable
    characters, or an ``fn`` that is not callable."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_LEN or not name.isprintable():
        raise ConfigError(f"named: name must be 1 to {MAX_NAME_LEN} printable characters, got {shown(name)}")
    if not callable(fn):
        raise ConfigError(f"named: {name!r} must name a callable, got {type(fn).__name__}")

    serve: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):  # still an ``async def`` to whoever asks

        async def serve(*args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs)
    else:

        def serve(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

    serve = functools.wraps(fn)(serve)
    serve.__name__ = serve.__qualname__ = name
    return cast(F, serve)
