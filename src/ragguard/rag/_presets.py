"""The named stage presets of a RAG pipeline, in a registry.

A preset is what makes a stage more than its generic layers: where its arguments live, what state
its functions share, the layers and fallbacks it adds. A stage takes a preset by name from its
policy (``StagePolicy.preset``); the standard stages ``embedding``, ``vector_store`` and
``rerank`` take the preset of the same name, and any stage may name one (``preset: rerank`` for a
stage called ``rerank_v2``). Arguments are declared, never guessed from keyword names:

- ``embedding``: ``texts=`` (a position or a name, default 0) says where the texts are. Adds a
  cache filled on every success and served first on failure (``embedding_cache``).
- ``vector_store``: no options; its typed breaker, and the user's ``fallback=`` (keyword search).
- ``rerank``: ``candidates=`` (default 1, the parameter after the query) says where the candidate
  list is, ``score=`` (item -> float; default the item's ``score`` attribute or key) how to merge
  chunks. Adds chunked rerank under a learnt batch limit, then ``skip_rerank`` as the last fallback.
- ``generation``: for async generator functions (a model's answer, streamed). ``tokens=`` (item ->
  int; default :func:`~ragguard.rag.count_tokens`, characters / 4) counts an item's tokens,
  ``estimate=`` (an int, or a function of the call's arguments -> int; default the policy's
  ``generation.estimate_tokens``) what a stream reserves from its tenant's token quota,
  ``input_tokens=`` (an int, or a function of the call's arguments -> int; default 0) its input
  (prompt) tokens, ``model=`` (a parameter position or name, or a function of the call's arguments
  -> str) the model whose limits (``TenantQuota.models``) apply too, ``usage=`` (item -> int |
  Usage | None) the provider's own count of the stream's output tokens so far when an item carries
  one (an OpenAI usage chunk, an Anthropic ``message_delta``): it replaces the count (a
  :class:`~ragguard.rag.Usage`, from ``usage=`` or ``tokens=``, also gives the input tokens). Adds the
  stream budgets (first item, idle, total: ``StreamTimeout``) and the tenant's token pacing and
  quota (see :mod:`ragguard.rag._generation`). ``passages=`` (a parameter position or name: the
  retrieved passages, best first) adds the shrink, for streams and coroutine functions alike: a
  call the model refused as longer than its context window is made again with fewer passages
  (:mod:`ragguard.rag._shrink`). A coroutine function of such a stage runs the generic layers and
  the shrink only. ``continuation=`` (a callable or a sequence, each taking ``partial=``) carries
  a stream that fails after its first item on from what the caller has, ``text=`` (item -> str |
  None) reads an item's text for it, ``continue_structured=True`` lets it continue items that are
  not text (:mod:`ragguard.rag._continuation`).

:func:`ragguard.rag.register_preset` adds one (see :class:`ragguard.layers.StagePreset` for the
contract); these four register themselves when ``ragguard`` is imported.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._args import ArgRef
from .._clock import timers_of
from .._errors import ConfigError
from ..layers import Bound, Stage
from ..layers._fallback import Fallback, applies_for
from ..layers._presets import register_preset
from ..layers._timeout import build as timeout_layer
from ..outcomes import Kind, outcome_of
from ..pipeline import Layer
from ..pipeline._chain import Chain
from ..quotas import TokenAccounts
from ._cache import EmbeddingCache
from ._continuation import Continuation, ContinuationLayer, continuations, read_str
from ._counting import count_tokens, token_accounts
from ._embedding import CacheFallback, CacheTap
from ._generation import StreamBudgets, TokenMeter
from ._rerank import BatchLimiter, ChunkedRerank, SkipRerank, score_of
from ._shrink import ShrinkPassages

__all__ = ["EmbeddingPreset", "GenerationPreset", "RerankPreset", "VectorStorePreset"]


class EmbeddingPreset:
    """``embedding``: the texts' embeddings are cached on success and served from the cache first
    when the embedding call fails (``cache_size``, ``cache_ttl_s`` in the stage policy)."""

    name = "embedding"
    streams = False
    option_names = frozenset({"texts", "texts_arg"})

    def resolve(self, fn: Callable[..., Any], given: Mapping[str, Any]) -> ArgRef:
        which = given.get("texts", given.get("texts_arg"))
        return ArgRef.resolve(fn, 0 if which is None else which, "texts")

    def state(self, stage: Stage) -> EmbeddingCache | None:
        policy = stage.policy
        if policy.cache_size <= 0:
            return None
        return EmbeddingCache(max_entries=policy.cache_size, ttl_s=policy.cache_ttl_s, clock=stage.clock)

    def layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]:
        cache = stage.preset_state
        return () if cache is None else (CacheTap(cache, bound.resolved(self)),)

    def attempt_layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]:
        return ()

    def fallbacks(self, stage: Stage, bound: Bound, users: Sequence[Fallback]) -> Sequence[Fallback]:
        cache = stage.preset_state
        return tuple(users) if cache is None else (CacheFallback(cache, bound.resolved(self)), *users)


class VectorStorePreset:
    """``vector_store``: the typed breaker of its policy; fallbacks are the user's."""

    name = "vector_store"
    streams = True
    option_names: frozenset[str] = frozenset()

    def resolve(self, fn: Callable[..., Any], given: Mapping[str, Any]) -> None:
        return None

    def state(self, stage: Stage) -> None:
        return None

    def layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]:
        return ()

    def attempt_layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]:
        return ()

    def fallbacks(self, stage: Stage, bound: Bound, users: Sequence[Fallback]) -> Sequence[Fallback]:
        return tuple(users)


