"""A Claude answer streamed through the Anthropic SDK, guarded, with a fallback model.

    .venv/bin/python examples/integrations/anthropic_answer.py --base-url https://api.anthropic.com

The generation stage streams the answer under its budgets; a 529, a 429 or an
``overloaded_error`` event before the first token is retried by ragguard (the SDK's own retries
are off), then served by the smaller model; the tenant's token quota is reserved from
``max_tokens`` and the prompt's text, and settled from the stream's usage (its ``message_start``
input and ``message_delta`` output).
Needs the ``anthropic`` extra: pip install '/path/to/ragguard[anthropic]'.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import anthropic

import ragguard
from ragguard.integrations.anthropic import guard_anthropic
from ragguard.rag import token_accounts

POLICY = ragguard.Policy(
    stages={"generation_small": ragguard.StagePolicy(preset="generation")},
    tenants={"acme": ragguard.TenantQuota(token_quota=100_000)},
)


async def main(base_url: str) -> None:
    guard = ragguard.configure(POLICY)
    async with anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-local") as raw:
        small = guard_anthropic(raw, generation_stage="generation_small")

        async def smaller_model(**request: Any) -> Any:
            return await small.messages.create(**{**request, "model": "claude-small"})

        client = guard_anthropic(raw, fallback=smaller_model)
        async with ragguard.tenant("acme"), ragguard.deadline(30):
            stream = await client.messages.create(
                model="claude-large",
                max_tokens=512,
                messages=[{"role": "user", "content": "Explain Python's GIL in one paragraph."}],
                stream=True,
            )
            async with stream:
                text = "".join([e.delta.text async for e in stream if e.type == "content_block_delta"])
            print(f"answer: {text}")
            print(f"served by: {list(ragguard.degraded()) or ['claude-large']}")
        print(f"tokens settled for acme: {token_accounts(guard).settled('acme')}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="https://api.anthropic.com")
    asyncio.run(main(parser.parse_args().base_url))
