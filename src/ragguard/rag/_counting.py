"""What a generation stream counts: :func:`count_tokens` (the default counter of its items),
:class:`Usage` (a provider's own report), and a Guard's :func:`token_accounts` (the tenants'
token pacing and quotas, :class:`ragguard.quotas.TokenAccounts`, made once per Guard and shared by
its generation stages)."""

from __future__ import annotations

from typing import Any, Protocol

from ..pipeline import BuildContext
from ..quotas import TokenAccounts

__all__ = ["Usage", "count_tokens", "token_accounts"]


class _Built(Protocol):
    """A Guard, as :func:`token_accounts` reads it: the build context its stages share."""

    @property
    def context(self) -> BuildContext: ...


def count_tokens(item: Any) -> int:
    """The default token count of a stream item: a ``str`` (or ``bytes``) item's length / 4,
    rounded, and at least 1 when it is not empty (the usual rule of thumb for English text and
    GPT-style tokenizers); 0 for an empty one; 1 for an item of any other type (give
    ``@guard(tokens=...)`` a counter for chunk objects)."""
    if isinstance(item, (str, bytes, bytearray)):
        n = len(item)
        return (n + 2) // 4 or (1 if n else 0)
    return 1


class Usage:
    """The token usage a provider reported for a whole stream (OpenAI's ``usage`` chunk,
    Anthropic's ``message_start`` and ``message_delta``): what a ``tokens=`` or ``usage=`` counter
    returns for the item that carries it, instead of an int. ``input_tokens`` / ``output_tokens``
    (ints >= 0, or None: not reported) replace the stage's input estimate and the counted output
    tokens when the stream settles; a stream's later report wins, count by count (a report of the
    output only keeps the input an earlier one gave: :meth:`then`). Returned by ``usage=``, its
    ``output_tokens`` replace the count so far, as an int does (the difference is paced or given
    back); returned by ``tokens=``, the item is paced as 0 tokens."""

    __slots__ = ("input_tokens", "output_tokens")

    def __init__(self, input_tokens: int | None = None, output_tokens: int | None = None) -> None:
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"Usage: {name} must be an int >= 0 or None, got {value!r:.40}")
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens

    def __repr__(self) -> str:
        return f"Usage(input_tokens={self.input_tokens}, output_tokens={self.output_tokens})"

    def then(self, later: Usage) -> Usage:
        """``later``'s counts, and this report's where ``later`` reports none."""
        return Usage(
            self.input_tokens if later.input_tokens is None else later.input_tokens,
            self.output_tokens if later.output_tokens is None else later.output_tokens,
        )


def token_accounts(guard: _Built | BuildContext) -> TokenAccounts:
    """The token accounts of ``guard``'s tenants (created on first use; shared by every stage with
    the generation preset): inspect them in tests and dashboards (``reserved``, ``settled``).
    With ``Guard(backend=RedisBackend(...))``, a :class:`ragguard.redis.RedisTokens` sharing them across
    replicas (``RedisBackend(tokens=...)`` its keyword options)."""
    ctx = _context_of(guard)

    def make() -> TokenAccounts:
        return ctx.share("tokens", TokenAccounts(ctx.quota_of, clock=ctx.clock, sleep=ctx.sleep))

    return ctx.part("tokens", make)


def _context_of(guard: _Built | BuildContext) -> BuildContext:
    return guard if isinstance(guard, BuildContext) else guard.context
