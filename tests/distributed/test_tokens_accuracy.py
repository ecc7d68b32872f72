"""Token limits across processes: 3 replicas share one redis-server, each with concurrent streams
of a metered tenant (a token quota) and of a paced tenant (tokens per second). Demand is far above
both limits throughout; the tokens admitted never pass what docs/distributed.md states:

- quota: the tokens used by the streams admitted in any interval of L seconds are at most
  ``token_quota + L x token_quota / token_window_s`` (the GCRA bound, burst + rate; every stream
  here uses at most what it reserved, so there is no debt to add);
- pacing: the tokens handed over in any interval of L seconds are at most
  ``token_burst + L x tokens_per_s`` plus one pacing block per replica (a block is taken from the
  shared buckets before its tokens are handed over, possibly just before the interval) and one
  more (a block's tokens are released together when it conforms).

Times are each reader's wall clock when it got a token, so a worker's event loop that was late
(the machine is shared: three workers and Redis on two cores) bunches tokens released during the
delay into the interval after it: each bound also allows the rate for the longest delay any worker
measured (``lag_s``), and ``SKEW_S`` for the trip of a reply.
"""

from __future__ import annotations

import bisect
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from ragguard.redis._tokens import token_key

sys.path.insert(0, str(Path(__file__).parent))
from _replica import run_replicas
from _tokens_worker import ESTIMATE, PACE_BURST, PACE_PER_S, QUOTA, WINDOW_S

WORKER = Path(__file__).with_name("_tokens_worker.py")
PROCESSES, STREAMS, DURATION_S = 3, 10, 4.0
BLOCK = math.ceil(0.05 * PACE_PER_S)  # RedisTokens' default block_s of the pacing rate
SKEW_S = 0.02  # the client's wall clock against Redis's TIME on one host, and a reply's trip


def worst_window(events: list[tuple[float, int]], length_s: float) -> int:
    """The most tokens of ``events`` (time, tokens), sorted, inside any interval of ``length_s``."""
    times = [t for t, _ in events]
    prefix = [0]
    for _, n in events:
        prefix.append(prefix[-1] + n)
    return max(prefix[bisect.bisect_left(times, t + length_s)] - prefix[i] for i, t in enumerate(times))


@pytest.mark.timeout(180)
def test_three_processes_hold_a_tenant_to_its_token_quota_and_pacing(redis_server: Any) -> None:
    start_at, results = run_replicas(WORKER, redis_server.port, DURATION_S, STREAMS, processes=PROCESSES)
    assert all(r["degraded"] == 0 for r in results)  # measured on shared state, not the fallback
    assert sum(r["refused"] for r in results) > 0  # demand was above the quota
    lag = max(r["lag_s"] for r in results)

    rate = QUOTA / WINDOW_S
    streams = sorted((t, n) for r in results for t, n in r["quota"])
    assert all(n <= ESTIMATE for _, n in streams)
    lines = []
    for length in (0.5, 1.0, 2.0, DURATION_S):
        worst = worst_window(streams, length)
        bound = QUOTA + rate * (length + SKEW_S + lag)
        lines.append(f"quota  L={length:.1f}s: worst {worst} tokens, bound {bound:.0f} ({worst / bound:.3f})")
        assert worst <= bound, lines[-1]
    lo, hi = start_at + 1.5, start_at + DURATION_S - 0.3  # past the first bucket's worth
    steady = sum(n for t, n in streams if lo <= t < hi) / (hi - lo)
    lines.append(f"quota  steady {steady:.1f} tokens/s against {rate:.0f}/s ({steady / rate:.3f})")

    handed = sorted((t, 1) for r in results for t in r["paced"])
    for length in (0.25, 1.0, 2.0):
        worst = worst_window(handed, length)
        bound = PACE_BURST + PACE_PER_S * (length + SKEW_S + lag) + (PROCESSES + 1) * BLOCK
        lines.append(f"pacing L={length:.2f}s: worst {worst} tokens, bound {bound:.0f} ({worst / bound:.3f})")
        assert worst <= bound, lines[-1]
    paced = sum(1 for t, _ in handed if lo <= t < hi) / (hi - lo)
    lines.append(f"pacing steady {paced:.1f} tokens/s against {PACE_PER_S:.0f}/s ({paced / PACE_PER_S:.3f})")
    lines.append(f"longest event-loop delay of a worker: {lag * 1000:.1f} ms")
    print("\n".join(lines))
    with redis.Redis(host=redis_server.host, port=redis_server.port) as client:
        assert client.hlen(token_key("metered", ":res")) == 0  # every reservation settled
