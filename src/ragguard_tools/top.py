"""``ragguard top URL``: a live terminal view of a running service's status endpoint.

Polls ``URL`` (a :class:`ragguard.asgi.StatusEndpoint`, :func:`ragguard_tools.status.serve`, or any
route answering :func:`ragguard._status.snapshot`'s JSON) every ``interval_s`` seconds and redraws
in place: breakers with their state and time left open (a keyed stage's keys under it: those not
closed first, then the busiest), adaptive limits (a key's too), how many keys each keyed stage
keeps, each model group's deployments and their breakers, tenants' slots, and fallbacks, sheds and
refusals per second (from the endpoint's counts, between two polls: "-"
until there are two). Laid out to stay readable at 80 columns. While the URL does not answer, it
says so and keeps polling. A ``note`` string in the status (``ragguard demo --status-port`` says
which of its runs is guarded) is shown under the title.

On a terminal the frame is redrawn in place; in a pipe or a log each frame is printed as plain
text as it comes, followed by a blank line (a "waiting" line only when the reason changes).
SIGINT and SIGTERM end the view after the frame being drawn. ``once`` polls twice,
``interval_s`` apart, and prints the second frame (its rates are between the two); when the
endpoint does not answer it prints the reason on stderr and :meth:`Top.run` returns 1.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = ["Top", "fetch", "render"]

_STATE_STYLE = {"closed": "green", "open": "bold red", "forced_open": "bold red", "half_open": "yellow",
                "disabled": "dim"}  # fmt: skip
_MAX_ROWS = 12  # per table: a terminal is short
_MAX_KEY_ROWS = 4  # per keyed stage: its keys not closed first, then the busiest
_MAX_LINKS = 6  # Redis links named: those on local state first


def _links_line(links: list[dict[str, Any]]) -> Text:
    """The Redis links: those on local state first (a key's breaker, ``breaker:stage[key]``, as a
    stage's), at most :data:`_MAX_LINKS`, then how many more and how many of those are local."""
    links = sorted(links, key=lambda link: not _lost(link))  # stable: the endpoint's order
    words = [Text.assemble(_plain(link.get("component")), ": ", _LINK_WORDS[_link_state(link)])
             for link in links[:_MAX_LINKS]]  # fmt: skip
    rest = links[_MAX_LINKS:]
    if rest:
        local = sum(1 for link in rest if _lost(link))
        more = f"+{len(rest)} more" + (f" ({local} LOCAL)" if local else ", none lost")
        words.append(Text(more, style="bold red" if local else "dim"))
    return Text("Links  ", style="bold") + Text("  ").join(words)


_LINK_WORDS = {"redis": ("redis", "green"), "pending": ("not used yet", "dim"),
               "lost": ("LOCAL (redis lost)", "bold red")}  # fmt: skip


def _link_state(link: Mapping[str, Any]) -> str:
    if link.get("shared"):
        return "redis"
    return "pending" if link.get("pending") else "lost"


def _lost(link: Mapping[str, Any]) -> bool:
    return _link_state(link) == "lost"


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


def _rates(now: Mapping[str, Any], before: Mapping[str, Any] | None, dt: float) -> Rates | None:
    """Per-second rates of every count between two polls (None on the first: no rate yet)."""
    out: dict[str, dict[str, float]] = {}
    if before is None or dt <= 0:
        return None
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


def _plain(value: Any, limit: int = 60) -> str:
    """``value`` as the endpoint sent it, made safe to print: at most ``limit`` characters, and
    no control characters (an escape sequence in a stage name must not drive the terminal)."""
    text = str(value)[:limit]
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


def _or_dash(value: Any) -> str:
    return "-" if value is None else _plain(value, 12)


def _left(seconds: Any) -> str:
    return f"{seconds:.1f}s" if isinstance(seconds, (int, float)) else ""


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", expand=False, pad_edge=False,
                  show_edge=False, box=None, header_style="bold cyan")  # fmt: skip
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True, overflow="ellipsis",
                         max_width=24 if i == 0 else 12)  # fmt: skip
    return table


