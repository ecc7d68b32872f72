"""The fallback layer: a chain tried in order (preset first, the user's, preset last)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from layer_helpers import Script, make_call

from ragguard import BreakerOpen, DeadlineExceeded, Guard, QuotaExceeded, degraded
from ragguard.events import FallbackServed
from ragguard.layers import Bound
from ragguard.layers._fallback import FallbackLayer, FallbackMiss, UserFallback, applies_for, build
from ragguard.outcomes import Kind, Outcome, register_classifier
from ragguard.pipeline import Call
from ragguard.testing import EventRecorder

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


class Way:
    """A fallback that records its calls and answers, misses or fails as told."""

    def __init__(self, name: str, outcome: Any) -> None:
        self.name = name
        self.outcome = outcome
        self.seen: list[Exception] = []

    async def serve(self, call: Call, exc: Exception) -> Any:
        self.seen.append(exc)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def _always(exc: BaseException, outcome: object = None) -> bool:
    return True


async def test_the_first_fallback_that_answers_serves_and_is_named() -> None:
    miss = Way("cache", FallbackMiss("not cached"))
    broken = Way("replica", ConnectionResetError("replica down too"))
    keyword = Way("keyword", ["kw hit"])
    never = Way("never", "unused")
    layer = FallbackLayer("search", (miss, broken, keyword, never), _always)
    error = ConnectionRefusedError("store down")
    again = Script("never")
    with EventRecorder() as seen:
        assert await layer.recover(make_call(), error, again) == ["kw hit"]
        await seen.settle()
    assert miss.seen == [error] and broken.seen == [error] and keyword.seen == [error]
    assert never.seen == [] and again.calls == 0  # a fallback never re-runs the call
    assert degraded() == ("keyword",)
    assert [(e.stage, e.fallback, e.cause) for e in seen.of(FallbackServed)] == [
        ("search", "keyword", "ConnectionRefusedError")
    ]


async def test_when_none_answers_the_original_error_is_raised_with_notes() -> None:
    layer = FallbackLayer(
        "search",
        (Way("cache", FallbackMiss("not cached")), Way("replica", TimeoutError("replica slow"))),
        _always,
    )
    error = ConnectionRefusedError("store down")
    with pytest.raises(ConnectionRefusedError) as raised:
        await layer.recover(make_call(), error, Script())
    assert raised.value is error
    notes = raised.value.__notes__
    assert any("'replica'" in n and "TimeoutError: replica slow" in n for n in notes)
    assert any("'cache'" in n and "not cached" in n for n in notes)
    assert degraded() == ()


async def test_a_cancellation_inside_a_fallback_is_not_a_failed_fallback() -> None:
    later = Way("later", "should not serve")
    layer = FallbackLayer("s", (Way("slow", asyncio.CancelledError()), later), _always)
    with pytest.raises(asyncio.CancelledError):
        await layer.recover(make_call(), ConnectionRefusedError(), Script())
    assert later.seen == []


async def test_user_fallbacks_get_the_calls_arguments_sync_or_async() -> None:
    def plain(q: str, *, k: int) -> str:
        return f"plain:{q}:{k}"

    async def coro(q: str, *, k: int) -> str:
        return f"coro:{q}:{k}"

    call = make_call("query", k=3)
    assert await UserFallback(plain).serve(call, ConnectionError()) == "plain:query:3"
    assert await UserFallback(coro).serve(call, ConnectionError()) == "coro:query:3"
    assert UserFallback(coro).name == "coro"


@pytest.mark.parametrize(
    ("error", "with_breaker", "on", "serves"),
    [
        (QuotaExceeded("acme", 1.0, "rate"), True, "any", False),  # a tenant over its share: never
        (BreakerOpen("b", 3.0), True, "breaker", True),
        (DeadlineExceeded("s", 1.0), True, "breaker", True),
        (ConnectionRefusedError(), True, "breaker", True),  # counted by the breaker
        (KeyError("x"), True, "breaker", False),  # not counted: the caller's problem
        (KeyError("x"), True, "any", True),
        (ValueError("bad"), False, "breaker", False),  # no breaker: a caller's mistake passes
        (RuntimeError("boom"), False, "breaker", True),
    ],
)
async def test_when_the_fallbacks_apply(error: Exception, with_breaker: bool, on: str, serves: bool) -> None:
    counts = (lambda exc: isinstance(exc, ConnectionError)) if with_breaker else None
    way = Way("w", "served")
    layer = FallbackLayer("s", (way,), applies_for(counts, on))
    if serves:
        assert await layer.recover(make_call(), error, Script()) == "served"
    else:
        with pytest.raises(type(error)):
            await layer.recover(make_call(), error, Script())
        assert way.seen == []


async def _embed(texts: list[str]) -> list[list[float]]:
    return [[1.0] for _ in texts]


async def _rerank(query: str, candidates: list[str]) -> list[str]:
    return candidates


def test_the_chain_order_is_preset_first_then_the_users_then_preset_last() -> None:
    def mine(*args: Any) -> None:
        return None

    def also(*args: Any) -> None:
        return None

    g = Guard()
    embedding = build(g.stage("embedding"), Bound("embedding", _embed, stream=False, fallbacks=(mine, also)))
    assert embedding is not None
    assert [f.name for f in embedding.fallbacks] == ["embedding_cache", "mine", "also"]
    rerank = build(g.stage("rerank"), Bound("rerank", _rerank, stream=False, fallbacks=(mine,)))
    assert rerank is not None
    assert [f.name for f in rerank.fallbacks] == ["mine", "skip_rerank"]
    assert build(g.stage("plain"), Bound("plain", _embed, stream=False)) is None  # nothing to serve


async def test_a_call_shed_by_an_overload_layer_is_served_by_the_fallback() -> None:
    from ragguard import Overloaded
    from ragguard.layers._fallback import applies_for

    applies = applies_for(lambda exc: False, "breaker")
    assert applies(Overloaded("s", 0.1, "limit"))


# -- routes: fallbacks chosen by what the provider said -------------------------------------------

TOO_LONG = ValueError("Requested tokens (9000) exceed context window of 8192")  # llama-cpp-python's


async def test_a_routed_reason_is_served_by_its_route_and_other_caller_errors_by_nothing() -> None:
    own = Way("own", "own answer")
    larger = Way("larger", "larger answer")
    never = Way("policy", "unused")
    routes = {"context_length": (larger,), "content_policy": (never,)}
    layer = FallbackLayer("generation", (own,), applies_for(None, "breaker"), routes=routes)
    assert await layer.recover(make_call(), TOO_LONG, Script("never")) == "larger answer"
    assert larger.seen == [TOO_LONG] and own.seen == [] and never.seen == []
    bad = ValueError("temperature must be <= 2")  # a caller's error with no route
    with pytest.raises(ValueError, match="temperature"):
        await layer.recover(make_call(), bad, Script("never"))
    assert own.seen == [] and larger.seen == [TOO_LONG]
    assert await layer.recover(make_call(), ConnectionRefusedError(), Script("never")) == "own answer"
    assert larger.seen == [TOO_LONG]  # a failure is the stage's own fallbacks' only


async def test_under_fallback_on_any_a_route_that_misses_hands_over_to_the_stages_own() -> None:
    own = Way("own", "own answer")
    larger = Way("larger", FallbackMiss("no larger deployment free"))
    routes = {"context_length": (larger,)}
    layer = FallbackLayer("generation", (own,), applies_for(None, "any"), routes=routes)
    assert await layer.recover(make_call(), TOO_LONG, Script("never")) == "own answer"
    assert larger.seen == own.seen == [TOO_LONG]
    assert degraded() == ("own",)


async def test_a_fallback_that_declares_error_gets_the_exception_and_a_plain_one_the_arguments() -> None:
    got: list[Any] = []

    async def fitted(question: str, *, error: BaseException) -> str:
        got.append((question, error))
        return "fitted"

    def plain(question: str, **kwargs: Any) -> str:  # **kwargs: still not asking for error
        got.append((question, kwargs))
        return "plain"

    def positional(question: str, error: Any = None) -> str:  # not keyword-only: not asked either
        got.append((question, error))
        return "positional"

    failure = ConnectionResetError("reset")
    call = make_call("why?")
    assert await UserFallback(fitted).serve(call, failure) == "fitted"
    assert await UserFallback(plain).serve(call, failure) == "plain"
    assert await UserFallback(positional).serve(call, failure) == "positional"
    assert got == [("why?", failure), ("why?", {}), ("why?", None)]
    assert call.kwargs == {}  # the call's own keywords are left as they were


async def test_a_reason_a_users_classifier_gives_is_routed_too() -> None:
    class Declined(Exception):
        """The model answered HTTP 200 with a refusal (Anthropic's stop_reason "refusal")."""

    def mine(exc: BaseException) -> Outcome | None:
        return Outcome(Kind.CALLER_ERROR, reason="content_policy") if isinstance(exc, Declined) else None

    remove = register_classifier(mine)
    try:
        g = Guard()

        @g.guard("generation", on_content_policy=lambda question: "declined, politely")
        async def ask(question: str) -> str:
            raise Declined(question)

        assert await ask("why?") == "declined, politely"
    finally:
        remove()
