"""Regenerate benchmarks/RESULTS.md: run each benchmark (each in its own process, at its default
size) and record its output, with every MET/GAP line gathered at the top.

    .venv/bin/python benchmarks/run_all.py [--only overhead,tenants] [--out benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

BENCHMARKS = [
    ("overhead", "Full stack, nothing configured and the failure path beside main before issue 30 (commit "
     "9b27c28); the happy path beside the pre-redesign code (issue 10), peers and floors; 1, 100, 10,000 in flight."),
    ("failure_path", "A call failing 3 attempts, beside a bare hand-written loop, the same work written by hand "
     "(quota, deadline, attempt timer, classification, breaker and budget accounting), tenacity and the stock "
     "stacks, and main before issue 30 (commit 9b27c28)."),
    ("tenants", "1, 1,000 and 100,000 tenants taking turns; bytes per idle tenant."),
    ("breaker_micro", "The breaker alone, closed and open, beside circuitbreaker, purgatory, aiobreaker, hyx."),
    ("codec", "The Snappy codec's leased and bytes APIs beside the bare cramjam calls, python-snappy and zlib "
     "levels 1 and 6, at four payload sizes; allocations; loopback gRPC streaming."),
    ("generation", "Per-item cost of a guarded generation stream (issue 15): each stream opened, read to its end "
     "(100 short text items) and closed inside a tenant block, its opening and closing spread over its items. "
     "\"plain stage\" is `@guard` on a stage with no preset (generic breaker, a 30 s attempt timeout armed per "
     "item); the generation stage adds the three budgets (one timer per item instead of the attempt timeout's), "
     "its token meter, and for a paced tenant the token count and the GCRA step per item (a rate so high no item "
     "waits), and with a token quota one reservation and its settlement per stream. A model's tokens come "
     "milliseconds apart, so a few microseconds per item is well under 0.1% of a stream's time."),
    ("stream_items", "Per-item cost of a guarded stream (stage with nothing configured) and what the Python 3.11 "
     "lost-cancellation check of each item read adds (issue 13 #4)."),
    ("overload_overhead", "What the overload layers (adaptive limit, throttle, hedge) add to a stage's call "
     "(issue 14)."),
    ("shared_breaker", "The breaker kept in a real redis-server beside the in-memory one (issue 11)."),
    ("shared_quota", "A tenant quota in Redis beside one bare EVALSHA round trip; local-lease mode's error "
     "across 4 processes (issue 11)."),
    ("shared_failover", "How long each shared component takes to switch to local state and back when Redis is "
     "down or slow (issue 11)."),
    ("http_middleware", "The ASGI middleware's cost per request, in process (issue 12)."),
    ("monitors_overhead", "The event-loop stall detector's and the Redis pool monitor's cost."),
    ("sync_calls", "What `@guard` on a sync function costs the event loop beside the bare `anyio.to_thread` hop "
     "(issue 24)."),
    ("refusals", "What routing a provider's refusals costs (issue 28): the happy path with `passages=` and "
     "`on_context_length=`, a refusal answered by the shrink or the route, a failure by a plain fallback."),
    ("deadline_budget", "What a stage's share of the deadline and the reserve kept for its fallback cost "
     "(issue 31): the full stack with both (the standard vector_store stage's) beside both off, on the happy "
     "path and when the fallback answers (and the reserve learns its latency)."),
    ("continuation", "What a typed ending and a continuation cost a generation stream (issue 31): the stage "
     "as shipped, read with `async for` and with `anext()`, with a `continuation=` declared, and a stream "
     "cut at half and continued."),
    ("deployments", "What a keyed stage and a model group's call cost (issue 28) against the unkeyed stage "
     "doing the same work (one key against one stage, 64 keys against 64 stages), with LiteLLM's published "
     "gateway overhead cited for scale."),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    args = parser.parse_args()
    chosen = [b for b in BENCHMARKS if not args.only or b[0] in args.only.split(",")]
    sections: list[str] = []
    verdicts: list[str] = []
    env = {**os.environ, "BENCH_WIDTH": "130", "COLUMNS": "130"}
    for name, what in chosen:
        print(f"running {name}...", file=sys.stderr, flush=True)
        done = subprocess.run(
            [sys.executable, str(HERE / f"{name}.py")], capture_output=True, text=True, env=env, cwd=HERE.parent
        )
        output = done.stdout + (f"\n(exit status {done.returncode})\n{done.stderr[-2000:]}" if done.returncode else "")
        verdicts += [f"{name}: {line.strip()}" for line in output.splitlines() if line.startswith(("MET", "GAP"))]
        sections.append(f"## `.venv/bin/python benchmarks/{name}.py`\n\n{what}\n\n```\n{output.rstrip()}\n```\n")
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    head = f"""# Benchmark results

Regenerate with one command: `.venv/bin/python benchmarks/run_all.py` (a few minutes on 2 cores).
Recorded {now} on Python {platform.python_version()}, {os.cpu_count()} shared cores. Every benchmark
interleaves its contenders round by round (benchmarks/_bench.py), reports the median and min-max of
CPU time per operation of the loop's thread, and gives ratios as the median of per-round ratios.
The machine is shared: compare ratios, not absolute figures. The Redis benchmarks start their own
redis-server on 127.0.0.1 (they say so and are skipped without the binary).

## Targets

```
{chr(10).join(verdicts)}
```

"""
    Path(args.out).write_text(head + "\n".join(sections))
    print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
