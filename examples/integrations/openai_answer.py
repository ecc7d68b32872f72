"""An answer streamed from any OpenAI-compatible server (OpenAI, vLLM, TGI, a gateway), guarded.

    .venv/bin/python examples/integrations/openai_answer.py --base-url http://127.0.0.1:8000/v1

Embeds the question (the embedding stage: its cache answers when the provider fails), then
streams the answer (the generation stage: stream budgets, the tenant's token quota reserved from
the prompt and max_tokens and settled from the input and output tokens the server reports), under a
tenant and a deadline; every request carries the tenant in
``x-tenant-id`` and the seconds left as the SDK's timeout; the SDK itself never retries.
Needs the ``openai`` extra: pip install '/path/to/ragguard[openai]'.
"""

from __future__ import annotations

import argparse
import asyncio

import openai

import ragguard
from ragguard.integrations.openai import guard_openai
from ragguard.rag import token_accounts

POLICY = ragguard.Policy(
    stages={
        "generation": ragguard.StagePolicy(generation=ragguard.GenerationPolicy(first_item_s=10, idle_s=5))
    },
    tenants={"acme": ragguard.TenantQuota(max_concurrency=4, token_quota=50_000, timeout_s=30)},
)


async def main(base_url: str, model: str) -> None:
    guard = ragguard.configure(POLICY, tenant_header="x-tenant-id")  # every wrapped client sends it
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-local") as raw:
        client = guard_openai(raw)
        async with ragguard.tenant("acme"), ragguard.deadline(20):
            question = "What does a generator's send() do?"
            vectors = await client.embeddings.create(model=model, input=[question])
            print(f"embedded: {len(vectors.data[0].embedding)} dimensions")
            stream = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": question}], stream=True, max_tokens=256
            )
            async with stream:
                answer = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            print(f"answer: {answer}")
        print(f"tokens settled for acme: {token_accounts(guard).settled('acme')}")
        print(f"degraded: {list(ragguard.degraded()) or 'no'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="local-model")
    args = parser.parse_args()
    asyncio.run(main(args.base_url, args.model))
