"""Small, reusable servers on 127.0.0.1 that speak the wire formats of the services RAG pipelines
call, built on real server libraries (uvicorn + Starlette for HTTP, ``grpc.aio`` for gRPC), so the
real client packages (openai, anthropic, qdrant-client, elasticsearch, opensearch-py) can be tested
against them, with faults scripted per request (:class:`Fault`: status, headers, body, delay before
the first byte, a stall or an error event mid-stream, a TCP reset).

::

    wire = OpenAIWire()
    wire.faults.push("embeddings", Fault(status=429, headers={"retry-after-ms": "250"}))
    with wire.running() as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
"""

from ._faults import Fault, Faults
from ._http import HttpWire, serving, sse
from .anthropic_api import CONTENT_BLOCKED, OVERLOADED, AnthropicWire, anthropic_error
from .elastic_api import ElasticWire, elastic_error
from .openai_api import OpenAIWire, context_length_error, openai_error, prompt_tokens
from .qdrant_api import QdrantGrpcWire, QdrantWire, qdrant_error

__all__ = [
    "CONTENT_BLOCKED",
    "OVERLOADED",
    "AnthropicWire",
    "ElasticWire",
    "Fault",
    "Faults",
    "HttpWire",
    "OpenAIWire",
    "QdrantGrpcWire",
    "QdrantWire",
    "anthropic_error",
    "context_length_error",
    "elastic_error",
    "openai_error",
    "prompt_tokens",
    "qdrant_error",
    "serving",
    "sse",
]
