"""classify(exc): the one answer every layer and front door reads about a call's end.

Order of questions, first answer wins:

1. ``None`` is a success; anything that is not an ``Exception`` (``CancelledError``, trio's
   ``Cancelled``, ``KeyboardInterrupt``) is ``CANCELLED``;
2. ragguard's own errors (:class:`~ragguard.BreakerOpen`, :class:`~ragguard.QuotaExceeded`,
   :class:`~ragguard.Overloaded` are ``REFUSED``; :class:`~ragguard.DeadlineExceeded` is
   ``DEADLINE``, whatever it was raised from; :class:`~ragguard.StageTimeout` ``TIMEOUT``;
   :class:`~ragguard.InvalidInput` ``CALLER_ERROR``, :class:`~ragguard.Unauthenticated` and
   :class:`~ragguard.PermissionDenied` ``CALLER_ERROR`` with reason ``auth``), by one dict
   look-up of the type;
3. the classifiers users registered (:func:`register_classifier`), newest first;
4. the classifier of each client package the error's class comes from (its MRO's modules:
   httpx, grpc, redis, openai, anthropic, litellm, qdrant_client, elasticsearch, opensearchpy,
   torch...), imported the first time such an error is seen, so a package that is not installed
   costs nothing;
5. the standard library's errors (``ConnectionRefusedError``, ``TimeoutError``, ``MemoryError``,
   connection errnos, ``ValueError``/``TypeError``), then class names and messages of runtimes
   with no classifier of their own (aiohttp, psycopg, onnxruntime, tensorflow...);
6. what the error was raised from (``__cause__``) or groups (``ExceptionGroup``), a few levels
   deep; else ``UNKNOWN``.

A classifier that raises is logged and skipped: a broken classifier never decides an outcome.
The classifiers that apply to an exception class are found once per class and remembered.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .._errors import (
    BreakerOpen,
    CorruptPayload,
    DeadlineExceeded,
    EmbeddingUnavailable,
    InvalidInput,
    NoDeploymentAvailable,
    Overloaded,
    PermissionDenied,
    QuotaExceeded,
    RerankOutOfMemory,
    StageTimeout,
    StreamTimeout,
    Unauthenticated,
    VectorStoreUnavailable,
)
from .._errors import ConfigError as _ConfigError
from ._builtin import BROKEN_CONNECTION, OUT_OF_MEMORY, REFUSED_CONNECTION, TIMED_OUT, builtin
from ._kinds import Kind, Outcome, clamp_wait
from ._refusal import refined

__all__ = [
    "CANCELLED",
    "SUCCESS",
    "UNKNOWN",
    "OutcomeClassifier",
    "classify",
    "kind_of",
    "register_classifier",
    "unregister_classifier",
]

log = logging.getLogger("ragguard.outcomes")

OutcomeClassifier = Callable[[BaseException], "Outcome | None"]
"""A classifier: the :class:`Outcome` of an error it recognises, None for one it does not."""

SUCCESS = Outcome(Kind.SUCCESS)
CANCELLED = Outcome(Kind.CANCELLED, reached=True)
UNKNOWN = Outcome(Kind.UNKNOWN)
_DEADLINE = Outcome(Kind.DEADLINE)
_STAGE_TIMEOUT = Outcome(Kind.TIMEOUT, reason="stage")
_INPUT = Outcome(Kind.CALLER_ERROR, reached=False, reason="input")
_BREAKER = Outcome(Kind.REFUSED, reached=False, reason="breaker")
_QUOTA = Outcome(Kind.REFUSED, reached=False, reason="quota")
_SHED = Outcome(Kind.REFUSED, reached=False, reason="overloaded")
_AUTH = Outcome(Kind.CALLER_ERROR, reached=False, reason="auth")

_OWN: dict[type[BaseException], Outcome] = {
    BreakerOpen: _BREAKER,
    EmbeddingUnavailable: _BREAKER,
    VectorStoreUnavailable: _BREAKER,
    RerankOutOfMemory: _BREAKER,
    NoDeploymentAvailable: _BREAKER,
    QuotaExceeded: _QUOTA,
    Overloaded: _SHED,
    DeadlineExceeded: _DEADLINE,
    StageTimeout: _STAGE_TIMEOUT,
    StreamTimeout: _STAGE_TIMEOUT,
    InvalidInput: _INPUT,
    Unauthenticated: _AUTH,
    PermissionDenied: _AUTH,
    _ConfigError: _INPUT,
    CorruptPayload: _INPUT,
    # the standard library's usual failures, whose outcome their exact type says
    ConnectionRefusedError: REFUSED_CONNECTION,
    ConnectionResetError: BROKEN_CONNECTION,
    ConnectionAbortedError: BROKEN_CONNECTION,
    BrokenPipeError: BROKEN_CONNECTION,
    TimeoutError: TIMED_OUT,
    MemoryError: OUT_OF_MEMORY,
}
"""ragguard's own errors and the standard library's usual failures by exact type: the outcomes of
the failure path's usual errors in one look-up (subclasses are found by isinstance in
:func:`_own` and :func:`~ragguard.outcomes._builtin.builtin`)."""

# -- the registry -----------------------------------------------------------------------------

_users: list[OutcomeClassifier] = []
_lock = threading.Lock()

_PACKAGES: dict[str, str] = {
    "httpx": "_httpx",
    "httpcore": "_httpx",
    "httpx2": "_httpx",
    "httpcore2": "_httpx",
    "grpc": "_grpc",
    "redis": "_redis",
    "openai": "_openai",
    "anthropic": "_anthropic",
    "litellm": "_litellm",
    "qdrant_client": "_qdrant",
    "elasticsearch": "_elastic",
    "elastic_transport": "_elastic",
    "opensearchpy": "_elastic",
    "torch": "_memory",
}
"""Top-level package of an exception class -> the module of this package that classifies it.
A package's classifier runs before those of packages it builds on (openai before httpx2)."""

