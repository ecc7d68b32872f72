"""ragguard's public surface, held to what a user needs and the docs describe.

A public name is one in the ``__all__`` of a public module of ``ragguard`` (no part of the module's
dotted path below ``ragguard`` starts with ``_``), read as ``scripts/public_names.py`` counts them.

- :data:`PUBLIC` is the surface: a new public name (or module) is a deliberate change, made here
  and in the docs; everything else is private (tests and ``ragguard_tools`` may import it);
- every public name appears as code in the docs (in backticks, a fenced block or an example of
  README.md, docs/, examples/; docs/policy.md is generated from the options models), and every
  public module other than ``ragguard`` is named there;
- every public module declares its ``__all__``, and at run time it is the one read from the
  source, each name something the module has.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "ragguard"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.py"))]

PUBLIC: dict[str, tuple[str, ...]] = {
    "ragguard": (
        "AdaptivePolicy", "BreakerOpen", "BreakerPolicy", "BreakerState", "CircuitBreaker", "ConfigError",
        "CorruptPayload", "DeadlineExceeded", "EmbeddingTimeoutBreaker", "EmbeddingUnavailable", "FakeClock",
        "GenerationPolicy", "Guard", "GuardedStream", "HedgePolicy", "InvalidInput", "NoDeploymentAvailable",
        "Overloaded", "Policy",
        "PoolQuota", "QuotaExceeded", "RagguardError", "RerankOOMBreaker", "RerankOutOfMemory",
        "ReservePolicy", "RetryPolicy", "StagePolicy", "StageTimeout", "StreamEnding", "StreamTimeout",
        "TenantQuota", "ThrottlePolicy", "TokenLimits", "VectorStoreUnavailable",
        "VectorStoreUnavailableBreaker", "configure", "current_tenant", "deadline", "default_guard",
        "degraded", "guard", "named", "priority", "register_classifier", "remaining", "stream_endings",
        "tenant",
    ),
    "ragguard.asgi": (
        "APIKeyResolver", "API_KEY_HEADER", "Caller", "DEGRADED_HEADER", "HeaderResolver", "Identity",
        "PermissionDenied", "RETRY_AFTER_HEADER", "RETRY_AFTER_MS_HEADER", "RagguardMiddleware",
        "SSE_ENDING_EVENT", "SSE_ERROR_EVENT", "StatusEndpoint", "TENANT_HEADER", "TIMEOUT_HEADER",
        "TenantResolver", "Unauthenticated", "primed",
    ),
    "ragguard.breakers": (
        "AsyncBreaker", "Breaker", "BreakerConfig", "BreakerState", "CircuitBreaker",
        "EmbeddingTimeoutBreaker", "RerankOOMBreaker", "VectorStoreUnavailableBreaker", "classify_outcome",
        "counts_by_default", "counts_outages", "counts_overloads", "from_aiobreaker", "is_connection_error",
        "is_out_of_memory", "is_timeout",
    ),
    "ragguard.buffers": ("BufferPool", "DoubleRelease", "SnappyCodec"),
    "ragguard.chaos": (
        "BlockLoop", "Chaos", "CorruptPayload", "EmptyResults", "Error", "FaultHandle", "FaultInjected",
        "FaultProxy", "Hang", "HoldConnections", "Latency", "PartialResults", "RedisServer",
        "RedisServerUnavailable", "Scenario", "ScenarioError", "ScenarioRunner", "Schedule", "StaleResults",
        "Timeout", "batch_size", "corrupt_bytes", "default_scenario", "load_scenario",
    ),
    "ragguard.events": (
        "BreakerTransition", "CallOutcome", "CallRejected", "Event", "EventBus", "FailedOver",
        "FallbackServed", "Listener", "QuotaRejected", "RetryBudgetExhausted", "RetryScheduled",
        "StageCompleted", "StreamContinued", "StreamCut", "StreamEnded", "StreamSettled", "Where", "bus",
    ),
    "ragguard.groups": ("ModelGroup",),
    "ragguard.grpc": (
        "APIKeyResolver", "Caller", "DEADLINE_BY_KEY", "DEADLINE_S_KEY", "EXEMPT_SERVICES",
        "GuardServerInterceptor", "HeaderResolver", "Identity",
        "PermissionDenied", "RETRY_AFTER_KEY", "RemoteDeadlineExceeded", "RemoteQuotaExceeded",
        "RemoteUnavailable", "STREAM_AFTER_KEY", "STREAM_BUDGET_KEY", "STREAM_BY_KEY", "STREAM_ENDING_KEY",
        "STREAM_ERROR_KEY", "STREAM_ITEMS_KEY", "SnappyServerInterceptor", "SnappyWire", "TENANT_KEY",
        "TenantResolver", "Unauthenticated", "client_interceptors", "ending_trailers", "snappy_channel",
    ),
    "ragguard.httpx": (
        "GuardTransport", "RemoteDeadlineExceeded", "RemoteQuotaExceeded", "RemoteUnavailable",
    ),
    "ragguard.integrations": ("send_tenant_header", "tenant_headers"),
    "ragguard.integrations.anthropic": ("continue_message", "guard_anthropic", "prefill_messages"),
    "ragguard.integrations.langchain": ("GuardedRunnable", "TenantRateLimiter", "deployment_key"),
    "ragguard.integrations.llama_index": ("GuardedEmbedding", "GuardedPostprocessor", "GuardedRetriever"),
    "ragguard.integrations.openai": (
        "CONTINUE_INSTRUCTION", "continuation_messages", "continue_chat", "guard_openai",
    ),
    "ragguard.integrations.qdrant": ("guard_qdrant",),
    "ragguard.layers": ("Bound", "REGISTRY", "Stage", "StagePreset", "register_layer"),
    "ragguard.metrics": (
        "OTelMetrics", "PrometheusExporter", "disable_tracing", "enable_tracing", "otel_span",
    ),
    "ragguard.monitors": (
        "ConnectionLeak", "LoopStall", "MonitoredBlockingConnectionPool", "MonitoredConnectionPool",
        "PoolExhausted", "StallDetector", "record_events",
    ),
    "ragguard.options": (
        "AdaptivePolicy", "BreakerPolicy", "DeploymentPolicy", "GenerationPolicy", "GroupPolicy",
        "HedgePolicy", "LimitsPolicy", "Options", "Policy", "PoolQuota", "ReservePolicy", "RetryPolicy",
        "StagePolicy", "TenantQuota", "ThrottlePolicy", "TokenLimits", "key_id",
    ),
    "ragguard.outcomes": (
        "CONTENT_POLICY", "CONTEXT_LENGTH", "Kind", "MAX_STATED_WAIT_S", "Outcome", "classify",
        "context_overflow", "outcome_of", "register_classifier",
    ),
    "ragguard.overload": (
        "HedgeFired", "LimitChanged", "LoadShed", "Throttled", "priority", "status", "watch",
    ),
    "ragguard.pipeline": (
        "Backend", "BuildContext", "Call", "Gate", "Layer", "NO_EXIT", "Recovery", "Scope", "WAIT", "Wrapper",
    ),
    "ragguard.quotas": ("LocalQuotas", "QuotaBackend", "TokenAccounts"),
    "ragguard.rag": (
        "FallbackMiss", "MAX_OVERLAP_CHARS", "Overlap", "Partial", "Usage", "count_tokens",
        "empty_framework_cache", "register_preset", "release_memory_on_oom", "token_accounts",
    ),
    "ragguard.redis": (
        "LocalLease", "RedisBackend", "RedisQuotas", "RedisTokens", "SharedCircuitBreaker",
        "SharedStateDegraded", "SharedStateRestored",
    ),
    "ragguard.testing": ("EventRecorder", "fresh_guard", "reset"),
}


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("public_names", ROOT / "scripts" / "public_names.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COUNT = _script()
FOUND = COUNT.public_names(PACKAGE)


def _code(path: Path) -> str:
    """The code of a doc: an example whole; of a page, its fenced blocks and backtick spans."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return text
    fenced = re.findall(r"^```.*?^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return "\n".join([*fenced, *re.findall(r"`[^`\n]+`", prose)])


DOCS_TEXT = "\n".join(path.read_text(encoding="utf-8") for path in DOCS)
DOCS_CODE = "\n".join(_code(path) for path in DOCS)


def test_the_public_names_are_the_snapshot() -> None:
    found = {module: tuple(names) for module, names in FOUND.items()}
    added = {m: sorted(set(names) - set(PUBLIC.get(m, ()))) for m, names in found.items()}
    removed = {m: sorted(set(names) - set(found.get(m, ()))) for m, names in PUBLIC.items()}
    assert {m: n for m, n in added.items() if n} == {}, "public now: add to PUBLIC (and describe in the docs)"
    assert {m: n for m, n in removed.items() if n} == {}, "no longer public: take out of PUBLIC"
    assert found == {module: tuple(sorted(names)) for module, names in PUBLIC.items()}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_is_in_the_docs(module: str) -> None:
    undocumented = [name for name in PUBLIC[module] if not re.search(rf"(?<!\w){name}\b", DOCS_CODE)]
    assert undocumented == []
    if module != "ragguard":
        assert re.search(rf"(?<![\w.]){re.escape(module)}\b", DOCS_TEXT), f"the docs never name {module}"


def test_the_docs_check_sees_code_only(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Guard in prose.\n\n```python\nfrom ragguard import Policy\n```\n\nThen `tenant(...)`.\n")
    code = _code(page)
    assert "Policy" in code and "tenant(...)" in code and "prose" not in code


def test_every_public_module_declares_its_all() -> None:
    undeclared = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = COUNT.module_name(PACKAGE, path)
        if COUNT.is_public(module) and COUNT.all_of(path) is None:
            undeclared.append(module)
    assert undeclared == []


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_a_public_modules_all_at_run_time_is_the_one_counted(module: str) -> None:
    imported = importlib.import_module(module)
    assert tuple(sorted(imported.__all__)) == PUBLIC[module]
    assert [name for name in imported.__all__ if not hasattr(imported, name)] == []


def test_the_count_reads_what_a_module_declares(tmp_path: Path) -> None:
    package = tmp_path / "ragguard"
    (package / "_inner").mkdir(parents=True)
    (package / "wing").mkdir()
    (package / "__init__.py").write_text('__all__ = ["b", "a"]\n__all__ += ("c",)\n')
    (package / "_inner" / "__init__.py").write_text('__all__ = ["hidden"]\n')
    (package / "wing" / "__init__.py").write_text('__all__: list[str] = ["x"]\n')
    (package / "wing" / "_private.py").write_text('__all__ = ["y"]\n')
    (package / "wing" / "open.py").write_text("x = 1\n")
    assert COUNT.public_names(package) == {"ragguard": ["a", "b", "c"], "ragguard.wing": ["x"]}
    assert COUNT.all_of(package / "wing" / "open.py") is None