class _RerankOptions:
    __slots__ = ("candidates", "score")

    def __init__(self, candidates: ArgRef, score: Callable[[Any], float]) -> None:
        self.candidates = candidates
        self.score = score


class RerankPreset:
    """``rerank``: chunked rerank under a learnt batch limit (floor ``rerank_min_batch``), then
    the user's fallbacks, then ``skip_rerank``."""

    name = "rerank"
    streams = False
    option_names = frozenset({"candidates", "batch_arg", "score"})

    def resolve(self, fn: Callable[..., Any], given: Mapping[str, Any]) -> _RerankOptions:
        which = given.get("candidates", given.get("batch_arg"))
        score = given.get("score")
        if score is not None and not callable(score):
            raise ConfigError(f"score must be a function item -> float, got {type(score).__name__}")
        return _RerankOptions(
            ArgRef.resolve(fn, 1 if which is None else which, "candidates"), score or score_of
        )

    def state(self, stage: Stage) -> BatchLimiter:
        return BatchLimiter(floor=stage.policy.rerank_min_batch, clock=stage.clock)

    def layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]:
        options: _RerankOptions = bound.resolved(self)
        state, bus = stage.preset_state, stage.context.bus
        return (ChunkedRerank(stage.name, state, options.candidates, options.score, bus),)

    def attempt_layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]:
        return ()

    def fallbacks(self, stage: Stage, bound: Bound, users: Sequence[Fallback]) -> Sequence[Fallback]:
        options: _RerankOptions = bound.resolved(self)
        return (*users, SkipRerank(options.candidates))


class _GenerationOptions:
    __slots__ = (
        "continuations", "count", "estimate", "input_tokens", "model", "passages", "structured", "text",
        "usage",
    )

    def __init__(
        self,
        count: Callable[[Any], Any],
        estimate: Callable[..., Any] | None,
        input_tokens: Callable[..., Any] | None = None,
        model: ArgRef | Callable[..., Any] | None = None,
        usage: Callable[[Any], Any] | None = None,
        passages: ArgRef | None = None,
        continuations: tuple[Callable[..., Any], ...] = (),
        text: Callable[[Any], str | None] = read_str,
        structured: bool = False,
    ) -> None:
        self.count = count
        self.estimate = estimate
        self.input_tokens = input_tokens
        self.model = model
        self.usage = usage
        self.passages = passages
        self.continuations = continuations
        self.text = text
        self.structured = structured