_ORDER = ("_litellm", "_openai", "_anthropic", "_qdrant", "_elastic", "_httpx", "_grpc", "_redis", "_memory")

_loaded: dict[str, OutcomeClassifier | None] = {}
_by_type: dict[type[BaseException], tuple[OutcomeClassifier, ...]] = {}
_MAX_TYPES = 4096
_MAX_DEPTH = 4


def register_classifier(classifier: OutcomeClassifier) -> Callable[[], None]:
    """Add ``classifier`` (``exc -> Outcome | None``) ahead of every built-in one, process-wide.

    It is asked about every error before ragguard's client classifiers (the newest registered
    first); returning None passes the error on. Returns a function that removes it again.
    Raises :class:`~ragguard.ConfigError` when ``classifier`` is not callable.
    """
    if not callable(classifier):
        raise _ConfigError(
            f"register_classifier: classifier must be a callable exc -> Outcome | None, got "
            f"{type(classifier).__name__}",
            field="classifier",
        )
    with _lock:
        _users.insert(0, classifier)
        _by_type.clear()

    def remove() -> None:
        unregister_classifier(classifier)

    return remove


def unregister_classifier(classifier: OutcomeClassifier) -> None:
    """Remove a classifier added with :func:`register_classifier` (nothing when it is not there)."""
    with _lock:
        if classifier in _users:
            _users.remove(classifier)
        _by_type.clear()


def _package_classifier(name: str) -> OutcomeClassifier | None:
    if name not in _loaded:
        try:
            module = importlib.import_module(f"{__package__}.{name}")
            _loaded[name] = module.classify
        except Exception:  # a client package too old or broken to import: name rules still apply
            log.debug("outcome classifier %s could not be loaded", name, exc_info=True)
            _loaded[name] = None
    return _loaded[name]


def _classifiers_for(cls: type[BaseException]) -> tuple[OutcomeClassifier, ...]:
    found = _by_type.get(cls)
    if found is not None:
        return found
    wanted = {
        _PACKAGES[root]
        for klass in cls.__mro__
        if (root := (klass.__module__ or "").partition(".")[0]) in _PACKAGES
    }
    chain: list[OutcomeClassifier] = list(_users)
    for name in _ORDER:
        if name in wanted:
            fn = _package_classifier(name)
            if fn is not None:
                chain.append(fn)
    found = tuple(chain)
    if len(_by_type) >= _MAX_TYPES:
        _by_type.clear()
    _by_type[cls] = found
    return found


