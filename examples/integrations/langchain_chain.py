"""A LangChain chain whose model step is a ragguard stage, with a fallback model that streams.

    .venv/bin/python examples/integrations/langchain_chain.py --base-url http://127.0.0.1:8000/v1

``GuardedRunnable`` runs the model step as the generation stage: ``astream`` under the stream
budgets (chunks before the first token come with it), retried or replaced by the fallback
Runnable only before the first token; ``TenantRateLimiter`` gives each tenant's model requests
its ``rate_per_s``. The model here is a small Runnable over the OpenAI SDK so the example needs
only langchain-core; with langchain-openai it is
``GuardedRunnable(ChatOpenAI(model=..., base_url=..., max_retries=0), "generation")``.
Needs the ``langchain`` and ``openai`` extras: pip install '/path/to/ragguard[langchain,openai]'.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import openai
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableGenerator

import ragguard
from ragguard.integrations.langchain import GuardedRunnable, TenantRateLimiter

POLICY = ragguard.Policy(
    stages={"generation_small": ragguard.StagePolicy(preset="generation")},
    tenants={"acme": ragguard.TenantQuota(rate_per_s=5, max_wait_s=1.0)},
)


def chat_model(sdk: openai.AsyncOpenAI, model: str, limiter: TenantRateLimiter) -> Any:
    """A streaming chat step (a prompt value in, text chunks out), as ChatOpenAI would be."""

    async def stream(prompts: AsyncIterator[Any]) -> AsyncIterator[str]:
        async for prompt in prompts:
            await limiter.aacquire()  # what a BaseChatModel does with rate_limiter=
            messages = [{"role": "user", "content": prompt.to_string()}]
            chunks = await sdk.chat.completions.create(model=model, messages=messages, stream=True)
            async for chunk in chunks:
                if chunk.choices:
                    yield chunk.choices[0].delta.content or ""

    return RunnableGenerator(stream, name=model)


async def main(base_url: str) -> None:
    ragguard.configure(POLICY)
    limiter = TenantRateLimiter()
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-local", max_retries=0) as sdk:
        small = GuardedRunnable(chat_model(sdk, "small-model", limiter), "generation_small")
        model = GuardedRunnable(chat_model(sdk, "large-model", limiter), "generation", fallback=small)
        chain = ChatPromptTemplate.from_template("Answer briefly: {question}") | model | StrOutputParser()
        async with ragguard.tenant("acme"), ragguard.deadline(20):
            parts = [part async for part in chain.astream({"question": "What is a coroutine?"})]
            print(f"answer: {''.join(parts)}")
            print(f"served by: {list(ragguard.degraded()) or ['large-model']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    asyncio.run(main(parser.parse_args().base_url))
