"""The public errors live in the ``ragguard`` namespace: their ``__module__`` says so, tracebacks name
``ragguard.ConfigError`` (not ``ragguard._errors.ConfigError``), and pickle finds them there."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

import ragguard

PUBLIC_ERRORS = [
    obj for name in ragguard.__all__
    if isinstance(obj := getattr(ragguard, name), type) and issubclass(obj, BaseException)
]  # fmt: skip


def test_every_public_error_names_ragguard_as_its_module() -> None:
    assert len(PUBLIC_ERRORS) == 14, PUBLIC_ERRORS
    for cls in PUBLIC_ERRORS:
        assert cls.__module__ == "ragguard", cls
        assert getattr(ragguard, cls.__qualname__) is cls


def test_a_traceback_names_ragguard_config_error() -> None:
    code = "import ragguard; ragguard.Policy(stages={'embedding': {'timeout_s': -1}})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    said = [line for line in done.stderr.splitlines() if "ConfigError" in line]
    assert said and said[-1].startswith("ragguard.ConfigError: Policy: 1 invalid value"), done.stderr


SAMPLES = [
    ragguard.RagguardError("x"),
    ragguard.BreakerOpen("embedding", 1.5),
    ragguard.EmbeddingUnavailable("embedding", 2.0, state="half_open"),
    ragguard.VectorStoreUnavailable("vector_store", None),
    ragguard.RerankOutOfMemory("rerank", 3.0),
    ragguard.Overloaded("search", 0.2, "limit", priority="low", tenant="acme"),
    ragguard.StageTimeout("search", 2.0, items=1),
    ragguard.StreamTimeout("generation", "idle", 0.5, 4),
    ragguard.InvalidInput("bad"),
    ragguard.ConfigError("bad", field="stages.x"),
    ragguard.CorruptPayload("bad"),
    ragguard.QuotaExceeded("acme", 0.5, "rate"),  # did not unpickle: its args were the message only
    ragguard.DeadlineExceeded("search", 0.8, "late", items=3),  # its message doubled
    ragguard.DeadlineExceeded("search", 0.2, "late", 0.7),
]  # fmt: skip


@pytest.mark.parametrize("error", SAMPLES, ids=lambda e: type(e).__name__)
def test_a_public_error_pickles_by_its_public_name(error: BaseException) -> None:
    data = pickle.dumps(error, protocol=0)  # names each global as "c<module>\n<name>\n"
    assert f"cragguard._errors\n{type(error).__name__}\n".encode() not in data, data
    back = pickle.loads(data)
    assert type(back) is type(error) and str(back) == str(error) and vars(back) == vars(error)
