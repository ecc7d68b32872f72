"""How the wire servers answer a request that continues a cut answer: as a model asked to
continue does, the rest of their scripted answer after the partial one the request carries,
starting ``repeat`` tokens back (a model told to continue often repeats the end of what it had
written: ragguard trims that)."""

from __future__ import annotations

__all__ = ["rest_of"]


def rest_of(tokens: tuple[str, ...], partial: str, repeat: int = 0) -> tuple[str, ...]:
    """The pieces of the answer ``"".join(tokens)`` that follow ``partial`` (the answer so far,
    its trailing whitespace perhaps stripped, as an Anthropic prefill must be), from ``repeat``
    whole tokens before its end; ValueError when ``partial`` does not begin that answer."""
    full = "".join(tokens)
    if not full.startswith(partial):
        raise ValueError(f"the partial answer {partial[:60]!r} does not begin {full[:60]!r}")
    pos = len(partial)
    starts = [0]
    for token in tokens:
        starts.append(starts[-1] + len(token))
    n = max(i for i, at in enumerate(starts) if at <= pos)  # the token `partial` ends in (or after)
    if repeat > 0:
        return tuple(tokens[max(0, n - repeat) :])
    rest = [full[pos : starts[n + 1]]] if n < len(tokens) and pos < starts[n + 1] else []
    return (*rest, *tokens[n + 1 :])
