"""Give an ML framework's cached accelerator memory back after an out-of-memory error.

PyTorch's caching allocator keeps the blocks a failed batch allocated; after an out-of-memory
error the next (smaller) batch the rerank preset tries can fail again on memory that is free but
still cached. :func:`release_memory_on_oom` wraps a scoring function so that, on an error ragguard
classifies as out of memory (:func:`ragguard.breakers.is_out_of_memory`), it

1. clears the locals of the error's traceback frames (:func:`traceback.clear_frames`: the
   tensors of the failed batch are referenced from there; PyTorch's FAQ, "my out of memory
   exception handler can't allocate memory", says to free them outside the ``except``),
2. empties the framework's cache: ``torch.cuda.empty_cache()`` when CUDA is initialised,
   ``torch.mps.empty_cache()`` on Apple's MPS; torch is never imported here (only used when the
   process already imported it),
3. raises the error again, so the rerank preset halves the batch and the breaker sees it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar, cast

from ..breakers import is_out_of_memory

__all__ = ["empty_framework_cache", "release_memory_on_oom"]

log = logging.getLogger("ragguard.rag")

F = TypeVar("F", bound=Callable[..., Any])


def empty_framework_cache() -> list[str]:
    """Empty the cached accelerator memory of the frameworks this process imported; returns what
    was emptied (``"cuda"``, ``"mps"``), [] when nothing was (no torch, or a CPU-only run)."""
    torch = sys.modules.get("torch")
    emptied: list[str] = []
    if torch is None:
        return emptied
    try:
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            cuda.empty_cache()
            emptied.append("cuda")
        mps = getattr(torch, "mps", None)
        backends = getattr(torch, "backends", None)
        if mps is not None and backends is not None and backends.mps.is_available():
            mps.empty_cache()
            emptied.append("mps")
    except Exception:  # emptying a cache must never hide the out-of-memory error itself
        log.warning("ragguard: emptying the framework's memory cache failed", exc_info=True)
    return emptied


def _released(exc: BaseException) -> None:
    traceback.clear_frames(exc.__traceback__)
    empty_framework_cache()


def release_memory_on_oom(fn: F) -> F:
    """``fn`` (sync or async), emptying the framework's memory cache after an out-of-memory error
    before the error propagates (see the module docstring); any other error passes untouched.

    Put it *inside* ``@guard``, so the cache is emptied in the worker thread that ran out, before
    the rerank preset retries a smaller batch::

        @guard("rerank")
        @release_memory_on_oom
        def rerank(query, candidates): ...
    """
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def released_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                if is_out_of_memory(exc):
                    _released(exc)
                raise

        return cast(F, released_async)

    @functools.wraps(fn)
    def released(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if is_out_of_memory(exc):
                _released(exc)
            raise

    return cast(F, released)
