"""docs/integrations.md's LiteLLM Router recipe, run as the page shows it, with a stand-in Router.

``litellm`` is never installed (one of its releases was compromised). The stand-in keeps to what
the recipe relies on: ``acompletion(model=..., stream=True, ...)`` picks a deployment that is not
cooling down, calls it through the real ``openai`` SDK (as LiteLLM's OpenAI provider does),
cools a deployment down after a failure, raises the Router's ``RouterRateLimitError`` when every
deployment is cooling down, and raises errors as LiteLLM's classes: their names, modules, bases
(the OpenAI SDK's) and attributes as LiteLLM's source (``litellm/exceptions.py``,
``litellm/types/router.py``) defines them. What this proves and does not: docs/integrations.md.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from _door import Sleeps

import ragguard
from ragguard import FakeClock, GenerationPolicy, Policy, RetryPolicy, StagePolicy, TenantQuota
from ragguard.outcomes import Kind, classify
from ragguard.rag import token_accounts
from wire import Fault, OpenAIWire

pytestmark = pytest.mark.anyio

DOC = Path(__file__).parents[2] / "docs" / "integrations.md"


def _recipe() -> str:
    text = DOC.read_text()
    marker = text.index("<!-- the block below is executed by tests/integrations/test_litellm_recipe.py -->")
    block = re.search(r"```python\n(.*?)```", text[marker:], re.S)
    assert block is not None
    return block.group(1)


# -- LiteLLM's exception classes, as its source declares them -------------------------------------


def _litellm_error(name: str, base: type[BaseException], status: int) -> type[BaseException]:
    def __init__(self: Any, message: str, llm_provider: str, model: str, response: Any = None) -> None:
        self.status_code = status
        self.message = f"litellm.{name}: {message}"
        self.llm_provider = llm_provider
        self.model = model
        self.response = httpx.Response(status, request=httpx.Request("POST", "https://litellm.ai"))
        base.__init__(self, self.message, response=self.response, body=None)  # type: ignore[call-arg]

    return type(name, (base,), {"__init__": __init__, "__module__": "litellm.exceptions"})


ServiceUnavailableError = _litellm_error("ServiceUnavailableError", openai.APIStatusError, 503)
RateLimitError = _litellm_error("RateLimitError", openai.RateLimitError, 429)


class APIError(openai.APIError):
    """LiteLLM's APIError: an ``openai.APIError`` (no response) carrying the provider's status."""

    __module__ = "litellm.exceptions"

    def __init__(self, status_code: int, message: str, llm_provider: str, model: str) -> None:
        self.status_code = status_code
        self.message = f"litellm.APIError: {message}"
        self.llm_provider = llm_provider
        self.model = model
        request = httpx.Request(method="POST", url="https://api.openai.com/v1")
        super().__init__(self.message, request=request, body=None)  # type: ignore[arg-type]


class RouterRateLimitError(ValueError):
    __module__ = "litellm.types.router"

    def __init__(
        self, model: str, cooldown_time: float, enable_pre_call_checks: bool, cooldown_list: list[Any]
    ):
        self.model = model
        self.cooldown_time = cooldown_time
        self.enable_pre_call_checks = enable_pre_call_checks
        self.cooldown_list = cooldown_list
        super().__init__(
            f"No deployments available for selected model, Try again in {cooldown_time} seconds. "
            f"Passed model={model}. pre-call-checks={enable_pre_call_checks}, cooldown_list={cooldown_list}"
        )


class StandInRouter:
    """Deployments (base URLs of OpenAI wire servers) of one model group, each cooled down for
    ``cooldown_time`` seconds of ``clock`` after a failure (LiteLLM's ``allowed_fails=0``)."""

    def __init__(self, urls: list[str], clock: FakeClock, cooldown_time: float) -> None:
        self.sdks = [openai.AsyncOpenAI(base_url=f"{u}/v1", api_key="k", max_retries=0) for u in urls]
        self.clock = clock
        self.cooldown_time = cooldown_time
        self.cool_until = [0.0] * len(urls)
        self.calls: list[int] = []
        self.timeouts: list[Any] = []

    async def acompletion(self, *, model: str, timeout: Any = None, **request: Any) -> AsyncIterator[Any]:
        now = self.clock()
        ready = [i for i, until in enumerate(self.cool_until) if until <= now]
        if not ready:
            raise RouterRateLimitError(model, min(self.cool_until) - now, False, [])
        i = ready[0]
        self.calls.append(i)
        self.timeouts.append(timeout)
        try:
            return await self.sdks[i].chat.completions.create(model=model, timeout=timeout, **request)
        except openai.APIStatusError as exc:
            self.cool_until[i] = now + self.cooldown_time
            if exc.status_code == 429:
                raise RateLimitError(str(exc), "openai", model) from exc
            raise ServiceUnavailableError(str(exc), "openai", model) from exc

    async def close(self) -> None:
        for sdk in self.sdks:
            await sdk.close()


@pytest.fixture
async def routed(openai_wire: OpenAIWire, backup_wire: OpenAIWire) -> Any:
    """``(answer, router, clock, sleeps)``: the recipe's ``answer``, guarded by the default
    registry (a FakeClock, the sleeps recorded and the clock moved by them), over a stand-in
    Router of two deployments with a 30 s cooldown."""
    clock = FakeClock(auto_advance=False)
    sleeps = Sleeps()

    async def sleep(seconds: float) -> None:
        await sleeps(seconds)
        clock.advance(seconds)

    stage = StagePolicy(
        retry=RetryPolicy(attempts=4, initial_backoff_s=0, jitter_s=0),
        generation=GenerationPolicy(first_item_s=0.3),
    )
    ragguard.configure(
        Policy(stages={"generation": stage}, tenants={"acme": TenantQuota(token_quota=5_000)}),
        clock=clock,
        sleep=sleep,
    )
    router = StandInRouter([openai_wire.url, backup_wire.url], clock, cooldown_time=30.0)
    namespace: dict[str, Any] = {"router": router}
    exec(compile(_recipe(), str(DOC), "exec"), namespace)
    yield namespace["answer"], router, clock, sleeps
    await router.close()


ASK = [{"role": "user", "content": "hi"}]


async def _text(stream: Any) -> str:
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


def test_litellm_shaped_errors_are_classified_as_the_docs_say() -> None:
    down = ServiceUnavailableError("down", "openai", "chat")
    limited = RateLimitError("slow down", "openai", "chat")
    cooling = RouterRateLimitError("chat", 12.5, False, [])
    assert classify(down).kind is Kind.FAILURE
    assert classify(limited).kind is Kind.REJECTION
    assert classify(cooling) == ragguard.outcomes.Outcome(
        Kind.REJECTION, reached=False, retry_after_s=12.5, reason="status"
    )
    assert classify(APIError(429, "limited", "bedrock", "chat")).kind is Kind.REJECTION
    assert classify(APIError(400, "bad input", "bedrock", "chat")).kind is Kind.CALLER_ERROR
    assert classify(APIError(502, "bad gateway", "bedrock", "chat")).kind is Kind.FAILURE


async def test_the_recipes_retry_moves_to_the_deployment_that_is_not_cooling_down(
    routed: Any, openai_wire: OpenAIWire, backup_wire: OpenAIWire
) -> None:
    answer, router, _, _ = routed
    openai_wire.faults.always("chat", Fault(status=503))
    async with ragguard.tenant("acme"), ragguard.deadline(20):
        assert await _text(answer(ASK, max_tokens=100)) == "Backup answer"
    assert router.calls == [0, 1]  # one loop: ragguard's retry, the router picked the other deployment
    assert 19 < router.timeouts[0] <= 20  # the deadline left, as the recipe passes it
    assert token_accounts(ragguard.default_guard()).settled("acme") == 2  # from the usage chunk


async def test_a_cooldown_within_max_retry_after_s_is_waited_for_and_a_longer_one_is_not(
    routed: Any, openai_wire: OpenAIWire, backup_wire: OpenAIWire
) -> None:
    answer, router, _, sleeps = routed
    openai_wire.faults.push("chat", Fault(status=503))
    backup_wire.faults.push("chat", Fault(status=503))
    router.cooldown_time = 4.0
    assert await _text(answer(ASK)) == "Hello from the wire"  # both failed, then 4 s of cooldown waited
    assert router.calls == [0, 1, 0] and 4.0 in [round(w, 3) for w in sleeps.waits]
    openai_wire.faults.push("chat", Fault(status=503))
    backup_wire.faults.push("chat", Fault(status=503))
    router.cooldown_time = 60.0  # more than max_retry_after_s (10 s): no wait, the error at once
    with pytest.raises(RouterRateLimitError) as caught:
        await _text(answer(ASK))
    assert classify(caught.value).retry_after_s == pytest.approx(60.0)
    assert len(router.calls) == 5 and max(sleeps.waits) < 10


async def test_a_deployment_that_stalls_before_the_first_token_is_cut_by_the_budget_and_retried(
    routed: Any, openai_wire: OpenAIWire
) -> None:
    answer, router, clock, _ = routed
    openai_wire.faults.push("chat", Fault(stall_after=1, stall_s=5.0))

    async def stalled() -> str:
        stream = answer(ASK)
        first = await stream.__anext__()  # the first chunk: held by the stall until the budget ends
        return (first.choices[0].delta.content or "") + await _text(stream)

    task = asyncio.ensure_future(stalled())
    for _ in range(200):  # the budget's timer is the FakeClock's: move it past first_item_s
        await asyncio.sleep(0.01)
        if openai_wire.faults.seen["chat"]:
            clock.advance(0.31)
            break
    text = await asyncio.wait_for(task, 10)
    assert text == "Hello from the wire"  # retried: the router saw a cancelled call, no failure
    assert router.calls == [0, 0]
    assert openai_wire.faults.seen["chat"] == 2