def _per_call(value: Any, option: str, least: int) -> Callable[..., Any] | None:
    """An int option (tokens) or a function of the call's arguments, as a function (None: not given)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < least:
            raise ConfigError(f"{option} must be >= {least} (tokens), got {value}", field=option)
        return lambda *args, **kwargs: value
    if not callable(value):
        raise ConfigError(
            f"{option} must be an int (tokens) or a function of the call's arguments -> int, got "
            f"{type(value).__name__}",
            field=option,
        )
    return value  # type: ignore[no-any-return]


class _GenerationState:
    """What the functions of a generation stage share: the Guard's token accounts."""

    __slots__ = ("accounts",)

    def __init__(self, accounts: TokenAccounts) -> None:
        self.accounts = accounts


_GENERATION_OPTIONS = ("tokens", "estimate", "input_tokens", "model", "usage")
_CONTINUATION_OPTIONS = ("continuation", "text", "continue_structured")


class GenerationPreset:
    """``generation``: stream budgets (``first_item_s``, ``idle_s``, ``total_s``) and the tenant's
    token pacing and quota, for async generator functions (see the module docstring)."""

    name = "generation"
    streams = True
    counts_tokens = True  # its streams carry their estimates and usage (call.meter)
    option_names = frozenset({*_GENERATION_OPTIONS, *_CONTINUATION_OPTIONS, "passages"})

    def resolve(self, fn: Callable[..., Any], given: Mapping[str, Any]) -> _GenerationOptions:
        count = given.get("tokens")
        usage = given.get("usage")
        named = [n for n in _GENERATION_OPTIONS if given.get(n) is not None]
        if named and not inspect.isasyncgenfunction(fn):
            raise ConfigError(
                f"{'= and '.join(named)}= count a stream's tokens: they apply to async generator "
                "functions only",
                field=named[0],
            )
        for name, given_fn in (("tokens", count), ("usage", usage)):
            if given_fn is not None and not callable(given_fn):
                raise ConfigError(
                    f"{name} must be a function item -> int (tokens), got {type(given_fn).__name__}",
                    field=name,
                )
        estimate = _per_call(given.get("estimate"), "estimate", 1)
        input_tokens = _per_call(given.get("input_tokens"), "input_tokens", 0)
        model = given.get("model")
        if model is not None and not callable(model):
            model = ArgRef.resolve(fn, model, "model")
        which = given.get("passages")
        passages = None if which is None else ArgRef.resolve(fn, which, "passages")
        chosen = _GenerationOptions(count or count_tokens, estimate, input_tokens, model, usage, passages)
        _resolve_continuation(fn, given, chosen)
        return chosen

    def state(self, stage: Stage) -> _GenerationState:
        return _GenerationState(token_accounts(stage.context))

    def layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]:
        options: _GenerationOptions = bound.resolved(self)
        shrink = _shrink(stage, options.passages)
        if not bound.stream:
            return () if shrink is None else (shrink,)
        meter = _meter(stage, options, bound)
        layers: list[Layer] = [meter] if shrink is None else [meter, shrink]
        if options.continuations:
            layers.insert(0, _continuation(stage, bound, options, meter))
        return layers

    def attempt_layers(self, stage: Stage, bound: Bound) -> Sequence[Layer]:
        # inside each attempt: a first item that never comes is retried, and counted by the breaker
        if not bound.stream:
            return ()
        return (_budgets(stage),)

    def fallbacks(self, stage: Stage, bound: Bound, users: Sequence[Fallback]) -> Sequence[Fallback]:
        return tuple(users)