def render(
    status: Mapping[str, Any], rates: Mapping[str, Mapping[str, float]] | None, url: str, at: str
) -> Group:
    """One frame of the view (rich renderables) for the snapshot ``status``; ``rates`` per
    second since the previous poll (None: no previous poll, every rate shows "-")."""
    ok = status.get("ok", True)
    head = Text.assemble(("ragguard top ", "bold"), (url, "cyan"), f"  {at}  ",
                         ("OK" if ok else "DEGRADED", "bold green" if ok else "bold red"))  # fmt: skip
    stages: Mapping[str, Any] = status.get("stages", {})
    counted = isinstance(status.get("counts"), dict)
    counts = status.get("counts") if counted and rates is not None else None
    rates = rates or {}
    fallbacks = rates.get("fallbacks", {})
    shed = rates.get("shed", {})
    rejected = rates.get("rejected", {})

    def breaker_cells(b: Any) -> tuple[Text, str, str]:
        if not isinstance(b, dict):
            return Text("-", style="dim"), "", _per_s(None)
        state = Text(_plain(b.get("state", "?")), style=_STATE_STYLE.get(str(b.get("state")), ""))
        reject = rejected.get(str(b.get("name")), 0.0) if counts is not None else None
        return state, _left(b.get("retry_after_s")), _per_s(reject)

    breakers = _table("Breakers", "stage", "state", "left", "fallback/s", "reject/s")
    for name, entry in list(stages.items())[:_MAX_ROWS]:
        state, left, reject = breaker_cells(entry.get("breaker"))
        fallback = fallbacks.get(name, 0.0) if counts is not None else None
        breakers.add_row(_plain(name), state, left, _per_s(fallback), reject)
        shown, more = _keys_shown(entry)
        for key, k in shown:
            state, left, reject = breaker_cells(k.get("breaker"))
            breakers.add_row(Text(f"  {_plain(key, 40)}", style="italic"), state, left, "", reject)
        if more:
            breakers.add_row(Text(f"  (+{more} more keys)", style="dim"), "", "", "", "")

    limits = _table("Adaptive limits", "stage", "limit", "range", "in flight", "queued", "shed/s")

    def limit_row(label: Text | str, lim: dict[str, Any], shed_s: str) -> None:
        span = f"{lim.get('min_limit', '?')}-{lim.get('max_limit', '?')}" if "min_limit" in lim else ""
        limits.add_row(label, *(_plain(v, 12) for v in (lim.get("limit"), span, lim.get("in_flight"),
                                                        lim.get("queued"))), shed_s)  # fmt: skip

    for name, entry in stages.items():
        lim = entry.get("limit")
        if isinstance(lim, dict):
            limit_row(_plain(name), lim, _per_s(shed.get(name, 0.0) if counts is not None else None))
        for key, k in _keys_shown(entry)[0]:
            if isinstance(k.get("limit"), dict):
                limit_row(Text(f"  {_plain(key, 40)}", style="italic"), k["limit"], "")

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
        tenants.add_row(_plain(tenant), _plain(t.get("in_flight"), 12), _or_dash(waiting), _or_dash(most),
                        _per_s(got if counts is not None else None))  # fmt: skip

    parts: list[RenderableType] = [head]
    note = status.get("note")
    if isinstance(note, str) and note:
        parts.append(Text(_plain(note, 200), style="yellow"))
    parts += [Text(""), breakers]
    if limits.row_count:
        parts += [Text(""), limits]
    if tenants.row_count:
        parts += [Text(""), tenants]
    keyed = [_keyed_line(name, e["keyed"]) for name, e in stages.items() if isinstance(e.get("keyed"), dict)]
    if keyed:
        parts += [Text(""), Text("Keys  ", style="bold") + Text("; ".join(keyed[:4]))]
    groups = status.get("groups")
    if isinstance(groups, dict) and groups:
        parts += [Text(""), Text("Groups", style="bold")]
        for group, g in list(groups.items())[:_MAX_ROWS]:
            deployments = g.get("deployments") if isinstance(g, dict) else None
            words = [
                Text.assemble(_plain(d), " ", (_plain(info.get("state") or "-", 12),
                                               _STATE_STYLE.get(str(info.get("state")), "")))
                for d, info in list((deployments or {}).items())[:6] if isinstance(info, dict)
            ]  # fmt: skip
            parts.append(Text(f"  {_plain(group)}: ") + Text(", ").join(words))
    links = [link for link in status.get("links") or [] if isinstance(link, dict)]
    if links:
        parts += [Text(""), _links_line(links)]
    if not counted and stages:  # no stages (yet): nothing to count, nothing to say of counting
        parts += [Text(""), Text("(no counts: the endpoint does not count fallbacks and sheds)", style="dim")]
    elif counts is None:
        parts += [Text(""), Text("(rates per second from the next poll on: they need two)", style="dim")]
    return Group(*parts)


def _keyed_line(stage: str, counts: Mapping[str, Any]) -> str:
    kept, most = _plain(counts.get("kept"), 8), _plain(counts.get("max_keys"), 8)
    over, gone = _plain(counts.get("overflowed"), 12), _plain(counts.get("evicted"), 12)
    return f"{_plain(stage)}: {kept} of {most} kept, {over} on the overflow, {gone} evicted"


