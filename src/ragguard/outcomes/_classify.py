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
The classifiers that apply to an exception class are found once per class and remembered. A Guard
built with a classifier of its own (``Guard(classifier=...)``) classifies with
:func:`classify_with`: its classifier is asked at step 3, ahead of the registered ones.

A guarded call's chain classifies each error once, with its Guard's classifier, and records the
answer on the call record for its layers and on the error itself (:func:`outcome_of` reads it:
the breakers' classifiers, the stated wait, and both front doors, which see only the error). An
error that carries an answer is not classified again, by that chain or one further out.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from functools import partial
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
    "RECORDED",
    "SUCCESS",
    "UNKNOWN",
    "OutcomeClassifier",
    "classify",
    "classify_with",
    "kind_of",
    "outcome_of",
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

_PLAIN: dict[type[BaseException], Outcome] = {
    cls: outcome
    for cls, outcome in _OWN.items()
    if outcome.retry_after_s is None and not hasattr(cls, "retry_after_s")
}
"""The types of :data:`_OWN` whose outcome an error of exactly that type has unless it carries a
``retry_after_s`` of its own (the standard library's failures; ragguard's refusals carry one)."""


def plain_outcomes(classifier: Callable[[BaseException], Outcome]) -> dict[type[BaseException], Outcome]:
    """What ``classifier`` answers for an error of one of these exact types that carries no
    attribute of its own (an empty ``__dict__``): ragguard's :func:`classify`, or a Guard's
    (:func:`classify_with`), asks nothing else about them; empty for any other classifier.
    The failure path's one look-up (:mod:`ragguard.pipeline._compiled`)."""
    ours = classifier is classify or (isinstance(classifier, partial) and classifier.func is _classify)
    return _PLAIN if ours else {}


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
    return _classify(exc, None)


def classify_with(first: OutcomeClassifier) -> Callable[[BaseException | None], Outcome]:
    """A :func:`classify` that asks ``first`` (``exc -> Outcome | None``) about every error after
    ragguard's own errors and before the registered and built-in classifiers (a Guard's own
    classifier: ``Guard(classifier=...)``). Never raises: a ``first`` that raises is logged and
    skipped. Raises :class:`~ragguard.ConfigError` when ``first`` is not callable."""
    if not callable(first):
        raise _ConfigError(
            f"classifier must be a callable exc -> Outcome | None, got {type(first).__name__}",
            field="classifier",
        )
    return partial(_classify, first=first)


def _classify(exc: BaseException | None, first: OutcomeClassifier | None) -> Outcome:
    if exc is None:
        return SUCCESS
    if not isinstance(exc, Exception):
        return CANCELLED
    outcome = _OWN.get(type(exc)) or _deep(exc, 0, first)
    if outcome.retry_after_s is None and getattr(exc, "retry_after_s", None) is not None:
        return _stated(exc, outcome)  # an error that carries its wait itself (ragguard's refusals)
    return outcome


def _stated(exc: BaseException, outcome: Outcome) -> Outcome:
    """``outcome``, with the wait ``exc`` carries itself (ragguard's refusals, a user's error with
    a ``retry_after_s`` attribute)."""
    stated = clamp_wait(getattr(exc, "retry_after_s", None))
    return outcome if stated is None else replace(outcome, retry_after_s=stated)


RECORDED = "_ragguard_outcome"
"""The attribute of an error that holds the :class:`Outcome` a guarded call's chain gave it."""


def outcome_of(
    exc: BaseException | None, classify: Callable[[BaseException], Outcome] | None = None
) -> Outcome:
    """The outcome of ``exc`` as the guarded call it came out of classified it: the answer of that
    call's Guard (its own classifier, if it has one), which its chain recorded on the error; else
    ``classify``'s (:func:`ragguard.outcomes.classify` unless given). What a breaker's classifier, a
    front door or your own breaker reads, so each agrees with the layers of the call about it.
    Never raises.

    An error is classified once: by the chain of the first guarded call it leaves; a guarded call
    further out (of the same Guard or another) and the front doors read that answer."""
    if exc is None:
        return SUCCESS
    recorded = getattr(exc, RECORDED, None)
    if type(recorded) is Outcome:
        return recorded
    return _classify(exc, None) if classify is None else classify(exc)


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
    return _deep(exc, 0, None).kind


def _deep(exc: BaseException, depth: int, first: OutcomeClassifier | None) -> Outcome:
    found = _one(exc, first)
    if found is not None:
        return found
    if depth >= _MAX_DEPTH:
        return UNKNOWN
    if isinstance(exc, BaseExceptionGroup):
        return _group(exc, depth, first)
    cause = exc.__cause__
    if cause is not None and isinstance(cause, Exception):
        if isinstance(cause, DeadlineExceeded):
            return _DEADLINE
        return _deep(cause, depth + 1, first)
    return UNKNOWN


_GROUP_ORDER = (Kind.FAILURE, Kind.TIMEOUT, Kind.REJECTION, Kind.DEADLINE, Kind.REFUSED, Kind.CALLER_ERROR)


def _group(group: BaseExceptionGroup[Any], depth: int, first: OutcomeClassifier | None) -> Outcome:
    """The most telling outcome among a group's errors (a failure over a timeout over ...)."""
    best: Outcome | None = None
    for inner in group.exceptions:
        if not isinstance(inner, Exception):
            continue
        outcome = _deep(inner, depth + 1, first)
        if outcome.kind in _GROUP_ORDER and (
            best is None or _GROUP_ORDER.index(outcome.kind) < _GROUP_ORDER.index(best.kind)
        ):
            best = outcome
    return best if best is not None else UNKNOWN


def _one(exc: BaseException, first: OutcomeClassifier | None) -> Outcome | None:
    own = _own(exc)
    if own is not None:
        return own
    if first is not None:
        try:
            outcome = first(exc)
        except Exception:
            log.exception("the Guard's outcome classifier %r raised on %r; it is skipped", first, type(exc))
        else:
            if outcome is not None:
                return outcome
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
