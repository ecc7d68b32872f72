"""Recipe: a sentence-transformers CrossEncoder as the guarded rerank stage (docs/sync.md).

``CrossEncoder.predict`` is a sync call that holds the GIL-free part of its work in torch: guarded
as a plain ``def``, it runs in a worker thread (the event loop keeps serving), chunked on an
out-of-memory error by the rerank preset (every candidate still scored), with the framework's
cached memory emptied after each out-of-memory error, and falls back to the retrieval order when
even the smallest batch does not fit.

Needs torch and sentence-transformers (not ragguard's dependencies)::

    python examples/crossencoder_rerank.py --model cross-encoder/ms-marco-MiniLM-L6-v2
    python examples/crossencoder_rerank.py              # a tiny random model built locally
    python examples/crossencoder_rerank.py --max-batch 6  # pretend the GPU fits 6 pairs

``--max-batch N`` makes a batch of more than N pairs ask torch for an allocation no machine has,
so torch's own allocator raises its real out-of-memory error on a CPU-only machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import ragguard
from ragguard import Policy, StagePolicy
from ragguard.rag import release_memory_on_oom

WORDS = (
    "the a of to and in is what how why which city capital paris france berlin germany rome italy "
    "river bridge museum tower gpu memory rerank query document cat dog"
).split()


@dataclass(frozen=True)
class Hit:
    id: int
    text: str
    score: float = 0.0


def tiny_cross_encoder(directory: str) -> str:
    """Write a tiny randomly initialised BERT cross-encoder to ``directory`` (no model hub)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    vocab = os.path.join(directory, "vocab.txt")
    with open(vocab, "w") as out:
        out.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(WORDS) + 5,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(directory)
    BertTokenizer(vocab).save_pretrained(directory)
    return directory


def build_rerank(model: Any, max_batch: int | None, sizes: list[int]) -> Any:
    """The guarded rerank stage around ``model.predict`` (the recipe itself)."""
    import torch

    @ragguard.guard("rerank", score=lambda hit: hit.score)
    @release_memory_on_oom  # inside the guard: runs in the worker thread that ran out
    def rerank(query: str, hits: list[Hit]) -> list[Hit]:
        sizes.append(len(hits))
        if max_batch is not None and len(hits) > max_batch:
            torch.empty(1 << 50, dtype=torch.uint8)  # torch's allocator raises its real OOM error
        scores = model.predict([(query, hit.text) for hit in hits], batch_size=len(hits))
        scored = (Hit(hit.id, hit.text, float(s)) for hit, s in zip(hits, scores, strict=True))
        return sorted(scored, key=lambda hit: hit.score, reverse=True)

    return rerank


async def main(model_name: str | None, max_batch: int | None, candidates: int) -> None:
    from sentence_transformers import CrossEncoder

    ragguard.configure(Policy(stages={"rerank": StagePolicy(preset="rerank", timeout_s=30.0, max_threads=1)}))
    with tempfile.TemporaryDirectory() as tmp:
        model = CrossEncoder(model_name or tiny_cross_encoder(tmp), device="cpu")
    sizes: list[int] = []
    rerank = build_rerank(model, max_batch, sizes)
    hits = [Hit(i, " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(6))) for i in range(candidates)]
    query = "what is the capital of france"
    one_batch = model.predict([(query, hit.text) for hit in hits], batch_size=len(hits))
    whole = [hit.id for _, hit in sorted(zip(one_batch, hits, strict=True), key=lambda p: -float(p[0]))]
    async with ragguard.tenant("acme"):
        got = await rerank(query, hits)
        print(f"batches tried: {sizes}")
        print(f"degraded: {ragguard.degraded()}")
    print(f"same order as one batch: {[h.id for h in got] == whole}")
    print(f"top 3: {[(h.id, round(h.score, 4)) for h in got[:3]]}")
    await ragguard.default_guard().aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a CrossEncoder name or path (default: a tiny local model)")
    parser.add_argument("--max-batch", type=int, default=None, help="pairs a batch may hold")
    parser.add_argument("--candidates", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.model, args.max_batch, args.candidates))