def _keys_shown(entry: Mapping[str, Any]) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """The keys of a stage's entry to show (those not closed first, then the busiest), and how
    many more there are."""
    keys = entry.get("keys")
    if not isinstance(keys, dict):
        return [], 0
    rows = [(str(key), k) for key, k in keys.items() if isinstance(k, dict)]

    def rank(row: tuple[str, dict[str, Any]]) -> tuple[bool, float, float]:
        b = row[1].get("breaker")
        closed = not isinstance(b, dict) or b.get("state") in ("closed", "disabled")
        in_flight, calls = row[1].get("in_flight"), row[1].get("calls")
        number = (int, float)
        return (closed, -(in_flight if isinstance(in_flight, number) else 0),
                -(calls if isinstance(calls, number) else 0))  # fmt: skip

    rows.sort(key=rank)
    return rows[:_MAX_KEY_ROWS], max(0, len(rows) - _MAX_KEY_ROWS)


def _waiting(url: str, error: str, at: str) -> Group:
    return Group(
        Text.assemble(("ragguard top ", "bold"), (url, "cyan"), f"  {at}"),
        Text(""),
        Text(f"waiting for the status endpoint: {error}", style="yellow"),
    )


class Top:
    """The polling loop behind ``ragguard top`` (see the module docstring). ``fetcher``, ``clock``
    and ``sleep`` are parameters so a test can drive it without a server or real time."""

    def __init__(
        self,
        url: str,
        *,
        interval_s: float = 1.0,
        fetcher: Callable[[str], dict[str, Any]] = fetch,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url
        self.interval_s = interval_s
        self._fetch = fetcher
        self._clock = clock
        self._sleep = sleep
        self._before: tuple[float, Mapping[str, Any]] | None = None
        self._stopping = False

    def poll(self) -> tuple[Group, str | None]:
        """Poll once: the frame to show, and why the endpoint did not answer (None: it did)."""
        at = time.strftime("%H:%M:%S")
        try:
            status = self._fetch(self.url)
        except (OSError, ValueError) as exc:
            reason = _reason(exc)
            return _waiting(self.url, reason, at), reason
        now = self._clock()
        counts = status.get("counts")
        rates: Rates | None = None
        if isinstance(counts, dict):
            if self._before is not None:
                then, old = self._before
                rates = _rates(counts, old, now - then)
            self._before = (now, counts)
        return render(status, rates, self.url, at), None

    def frame(self) -> Group:
        """Poll once and return what to show."""
        return self.poll()[0]

    def run(self, console: Console, *, once: bool = False) -> int:
        """Show frames until SIGINT or SIGTERM (``once``: see the module docstring); returns the
        exit status: 0, or 1 when ``once`` got no status."""
        if once:
            return self._once(console)
        with self._stopped_by_signals():
            if console.is_terminal:
                self._live(console)
            else:
                self._plain(console)
        return 0

    def _once(self, console: Console) -> int:
        shown, failed = self.poll()
        if failed is None and self._before is not None:  # counts: a second poll gives their rates
            self._sleep(self.interval_s)
            second, failed = self.poll()
            shown = shown if failed is not None else second
        if failed is not None:
            print(f"ragguard top: no status from {self.url}: {failed}", file=sys.stderr)
            return 1
        console.print(shown)
        return 0

    def _live(self, console: Console) -> None:
        from rich.live import Live

        with Live(self.frame(), console=console, auto_refresh=False, screen=False) as live:
            while self._wait():
                live.update(self.frame(), refresh=True)

    def _plain(self, console: Console) -> None:
        said = None
        while True:
            shown, failed = self.poll()
            if failed is None or failed != said:
                console.print(shown)
                console.print()
            said = failed
            if not self._wait():
                return

    def _wait(self) -> bool:
        """Sleep one interval, in short steps so a stop is seen soon; False once told to stop."""
        left = self.interval_s
        while left > 0 and not self._stopping:
            step = min(left, 0.05)
            self._sleep(step)
            left -= step
        return not self._stopping

    @contextmanager
    def _stopped_by_signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM ask the loop to stop after the frame being drawn (a second one
        interrupts at once); outside the main thread (a test) nothing is installed."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def stop(signum: int, frame: Any) -> None:
            if self._stopping:
                raise KeyboardInterrupt
            self._stopping = True

        before = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        except KeyboardInterrupt:
            pass
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)[:60]
    return f"{type(exc).__name__}: {str(exc)[:60]}"