# -- classification ---------------------------------------------------------------------------


def classify(exc: BaseException | None) -> Outcome:
    """The :class:`Outcome` of a call that raised ``exc`` (None: it returned). Never raises.

    See the module docstring for the order of questions."""
    if exc is None:
        return SUCCESS
    if not isinstance(exc, Exception):
        return CANCELLED
    outcome = _OWN.get(type(exc)) or _deep(exc, 0)
    if outcome.retry_after_s is None:
        # an error that carries the wait itself (ragguard's refusals, a user's error with a
        # ``retry_after_s`` attribute) states it
        stated = clamp_wait(getattr(exc, "retry_after_s", None))
        if stated is not None:
            return replace(outcome, retry_after_s=stated)
    return outcome


def kind_of(exc: BaseException | None) -> Kind:
    """``classify(exc).kind``, without building an outcome for ragguard's own errors (the layers'
    question on the failure path)."""
    if exc is None:
        return Kind.SUCCESS
    if not isinstance(exc, Exception):
        return Kind.CANCELLED
    own = _OWN.get(type(exc))
    if own is not None:
        return own.kind
    return _deep(exc, 0).kind


def _deep(exc: BaseException, depth: int) -> Outcome:
    found = _one(exc)
    if found is not None:
        return found
    if depth >= _MAX_DEPTH:
        return UNKNOWN
    if isinstance(exc, BaseExceptionGroup):
        return _group(exc, depth)
    cause = exc.__cause__
    if cause is not None and isinstance(cause, Exception):
        if isinstance(cause, DeadlineExceeded):
            return _DEADLINE
        return _deep(cause, depth + 1)
    return UNKNOWN


_GROUP_ORDER = (Kind.FAILURE, Kind.TIMEOUT, Kind.REJECTION, Kind.DEADLINE, Kind.REFUSED, Kind.CALLER_ERROR)


def _group(group: BaseExceptionGroup[Any], depth: int) -> Outcome:
    """The most telling outcome among a group's errors (a failure over a timeout over ...)."""
    best: Outcome | None = None
    for inner in group.exceptions:
        if not isinstance(inner, Exception):
            continue
        outcome = _deep(inner, depth + 1)
        if outcome.kind in _GROUP_ORDER and (
            best is None or _GROUP_ORDER.index(outcome.kind) < _GROUP_ORDER.index(best.kind)
        ):
            best = outcome
    return best if best is not None else UNKNOWN


def _one(exc: BaseException) -> Outcome | None:
    own = _own(exc)
    if own is not None:
        return own
    for classifier in _classifiers_for(type(exc)):
        try:
            outcome = classifier(exc)
        except Exception:
            log.exception("outcome classifier %r raised on %r; it is skipped", classifier, type(exc))
            continue
        if outcome is not None:
            return outcome
    found = builtin(exc)
    if found is not None and found.kind is Kind.CALLER_ERROR:
        # a plain ValueError may still say what a local model refused: llama-cpp-python's
        # "Requested tokens (N) exceed context window of M" is a context-length refusal
        return refined(found, exc)
    return found


def _own(exc: BaseException) -> Outcome | None:
    """ragguard's own errors, subclasses included (a user's BreakerOpen subclass...)."""
    if isinstance(exc, DeadlineExceeded):
        return _DEADLINE
    if isinstance(exc, StageTimeout):
        return _STAGE_TIMEOUT
    if isinstance(exc, BreakerOpen):
        return _BREAKER
    if isinstance(exc, QuotaExceeded):
        return _QUOTA
    if isinstance(exc, Overloaded):
        return _SHED
    if isinstance(exc, InvalidInput):
        return _INPUT
    if isinstance(exc, (Unauthenticated, PermissionDenied)):
        return _AUTH
    return None


def classify_cause(exc: BaseException) -> Outcome | None:
    """The outcome of what ``exc`` was raised from (``__cause__``, else ``__context__``), for a
    classifier that wraps another error (None when there is none or it says nothing)."""
    inner = exc.__cause__ or exc.__context__
    if inner is None or not isinstance(inner, Exception) or inner is exc:
        return None
    found = classify(inner)
    return None if found.kind is Kind.UNKNOWN else found
