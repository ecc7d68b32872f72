"""A deployment's token limit across processes: 3 replicas share one redis-server, each calling a
model group of two deployments with concurrent streams; each deployment has ``limits.tpm`` TPM
tokens per WINDOW_S. Demand is far above both limits throughout; the tokens each deployment's
admitted streams used never pass what docs/integrations.md states: in any interval of L seconds
at most ``tpm + L x tpm / window_s`` (the GCRA bound, the bucket full at its start plus what
refills), every stream here using at most what it reserved (no debt). As in test_tokens_accuracy,
each bound also allows the rate for the longest event-loop delay a worker measured and SKEW_S for
a reply's trip, since the times are the readers' wall clocks."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from ragguard.redis._tokens import token_key

sys.path.insert(0, str(Path(__file__).parent))
from _deployment_worker import ESTIMATE, TPM, WINDOW_S
from _replica import run_replicas
from test_tokens_accuracy import worst_window

WORKER = Path(__file__).with_name("_deployment_worker.py")
PROCESSES, STREAMS, DURATION_S = 3, 10, 4.0
SKEW_S = 0.02


@pytest.mark.timeout(180)
def test_three_processes_hold_each_deployment_to_its_token_limit(redis_server: Any) -> None:
    start_at, results = run_replicas(WORKER, redis_server.port, DURATION_S, STREAMS, processes=PROCESSES)
    assert all(r["degraded"] == 0 for r in results)  # measured on shared state, not the fallback
    assert sum(r["refused"] for r in results) > 0  # demand was above both limits
    lag = max(r["lag_s"] for r in results)
    rate = TPM / WINDOW_S
    lines = []
    for deployment in ("a", "b"):
        streams = sorted((t, n) for r in results for t, by, n in r["streams"] if by == deployment)
        assert streams, f"deployment {deployment} served nothing"
        assert all(n <= ESTIMATE for _, n in streams)
        for length in (0.5, 1.0, 2.0, DURATION_S):
            worst = worst_window(streams, length)
            bound = TPM + rate * (length + SKEW_S + lag)
            lines.append(f"{deployment} L={length:.1f}s: worst {worst} tokens, bound {bound:.0f} "
                         f"({worst / bound:.3f}); tpm alone {TPM + rate * length:.0f}")  # fmt: skip
            assert worst <= bound, lines[-1]
        lo, hi = start_at + 1.5, start_at + DURATION_S - 0.3
        steady = sum(n for t, n in streams if lo <= t < hi) / (hi - lo)
        lines.append(f"{deployment} steady {steady:.1f} tokens/s against {rate:.0f}/s ({steady / rate:.3f})")
    lines.append(f"longest event-loop delay of a worker: {lag * 1000:.1f} ms")
    print("\n".join(lines))
    with redis.Redis(host=redis_server.host, port=redis_server.port) as client:
        for deployment in ("a", "b"):  # every reservation settled
            assert client.hlen(token_key(f"deploy/chat/{deployment}/tokens", ":res")) == 0
