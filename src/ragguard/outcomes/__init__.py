"""What the dependency said: one classification of a call's outcome, read by every layer.

::

    from ragguard.outcomes import Kind, classify

    outcome = classify(exc)          # Outcome(kind=Kind.REJECTION, reached=True, retry_after_s=2.0, ...)

A guarded call's error is classified once, by its Guard's classifier (:func:`classify`, or
:func:`classify_with` for a Guard built with a classifier of its own), and every breaker kind, the
retry layer, the throttle, the adaptive limit, fallbacks and both front doors read that answer
(the layers on the call record, the rest with :func:`outcome_of`), so they can never disagree
about a call. The kinds (:class:`Kind`):
success; dependency failure (refused, reset, 5xx, ``UNAVAILABLE``, out of memory); dependency
rejection (429, 529, ``RESOURCE_EXHAUSTED``, an overload event inside a stream) with the wait it
stated; timeout; caller error (4xx other than 408/429, bad input, auth, not found; the reasons
``context_length`` and ``content_policy`` name the two refusals a stage may route, and
:func:`context_overflow` reads the figures a context-length refusal states);
cancelled; ragguard's own refusal (open breaker, quota, shed); the request's own deadline; and
unknown. ``Outcome.reached`` says whether the request may already have reached the dependency,
which decides whether a non-idempotent stage may retry it.

Classifiers for the clients RAG services call load only when an error of their package is seen:
httpx/httpx2/httpcore (ragguard's ``GuardTransport`` errors included), grpc (ragguard's
interceptor errors included), redis, openai, anthropic, LiteLLM, qdrant-client (REST and gRPC),
elasticsearch/elastic-transport, opensearch-py and torch's out-of-memory errors.
:func:`register_classifier` adds your own ahead of them. docs/outcomes.md has the table of what
each layer and front door does with each kind.
"""

from ._classify import classify, outcome_of, register_classifier
from ._kinds import CONTENT_POLICY, CONTEXT_LENGTH, MAX_STATED_WAIT_S, Kind, Outcome
from ._refusal import context_overflow

__all__ = [
    "CONTENT_POLICY",
    "CONTEXT_LENGTH",
    "MAX_STATED_WAIT_S",
    "Kind",
    "Outcome",
    "classify",
    "context_overflow",
    "outcome_of",
    "register_classifier",
]
