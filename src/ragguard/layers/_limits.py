"""A deployment's limits: requests and tokens per window, taken before a call is sent.

A gate of call scope inside the RAG preset's layers (so it reads the generation meter's estimate
of a stream: :mod:`ragguard.rag._generation`) and outside the retries (a call counts once).
``enter`` takes one request from the ``rpm`` bucket and the call's input and output estimate from
the ``tpm`` bucket, all or none, waiting for nothing: a bucket that cannot take them now refuses the
call with :class:`~ragguard.Overloaded` (``reason`` ``requests`` or ``tokens``, ``retry_after_s``
the wait it would need), before anything is sent, so a fallback or a model group's next deployment
serves it. ``exit`` settles the tokens with what the stream used (the provider's report, else its
count), however it ended.

The buckets are the token accounts' GCRA (:mod:`ragguard.quotas._tokens`): one ledger per Guard,
shared across replicas through its backend (:class:`ragguard.redis.RedisTokens`, one round trip
to take, none to settle), an account per deployment (``deploy/<stage>/<key>/requests|tokens``; a
tenant id cannot contain ``/``). Each key of a keyed stage has its own; the stage's own instance
(unkeyed calls, and the keys past its bound) has one for all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .._errors import ConfigError, Overloaded, QuotaExceeded
from ..options import LimitsPolicy, TenantQuota, key_id
from ..pipeline import WAIT, BuildContext, Call, Scope
from ..quotas import TokenAccounts
from ..quotas._tokens import NOTHING, Reservation, TokenAccount

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

__all__ = ["Ledger", "LimitsGate", "build", "ledger_of"]

_UNLIMITED = TenantQuota()


class Ledger:
    """The deployments' accounts of one Guard: account id -> its bucket's quota (``max_wait_s``
    0: a limit spent refuses at once), and the token accounts that keep the buckets."""

    __slots__ = ("accounts", "quotas")

    def __init__(self, context: BuildContext) -> None:
        self.quotas: dict[str, TenantQuota] = {}
        local = TokenAccounts(self._quota, clock=context.clock, sleep=context.sleep)
        self.accounts: TokenAccounts = context.share("tokens", local)

    def _quota(self, account: str) -> TenantQuota:
        return self.quotas.get(account, _UNLIMITED)

    def add(self, account: str, limit: int | None, window_s: float) -> str | None:
        """Keep ``limit`` per ``window_s`` for ``account`` (None: no such limit); its id or None."""
        if limit is None:
            return None
        self.quotas[account] = TenantQuota(token_quota=limit, token_window_s=window_s, max_wait_s=0.0)
        return account


def ledger_of(context: BuildContext) -> Ledger:
    """The deployments' ledger of a Guard (made on first use)."""
    return context.part("deployment_ledger", lambda: Ledger(context))


class _Limits:
    """One instance's limits (a key's, or a stage's own): its account ids in the ledger."""

    __slots__ = ("ledger", "requests", "tokens")

    def __init__(self, stage: Stage, policy: LimitsPolicy) -> None:
        self.ledger = ledger_of(stage.context)
        base = f"deploy/{key_id(stage.name)}/{'*' if stage.key is None else key_id(stage.key)}"
        self.requests = self.ledger.add(f"{base}/requests", policy.rpm, policy.window_s)
        self.tokens = self.ledger.add(f"{base}/tokens", policy.tpm, policy.window_s)
        stage.on_forget(self.forget)

    def forget(self) -> None:
        for account in (self.requests, self.tokens):
            if account is not None:
                self.ledger.quotas.pop(account, None)


class _Taken:
    __slots__ = ("requests", "tokens")

    def __init__(self) -> None:
        self.requests: tuple[TokenAccount, Reservation] | None = None
        self.tokens: tuple[TokenAccount, Reservation] | None = None