def _meter(stage: Stage, options: _GenerationOptions, bound: Bound) -> TokenMeter:
    state: _GenerationState = stage.preset_state
    provider = getattr(bound.fn, "__ragguard_provider__", "")
    return TokenMeter(
        stage.name,
        state.accounts,
        count=options.count,
        estimate=options.estimate,
        estimate_tokens=stage.policy.generation.estimate_tokens,
        sleep=stage.context.sleep,
        input_tokens=options.input_tokens,
        model=options.model,
        usage=options.usage,
        event_bus=stage.context.bus,
        always_estimate=stage.policy.limits is not None and stage.policy.limits.tpm is not None,
        key=stage.key or "",
        provider=provider if isinstance(provider, str) else "",
    )


def _budgets(stage: Stage) -> StreamBudgets:
    policy = stage.policy
    return StreamBudgets(
        stage.name,
        policy.generation,
        timeout_s=policy.timeout_s,
        clock=stage.clock,
        timers=timers_of(stage.clock),
        event_bus=stage.context.bus,
    )


def _resolve_continuation(
    fn: Callable[..., Any], given: Mapping[str, Any], chosen: _GenerationOptions
) -> None:
    """``continuation=``, ``text=`` and ``continue_structured=`` into ``chosen`` (ConfigError
    naming the option)."""
    named = [n for n in _CONTINUATION_OPTIONS if given.get(n) is not None]
    if not named:
        return
    if not inspect.isasyncgenfunction(fn):
        raise ConfigError(
            f"{named[0]}= carries a stream on after its first items: it applies to async generator "
            "functions only",
            field=named[0],
        )
    if given.get("continuation") is not None:
        chosen.continuations = continuations(given["continuation"], fn)
    text = given.get("text")
    if text is not None:
        if not callable(text):
            raise ConfigError(
                f"text must be a function item -> str | None, got {type(text).__name__}", field="text"
            )
        chosen.text = text
    structured = given.get("continue_structured")
    if structured is not None:
        if not isinstance(structured, bool):
            raise ConfigError(
                f"continue_structured must be True or False, got {structured!r:.40}",
                field="continue_structured",
            )
        chosen.structured = structured


def _continuation(
    stage: Stage, bound: Bound, options: _GenerationOptions, meter: TokenMeter
) -> ContinuationLayer:
    """The continuation layer of ``bound``'s streams: its continuations run under a chain of the
    stage's token meter, stream budgets and timeout (fresh budgets and a reservation of their
    own, under the request's deadline), a guarded one under its own stage's."""
    timeout = timeout_layer(stage, bound)
    layers: list[Layer] = [meter, _budgets(stage)] if timeout is None else [meter, _budgets(stage), timeout]
    classify = stage.context.classify
    chain = Chain(layers, classify, inner=True)
    counts = stage.counts if stage.breaker is not None else None
    served = applies_for(counts, stage.policy.fallback_on)

    def applies(exc: BaseException) -> bool:
        outcome = outcome_of(exc, classify)  # the chain's record (the stream driver classified it)
        return outcome.kind is not Kind.DEADLINE and served(exc, outcome)  # no time left to continue in

    return ContinuationLayer(
        stage.name,
        [Continuation(fn, chain) for fn in options.continuations],
        applies=applies,
        text=options.text,
        structured=options.structured,
        event_bus=stage.context.bus,
    )


def _shrink(stage: Stage, passages: ArgRef | None) -> ShrinkPassages | None:
    """The shrink of a function that names its passages (None: it does not, or ``max_shrinks`` 0)."""
    policy = stage.policy
    if passages is None or policy.generation.max_shrinks < 1:
        return None
    return ShrinkPassages(
        stage.name,
        passages,
        max_shrinks=policy.generation.max_shrinks,
        min_passages=policy.generation.min_passages,
        min_attempt_s=policy.min_attempt_s,
        event_bus=stage.context.bus,
    )


for _made in (EmbeddingPreset(), VectorStorePreset(), RerankPreset(), GenerationPreset()):
    register_preset(_made)  # into the core's registry: stage policies name them, stages run them
