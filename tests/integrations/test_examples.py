"""Each example of examples/integrations runs as its docstring says, against the wire servers
(a fault scripted first, so each shows what ragguard does about it), and prints what served."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wire import AnthropicWire, Fault, OpenAIWire, QdrantGrpcWire, QdrantWire

EXAMPLES = Path(__file__).parents[2] / "examples" / "integrations"


def _run(name: str, *args: str) -> str:
    command = [sys.executable, str(EXAMPLES / name), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_openai_answer_retries_a_503_and_settles_the_usage(openai_wire: OpenAIWire) -> None:
    openai_wire.faults.push("chat", Fault(status=503))
    out = _run("openai_answer.py", "--base-url", f"{openai_wire.url}/v1")
    assert "embedded: 3 dimensions" in out
    assert "answer: Hello from the wire" in out
    assert "tokens settled for acme: 7" in out and "degraded: no" in out  # 4 output, 3 input
    assert openai_wire.faults.seen["chat"] == 2  # one retry, by ragguard
    assert {r["headers"]["x-tenant-id"] for r in openai_wire.requests} == {"acme"}


def test_anthropic_answer_falls_back_to_the_smaller_model(anthropic_wire: AnthropicWire) -> None:
    anthropic_wire.faults.push("messages", Fault(status=529), times=2)
    out = _run("anthropic_answer.py", "--base-url", anthropic_wire.url)
    assert "answer: Hello from the wire" in out
    assert "served by: ['smaller_model']" in out
    assert [r["json"]["model"] for r in anthropic_wire.requests] == ["claude-large"] * 2 + ["claude-small"]


def test_langchain_chain_streams_from_the_fallback_model(openai_wire: OpenAIWire) -> None:
    openai_wire.faults.push("chat", Fault(status=503), times=2)
    out = _run("langchain_chain.py", "--base-url", f"{openai_wire.url}/v1")
    assert "answer: Hello from the wire" in out and "served by: ['small-model']" in out


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_qdrant_search_answers_from_the_store_then_from_keywords_once_it_is_down(
    protocol: str, qdrant_wire: QdrantWire, qdrant_grpc_wire: QdrantGrpcWire
) -> None:
    if protocol == "rest":
        wire: QdrantWire | QdrantGrpcWire = qdrant_wire
        down, args = Fault(status=503), ["--url", qdrant_wire.url]
    else:
        wire = qdrant_grpc_wire
        down, args = Fault(grpc_code="UNAVAILABLE"), ["--grpc-port", str(qdrant_grpc_wire.port)]
    wire.faults.push("query", Fault())  # the first search is answered
    wire.faults.push("query", down, times=10**6)  # then the store is down
    # The store's share of each deadline is a quarter of it: 0.25 s of the example's default 1 s.
    # The first search also opens the connection (a gRPC channel's handshake), which a loaded
    # machine can stretch past 0.25 s: the fallback then rightly answers it. 10 s leaves 2.5 s.
    out = _run("qdrant_search.py", *args, "--queries", "5", "--deadline-s", "10")
    assert "query 0: [1] \n" in out
    assert out.count("(keyword_search)") == 4
    assert "vector_store breaker: open" in out
    assert wire.faults.seen["query"] == 5  # one answered, four failed: 5 calls, 80% failed, open


def test_llama_index_query_answers_from_the_keyword_retriever_when_qdrant_fails(
    openai_wire: OpenAIWire, qdrant_wire: QdrantWire
) -> None:
    qdrant_wire.faults.push("query", Fault(status=503), times=10**6)
    out = _run("llama_index_query.py", "--base-url", f"{openai_wire.url}/v1", "--qdrant-url", qdrant_wire.url)
    assert "sources: ['a keyword match']" in out and "KeywordRetriever" in out