class LimitsGate:
    """Takes a call's request and tokens from its deployment's buckets (see the module docstring)."""

    scope: ClassVar[Scope] = "call"
    __slots__ = ("accounts", "limits", "stage")

    def __init__(self, stage: str, limits: _Limits) -> None:
        self.stage = stage
        self.limits = limits
        self.accounts = limits.ledger.accounts

    def enter(self, call: Call) -> Any:
        if self.accounts.shared:
            return WAIT
        taken = _Taken()
        try:
            for kind in ("requests", "tokens"):
                self._take(call, taken, kind)
        except BaseException:
            self._settle(call, taken, refund=True)
            raise
        return taken

    async def enter_async(self, call: Call) -> Any:
        taken = _Taken()
        try:
            for kind in ("requests", "tokens"):
                account, wanted = self._open(call, kind)
                if account is not None:
                    setattr(taken, kind, (account, NOTHING))
                    reserved = await self._reserve_async(account, wanted, kind)
                    setattr(taken, kind, (account, reserved))
        except BaseException:
            self._settle(call, taken, refund=True)
            raise
        return taken

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        self._settle(call, token, refund=False)
        return None

    # -- the buckets ------------------------------------------------------------------------

    def _open(self, call: Call, kind: str) -> tuple[TokenAccount | None, tuple[int, int]]:
        """The account of ``kind`` and what the call takes from it: (output, input)."""
        name = getattr(self.limits, kind)
        account = None if name is None else self.accounts.open(name)
        if account is None:
            return None, (0, 0)
        if kind == "requests":
            return account, (1, 0)
        record = call.meter  # the generation meter's record: its estimates
        return account, (record.estimate, record.input_tokens)

    def _take(self, call: Call, taken: _Taken, kind: str) -> None:
        account, (output, input_n) = self._open(call, kind)
        if account is None:
            return
        setattr(taken, kind, (account, NOTHING))
        try:
            reservation, _wait = self.accounts.reserve(account, output, input_n)
        except QuotaExceeded as exc:
            raise self._refused(kind, exc) from None
        setattr(taken, kind, (account, reservation))

    async def _reserve_async(self, account: TokenAccount, wanted: tuple[int, int], kind: str) -> Reservation:
        try:
            reservation, _wait = await self.accounts.reserve_async(account, *wanted)
        except QuotaExceeded as exc:
            raise self._refused(kind, exc) from None
        return reservation

    def _refused(self, kind: str, exc: QuotaExceeded) -> Overloaded:
        return Overloaded(self.stage, exc.retry_after_s, kind)

    def _settle(self, call: Call, taken: _Taken, *, refund: bool) -> None:
        accounts = self.accounts
        held = taken.requests
        if held is not None:
            account, reservation = held
            if reservation is not NOTHING:
                accounts.settle(account, reservation, 0 if refund else 1, 0)
            accounts.close(account)
        held = taken.tokens
        if held is not None:
            account, reservation = held
            if reservation is not NOTHING:
                if refund:
                    accounts.settle(account, reservation, 0, 0)
                else:
                    output, input_n = _used(call.meter)
                    accounts.settle(account, reservation, output, input_n)
            accounts.close(account)


def _used(record: Any) -> tuple[int, int | None]:
    """What a generation stream used: (output tokens, input tokens or None for the estimate)."""
    usage = record.reported
    if usage is None:
        return record.tokens, None
    output = record.tokens if usage.output_tokens is None else usage.output_tokens
    return output, usage.input_tokens


def limits_of(stage: Stage) -> _Limits | None:
    """The limits of ``stage`` (a key's instance, or a stage's own), None when it sets none."""
    policy = stage.policy.limits
    if policy is None or not policy.limits_anything:
        return None
    return stage.part("limits", lambda: _Limits(stage, policy))


def build(stage: Stage, bound: Bound) -> LimitsGate | None:
    limits = limits_of(stage)
    if limits is None:
        return None
    if limits.tokens is not None and not (bound.stream and stage.counts_tokens):
        raise ConfigError(
            f"stage {stage.name!r}: limits.tpm counts the tokens of the generation preset's streams, "
            f"and {getattr(bound.fn, '__qualname__', bound.fn)!r:.80} is not one (set only rpm for it, "
            "or guard an async generator in a stage with the generation preset)",
            field="limits.tpm",
        )
    return LimitsGate(stage.name, limits)
