"""ragguard around the SDKs and frameworks RAG services are built on, one module each, each an
optional extra imported only when its module is (docs/integrations.md has a recipe for each):

- :mod:`ragguard.integrations.openai`: ``guard_openai(AsyncOpenAI(...))``, embeddings as the
  embedding stage, chat completions and the Responses API as the generation stage (extra
  ``openai``; any OpenAI-compatible server by ``base_url``);
- :mod:`ragguard.integrations.anthropic`: ``guard_anthropic(AsyncAnthropic(...))``, messages as
  the generation stage (extra ``anthropic``);
- :mod:`ragguard.integrations.langchain`: ``GuardedRunnable`` (any ``Runnable`` as a stage) and
  ``TenantRateLimiter`` (a ``BaseRateLimiter`` of the tenant's quota) (extra ``langchain``);
- :mod:`ragguard.integrations.llama_index`: ``GuardedEmbedding``, ``GuardedRetriever``,
  ``GuardedPostprocessor`` (extra ``llama-index``);
- :mod:`ragguard.integrations.qdrant`: ``guard_qdrant(AsyncQdrantClient(...))``, searches as
  the vector-store stage, REST or gRPC (extra ``qdrant``).

Each uses ragguard's public API only (``Guard.guard``, ``ragguard.guard``, the policy, the
outcome classifiers), as a user's own code would. Every wrapped client sends the current tenant in
the Guard's ``tenant_header`` (``Guard(tenant_header="x-tenant-id")``); :func:`send_tenant_header`
is the request hook that does it for an HTTP client ragguard cannot reach into, and
:func:`tenant_headers` what it sends.
"""

from ._common import send_tenant_header, tenant_headers

__all__ = ["send_tenant_header", "tenant_headers"]
