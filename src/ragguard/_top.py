"""``ragguard top URL``: a live terminal view of a running service's status endpoint.

Polls ``URL`` (a :class:`ragguard.asgi.StatusEndpoint`, :func:`ragguard.status.serve`, or any
route answering :func:`ragguard.status.snapshot`'s JSON) every ``interval_s`` seconds and redraws
in place: breakers with their state and time left open, adaptive limits, tenants' slots, and
fallbacks, sheds and refusals per second (from the endpoint's counts, between two polls). Laid out
to stay readable at 80 columns. While the URL does not answer, it says so and keeps polling.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = ["Top", "fetch", "render"]

_STATE_STYLE = {"closed": "green", "open": "bold red", "forced_open": "bold red", "half_open": "yellow",
                "disabled": "dim"}  # fmt: skip
_MAX_ROWS = 12  # per table: a terminal is short


def fetch(url: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """GET ``url`` and parse its JSON object; raises OSError (unreachable, HTTP error) or ValueError."""
    request = urllib.request.Request(url, headers={"accept": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        body = response.read(4_000_000)
    got = json.loads(body)
    if not isinstance(got, dict) or "stages" not in got:
        raise ValueError("not a ragguard status (no 'stages')")
    return got


Rates = dict[str, dict[str, float]]


def _rates(now: Mapping[str, Any], before: Mapping[str, Any] | None, dt: float) -> Rates:
    """Per-second rates of every count between two polls (empty on the first)."""
    out: dict[str, dict[str, float]] = {}
    if before is None or dt <= 0:
        return out
    for name, table in now.items():
        if not isinstance(table, dict):
            continue
        old = before.get(name) or {}
        out[name] = {k: max(0.0, (v - old.get(k, 0)) / dt) for k, v in table.items()}
    return out


def _per_s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _left(seconds: Any) -> str:
    return f"{seconds:.1f}s" if isinstance(seconds, (int, float)) else ""


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", expand=False, pad_edge=False,
                  show_edge=False, box=None, header_style="bold cyan")  # fmt: skip
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True, overflow="ellipsis",
                         max_width=24 if i == 0 else 12)  # fmt: skip
    return table


def render(status: Mapping[str, Any], rates: Mapping[str, Mapping[str, float]], url: str, at: str) -> Group:
    """One frame of the view (rich renderables) for the snapshot ``status``."""
    ok = status.get("ok", True)
    head = Text.assemble(("ragguard top ", "bold"), (url, "cyan"), f"  {at}  ",
                         ("OK" if ok else "DEGRADED", "bold green" if ok else "bold red"))  # fmt: skip
    stages: Mapping[str, Any] = status.get("stages", {})
    counts = status.get("counts")
    fallbacks = rates.get("fallbacks", {})
    shed = rates.get("shed", {})
    rejected = rates.get("rejected", {})

    breakers = _table("Breakers", "stage", "state", "left", "fallback/s", "reject/s")
    for name, entry in list(stages.items())[:_MAX_ROWS]:
        b = entry.get("breaker")
        if b is None:
            state, left, reject = Text("-", style="dim"), "", None
        else:
            state = Text(str(b.get("state", "?")), style=_STATE_STYLE.get(str(b.get("state")), ""))
            left = _left(b.get("retry_after_s"))
            reject = rejected.get(str(b.get("name")), 0.0) if counts is not None else None
        breakers.add_row(name, state, left, _per_s(fallbacks.get(name, 0.0) if counts is not None else None),
                         _per_s(reject))  # fmt: skip

    limits = _table("Adaptive limits", "stage", "limit", "range", "in flight", "queued", "shed/s")
    for name, entry in stages.items():
        lim = entry.get("limit")
        if lim is None:
            continue
        span = f"{lim.get('min_limit', '?')}-{lim.get('max_limit', '?')}" if "min_limit" in lim else ""
        limits.add_row(name, str(lim.get("limit")), span, str(lim.get("in_flight")), str(lim.get("queued")),
                       _per_s(shed.get(name, 0.0) if counts is not None else None))  # fmt: skip

    quotas = status.get("quotas") or {}
    refused = rates.get("quota_rejected", {})
    tenants = _table("Tenants", "tenant", "in flight", "waiting", "max", "refused/s")
    rows = dict(list((quotas.get("tenants") or {}).items())[: _MAX_ROWS - 1])
    others = quotas.get("others")
    if others is not None:
        named = set(quotas.get("tenants") or {})
        other_refused = sum(v for k, v in refused.items() if k not in named)
        rows["(others)"] = {**others, "max_concurrency": None, "_refused": other_refused}
    for tenant, t in rows.items():
        got = t.get("_refused", refused.get(tenant, 0.0))
        waiting, most = t.get("waiting"), t.get("max_concurrency")
        tenants.add_row(tenant, str(t.get("in_flight")), "-" if waiting is None else str(waiting),
                        "-" if most is None else str(most),
                        _per_s(got if counts is not None else None))  # fmt: skip

    parts: list[RenderableType] = [head, Text(""), breakers]
    if limits.row_count:
        parts += [Text(""), limits]
    if tenants.row_count:
        parts += [Text(""), tenants]
    links = status.get("links") or []
    if links:
        words = [
            Text.assemble(str(link.get("component")), ": ",
                          ("redis", "green") if link.get("shared") else ("LOCAL (redis lost)", "bold red"))
            for link in links[:6]
        ]  # fmt: skip
        parts += [Text(""), Text("Links  ", style="bold") + Text("  ").join(words)]
    if counts is None:
        parts += [Text(""), Text("(no counts: the endpoint does not count fallbacks and sheds)", style="dim")]
    return Group(*parts)


def _waiting(url: str, error: str, at: str) -> Group:
    return Group(
        Text.assemble(("ragguard top ", "bold"), (url, "cyan"), f"  {at}"),
        Text(""),
        Text(f"waiting for the status endpoint: {error}", style="yellow"),
    )


class Top:
    """The polling loop behind ``ragguard top`` (see the module docstring). ``fetcher`` and
    ``clock`` are parameters so a test can drive it without a server or real time."""

    def __init__(
        self,
        url: str,
        *,
        interval_s: float = 1.0,
        fetcher: Callable[[str], dict[str, Any]] = fetch,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.interval_s = interval_s
        self._fetch = fetcher
        self._clock = clock
        self._before: tuple[float, Mapping[str, Any]] | None = None

    def frame(self) -> Group:
        """Poll once and return what to show."""
        at = time.strftime("%H:%M:%S")
        try:
            status = self._fetch(self.url)
        except (OSError, ValueError) as exc:
            return _waiting(self.url, _reason(exc), at)
        now = self._clock()
        counts = status.get("counts")
        rates: Rates = {}
        if isinstance(counts, dict):
            if self._before is not None:
                then, old = self._before
                rates = _rates(counts, old, now - then)
            self._before = (now, counts)
        return render(status, rates, self.url, at)

    def run(self, console: Console, *, once: bool = False) -> None:
        """Draw frames in place until interrupted (``once``: print one frame and return)."""
        if once:
            console.print(self.frame())
            return
        from rich.live import Live

        with Live(self.frame(), console=console, auto_refresh=False, screen=False) as live:
            try:
                while True:
                    time.sleep(self.interval_s)
                    live.update(self.frame(), refresh=True)
            except KeyboardInterrupt:
                return


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)[:60]
    return f"{type(exc).__name__}: {str(exc)[:60]}"
