"""The Lua scripts that change shared state in Redis (each runs atomically, EVALSHA).

Every script touches the keys of one hash tag only, so on Redis Cluster each runs on the one node
that owns the tag's slot. Times are seconds; ``now`` is the Redis server's ``TIME`` unless the
caller passes one (tests pass a fake clock), so no replica's wall clock is ever trusted.

Breaker keys (``<tag>`` is ``{<prefix>:breaker:<name>}``, the name percent-encoded)::

    <tag>:state          HASH  state epoch open_until open_base consecutive reason calls failures
                               slow rejected pos head trial_calls trial_failures trial_slow
                               trial_rejected
    <tag>:window         STRING ring of one byte per outcome code, next write at pos (count
                               window), or HASH c<i> f<i> s<i> r<i> per one-second bucket i (time
                               window)
    <tag>:trials         ZSET  half-open trial lease id -> expiry
    <tag>:seq:<replica>  STRING the last outcome batch of that replica already applied

The breaker scripts mirror ``ragguard.breakers.CircuitBreaker`` (the same window arithmetic and
transitions); outcome codes are its ``FAILED | SLOW`` bits, or ``REJECTED`` (4) alone: a call the
dependency turned away with a wait, counted by the rejection rate (``r_thr``, 0: off) and left out
of the failure and slow-call rates. Every write refreshes the keys' TTL
(``ttl_ms``, lengthened by the time left open); a script that changes nothing writes nothing.
Every reply is the snapshot ``'extra state epoch open_left_s open_base_s trial_permits_left reason'``,
one string (redis-py parses a bulk string several times faster than an array; the reason, which has
spaces, comes last): the replica keeps durations, never the server's absolute times.

Epochs count state changes. A state's first change moves the epoch from 0 to a random ``birth``
chosen by the replica (< 2^46, exact in Lua's doubles), so tokens from before a Redis restart never
match an epoch after it.

Quota keys (``<tag>`` is ``{<prefix>:quota:<tenant>}``; the tenants that share the unlisted pool
have theirs under the pool's tag, ``{<prefix>:quota:*unlisted}:<tenant>``, next to the pool's own,
so that one script sees both)::

    <tag>:leases   ZSET  lease id (holder:n) -> expiry, one per in-flight call (for a level with a
                         rate and no concurrency limit: recent admissions, so that a cancelled
                         one can have its rate refunded, once); and the member 'tat' -> the GCRA
                         theoretical arrival time (seconds)
    <tag>:queue    ZSET  waiting request id -> arrival time (first come, first served)
    <tag>:qexp     ZSET  waiting request id -> expiry (a waiter that stops asking leaves the queue)
    <tag>:share    HASH  local-lease mode: holder -> demand (requests/s) and expiry

Rate is the Generic Cell Rate Algorithm: :data:`GCRA`, the Lua twin of ``ragguard.quotas._gcra``
(tests/distributed/test_gcra_twin.py steps both alike), used by the quotas here and by the token
scripts of ``_tokens``; concurrency counts the unexpired leases.

Releases are idempotent: a release removes its lease (or grant) and refunds rate only when it
removed something, so a replica can send one again after a lost reply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..breakers import BreakerConfig
from ..quotas._gcra import EPSILON_S

# the scripts (tests load each); the preludes (NOW, GCRA) and BREAKER_OPTION_ARGS are imported by name
__all__ = [
    "BREAKER_REPORT",
    "BREAKER_SET_STATE",
    "BREAKER_TRIAL_ACQUIRE",
    "BREAKER_TRIAL_DONE",
    "PROBE",
    "QUOTA",
    "QUOTA_SHARE",
]

NOW = r"""
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(ARGV[1])
end
"""
"""The prelude of a script that reads the time: ARGV[1], or Redis's own clock when it is empty."""

_NOW = NOW + r"""
local function fmt(x) return string.format('%.17g', x) end
"""


def _text(value: Any) -> str:
    return str(value)


def _int(value: Any) -> str:
    return str(int(value))


def _number(value: Any) -> str:
    return repr(float(value))


def _off(value: float | None) -> str:
    return "0" if value is None else repr(float(value))  # 0: the rule is off


BREAKER_OPTION_ARGS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("wtype", "window_type", _text),
    ("wsize", "window_size", _int),
    ("min_calls", "minimum_calls", _int),
    ("f_thr", "failure_rate_threshold", _number),
    ("s_thr", "slow_call_rate_threshold", _number),
    ("c_thr", "consecutive_failures_threshold", _off),
    ("r_thr", "rejection_rate_threshold", _off),
    ("permits", "half_open_permits", _int),
    ("open_for", "open_for_s", _number),
    ("mult", "open_backoff_multiplier", _number),
    ("open_max", "open_cap_s", _number),
)
"""The options of :class:`~ragguard.breakers.BreakerConfig` the breaker scripts run on, in ARGV
order after the four per-call arguments: the Lua local each becomes, the config attribute it is
read from, and how it is sent. The scripts' prelude is generated from it and
:func:`breaker_option_args` encodes a config by it, so the two cannot disagree; the other options
are the replica's own (``slow_call_duration_s`` and the classifiers decide an outcome's code before
it is sent, ``open_jitter`` is drawn per call as ``spread``), which
tests/distributed/test_shared_breaker.py holds to every field of the config."""


def breaker_option_args(config: BreakerConfig) -> list[bytes]:
    """``config``'s values for the breaker scripts (see :data:`BREAKER_OPTION_ARGS`), encoded."""
    return [encode(getattr(config, attr)).encode() for _, attr, encode in BREAKER_OPTION_ARGS]


def _option_locals() -> str:
    lines = []
    for at, (name, _, encode) in enumerate(BREAKER_OPTION_ARGS, start=5):
        read = f"ARGV[{at}]" if encode is _text else f"tonumber(ARGV[{at}])"
        lines.append(f"local {name} = {read}")
    lines.append(f"local own = {5 + len(BREAKER_OPTION_ARGS)}  -- ARGV[own..]: the script's own arguments")
    return "\n".join(lines) + "\n"


# ARGV[1] now ('': TIME), [2] the keys' TTL (ms), [3] the open time's spread (the jitter drawn by
# the replica), [4] the replica's birth epoch, then the config's options (BREAKER_OPTION_ARGS),
# then from ARGV[own] the script's own arguments.
_BREAKER_PRELUDE = _NOW + r"""
local S, W, T = KEYS[1], KEYS[2], KEYS[3]
local ttl_ms = tonumber(ARGV[2])
local spread = tonumber(ARGV[3])
local birth = tonumber(ARGV[4])
""" + _option_locals() + r"""

local f = redis.call('HMGET', S, 'state', 'epoch', 'open_until', 'open_base', 'consecutive', 'reason',
  'calls', 'failures', 'slow', 'head', 'trial_calls', 'trial_failures', 'trial_slow', 'pos', 'rejected',
  'trial_rejected')
local st = {
  state = f[1] or 'closed', epoch = tonumber(f[2]) or 0, open_until = tonumber(f[3]) or 0,
  open_base = tonumber(f[4]) or 0, consecutive = tonumber(f[5]) or 0, reason = f[6] or '',
  calls = tonumber(f[7]) or 0, failures = tonumber(f[8]) or 0, slow = tonumber(f[9]) or 0,
  head = tonumber(f[10]) or -1, trial_calls = tonumber(f[11]) or 0,
  trial_failures = tonumber(f[12]) or 0, trial_slow = tonumber(f[13]) or 0, pos = tonumber(f[14]) or 0,
  rejected = tonumber(f[15]) or 0, trial_rejected = tonumber(f[16]) or 0,
}
local dirty = false

-- a code's bits: failed, slow, rejected (a rejection is never failed nor slow)
local function bits(code)
  return code % 2, math.floor(code / 2) % 2, math.floor(code / 4)
end

local function advance(sec)
  if sec <= st.head then return end
  if sec - st.head >= wsize then
    redis.call('DEL', W)
    st.calls, st.failures, st.slow, st.rejected = 0, 0, 0, 0
  else
    for s = st.head + 1, sec do
      local i = s % wsize
      local v = redis.call('HMGET', W, 'c' .. i, 'f' .. i, 's' .. i, 'r' .. i)
      st.calls = st.calls - (tonumber(v[1]) or 0)
      st.failures = st.failures - (tonumber(v[2]) or 0)
      st.slow = st.slow - (tonumber(v[3]) or 0)
      st.rejected = st.rejected - (tonumber(v[4]) or 0)
      redis.call('HDEL', W, 'c' .. i, 'f' .. i, 's' .. i, 'r' .. i)
    end
  end
  st.head = sec
end

-- The count window is a ring of bytes in one string: a batch costs a few GETRANGE/SETRANGE
-- calls whatever its size, and the per-code arithmetic runs in Lua.
local function ring_read(pos, m)
  local first = math.min(m, wsize - pos)
  local s = redis.call('GETRANGE', W, pos, pos + first - 1)
  if #s < first then s = s .. string.rep('\0', first - #s) end
  if first < m then
    local rest = redis.call('GETRANGE', W, 0, m - first - 1)
    if #rest < m - first then rest = rest .. string.rep('\0', m - first - #rest) end
    s = s .. rest
  end
  return s
end

local function ring_write(pos, data)
  local m = #data
  if m == 0 then return end
  local first = math.min(m, wsize - pos)
  redis.call('SETRANGE', W, pos, string.sub(data, 1, first))
  if first < m then redis.call('SETRANGE', W, 0, string.sub(data, first + 1)) end
end

local function to_state(new, reason)
  local old = st.state
  st.state = new
  if st.epoch == 0 then st.epoch = birth else st.epoch = st.epoch + 1 end
  st.reason = reason
  redis.call('DEL', T)
  if new == 'open' then
    if old ~= 'half_open' then st.open_base = 0 end
    local base
    if st.open_base == 0 then base = open_for else base = st.open_base * mult end
    if open_max > 0 and base > open_max then base = open_max end
    st.open_base = base
    local d = base * (1 + spread)
    if open_max > 0 and d > open_max then d = open_max end
    st.open_until = now + d
  elseif new == 'half_open' then
    st.trial_calls, st.trial_failures, st.trial_slow, st.trial_rejected = 0, 0, 0, 0
  elseif new == 'closed' then
    redis.call('DEL', W)
    st.calls, st.failures, st.slow, st.consecutive, st.open_base, st.pos = 0, 0, 0, 0, 0, 0
    st.rejected = 0
  end
  dirty = true
end

-- The failure and slow-call rates are of the calls the dependency did not turn away ("served"),
-- the rejection rate of them all.
local function check()
  if st.calls < min_calls then return false end
  local served = st.calls - st.rejected
  if served > 0 and st.failures * 100 >= f_thr * served then
    to_state('open', string.format('failure rate %.1f%% >= %s%%', st.failures * 100 / served, f_thr))
  elseif served > 0 and st.slow * 100 >= s_thr * served then
    to_state('open', string.format('slow-call rate %.1f%% >= %s%%', st.slow * 100 / served, s_thr))
  elseif c_thr > 0 and st.consecutive >= c_thr then
    to_state('open', st.consecutive .. ' consecutive failures')
  elseif r_thr > 0 and st.rejected > 0 and st.rejected * 100 >= r_thr * st.calls then
    to_state('open', string.format('rejection rate %.1f%% >= %s%%', st.rejected * 100 / st.calls, r_thr))
  else
    return false
  end
  return true
end

local function save()
  if not dirty then return end
  redis.call('HSET', S, 'state', st.state, 'epoch', string.format('%d', st.epoch),
    'open_until', fmt(st.open_until), 'open_base', fmt(st.open_base), 'consecutive', st.consecutive,
    'reason', st.reason, 'calls', st.calls, 'failures', st.failures, 'slow', st.slow, 'head', st.head,
    'pos', st.pos, 'trial_calls', st.trial_calls, 'trial_failures', st.trial_failures,
    'trial_slow', st.trial_slow, 'rejected', st.rejected, 'trial_rejected', st.trial_rejected)
  local ttl = ttl_ms
  if st.state == 'open' then
    local left = math.ceil((st.open_until - now) * 1000)
    if left > 0 then ttl = ttl + left end
  end
  redis.call('PEXPIRE', S, ttl)
  redis.call('PEXPIRE', W, ttl)
  redis.call('PEXPIRE', T, ttl)
end

local function snapshot(extra)
  local left, avail = 0, 0
  if st.state == 'open' then left = math.max(0, st.open_until - now) end
  if st.state == 'half_open' then
    avail = permits - st.trial_calls - redis.call('ZCOUNT', T, '(' .. fmt(now), '+inf')
  end
  return string.format('%d %s %d %s %s %d %s', extra, st.state, st.epoch, fmt(left), fmt(st.open_base), avail,
    st.reason)
end
"""

BREAKER_REPORT = _BREAKER_PRELUDE + r"""
-- KEYS[4]: this replica's batch sequence key. ARGV[own]: the epoch the outcomes were recorded in
-- (-1: before the replica first read the state; they count if it is closed); ARGV[own + 1]: one byte
-- per outcome code; ARGV[own + 2]: the batch's sequence number. A batch whose
-- sequence number was already applied is a resend after a lost reply: counted once only.
-- Codes are applied in order and the rules checked after each, as the in-memory breaker does;
-- the codes after a trip are dropped (the window they belonged to is over). A success cannot trip
-- the breaker once the served calls are >= min_calls and every rate is under its threshold (it
-- lowers every rate and ends the run of failures), and neither can the successes after it: such a
-- run of successes, the bulk of a healthy batch, is applied at once with a few string operations.
local expected, codes, seq = tonumber(ARGV[own]), ARGV[own + 1], tonumber(ARGV[own + 2])
local k = #codes
if k > 0 then
  local last = tonumber(redis.call('GET', KEYS[4])) or 0
  if seq <= last then
    k = 0
  else
    redis.call('SET', KEYS[4], string.format('%d', seq), 'PX', ttl_ms)
  end
end
if k > 0 and st.state == 'closed' and (st.epoch == expected or expected == -1) then
  dirty = true
  local sec = math.floor(now)
  local tc, tf, ts, tr = 0, 0, 0, 0
  if wtype ~= 'count' then advance(sec) end
  local function quiet()  -- a success now could trip nothing
    local served = st.calls - st.rejected
    return served >= min_calls and st.failures * 100 < f_thr * served and st.slow * 100 < s_thr * served
      and (r_thr == 0 or st.rejected * 100 < r_thr * st.calls)
  end
  local i, tripped = 1, false
  while i <= k and not tripped do
    if string.byte(codes, i) == 0 and quiet() then
      local r = (string.find(codes, '[^%z]', i) or k + 1) - i  -- the run of successes from i
      st.consecutive = 0
      if wtype == 'count' then
        -- the first `grow` successes fill the window, the others replace its oldest codes (a run
        -- as long as the window replaces every code there was)
        local span = math.min(r, wsize)
        local grow = math.max(0, math.min(r, wsize - st.calls))
        local gone = string.sub(ring_read(st.pos, span), grow + 1)
        st.failures = st.failures - select(2, string.gsub(gone, '[\1\3]', ''))
        st.slow = st.slow - select(2, string.gsub(gone, '[\2\3]', ''))
        st.rejected = st.rejected - select(2, string.gsub(gone, '\4', ''))
        st.calls = st.calls + grow
        ring_write(st.pos, string.rep('\0', span))
        st.pos = (st.pos + r) % wsize
      else
        st.calls = st.calls + r
        tc = tc + r
      end
      i = i + r
    else
      local m = math.min(wsize, k - i + 1)
      local old = nil
      if wtype == 'count' then old = ring_read(st.pos, m) end
      local n = 0
      for j = 1, m do
        local code = string.byte(codes, i + j - 1)
        if code == 0 and j > 1 and quiet() then break end  -- the run of successes goes in bulk
        local failed, slow, rej = bits(code)
        if wtype == 'count' then
          if st.calls >= wsize then
            local of, os, orj = bits(string.byte(old, j))
            st.failures, st.slow, st.rejected = st.failures - of, st.slow - os, st.rejected - orj
          else
            st.calls = st.calls + 1
          end
        else
          st.calls = st.calls + 1
          tc, tf, ts, tr = tc + 1, tf + failed, ts + slow, tr + rej
        end
        st.failures = st.failures + failed
        st.slow = st.slow + slow
        st.rejected = st.rejected + rej
        -- a rejection neither extends nor ends a run of failures
        if failed == 1 then st.consecutive = st.consecutive + 1 elseif rej == 0 then st.consecutive = 0 end
        n = j
        if check() then tripped = true break end
      end
      if wtype == 'count' then
        ring_write(st.pos, string.sub(codes, i, i + n - 1))
        st.pos = (st.pos + n) % wsize
      end
      i = i + n
    end
  end
  if tc > 0 then
    local b = sec % wsize
    redis.call('HINCRBY', W, 'c' .. b, tc)
    if tf > 0 then redis.call('HINCRBY', W, 'f' .. b, tf) end
    if ts > 0 then redis.call('HINCRBY', W, 's' .. b, ts) end
    if tr > 0 then redis.call('HINCRBY', W, 'r' .. b, tr) end
  end
end
save()
return snapshot(k)
"""

BREAKER_TRIAL_ACQUIRE = _BREAKER_PRELUDE + r"""
-- ARGV[own]: lease duration (seconds); ARGV[own + 1..]: lease ids, one per permit wanted (a replica asks
-- once for its whole crowd). Grants the first ones while permits are left; extra = how many.
local lease_s = tonumber(ARGV[own])
if st.state == 'open' and now >= st.open_until then to_state('half_open', 'open duration elapsed') end
local granted = 0
if st.state == 'half_open' then
  redis.call('ZREMRANGEBYSCORE', T, '-inf', fmt(now))
  local left = permits - st.trial_calls - redis.call('ZCARD', T)
  for i = own + 1, #ARGV do
    if left <= 0 then break end
    redis.call('ZADD', T, fmt(now + lease_s), ARGV[i])
    left = left - 1
    granted = granted + 1
  end
  if granted > 0 then dirty = true end
end
save()
return snapshot(granted)
"""

BREAKER_TRIAL_DONE = _BREAKER_PRELUDE + r"""
-- ARGV[own..]: pairs of (lease id, outcome code), the code -1 to give the permit back unrecorded
-- (cancelled, ignored error, unused, or a grant whose reply was lost). A lease still in the ZSET
-- belongs to the current half-open round (every transition deletes the ZSET); a late result of an
-- expired lease is dropped: its permit was already handed to another trial. Idempotent.
local counted = 0
for i = own, #ARGV, 2 do
  local lease, code = ARGV[i], tonumber(ARGV[i + 1])
  if st.state == 'half_open' and redis.call('ZREM', T, lease) == 1 then
    dirty = true
    if code >= 0 then
      counted = counted + 1
      local failed, slow, rej = bits(code)
      st.trial_calls = st.trial_calls + 1
      st.trial_failures = st.trial_failures + failed
      st.trial_slow = st.trial_slow + slow
      st.trial_rejected = st.trial_rejected + rej
      local done = st.trial_calls
      if done >= permits then
        local served = done - st.trial_rejected
        if served > 0 and st.trial_failures * 100 >= f_thr * served then
          to_state('open', st.trial_failures .. ' of ' .. done .. ' trial calls failed')
        elseif served > 0 and st.trial_slow * 100 >= s_thr * served then
          to_state('open', st.trial_slow .. ' of ' .. done .. ' trial calls were slow')
        elseif r_thr > 0 and st.trial_rejected > 0 and st.trial_rejected * 100 >= r_thr * done then
          to_state('open', st.trial_rejected .. ' of ' .. done .. ' trial calls were turned away')
        else
          to_state('closed', done .. ' trial calls passed')
        end
      end
    end
  end
end
save()
return snapshot(counted)
"""

BREAKER_SET_STATE = _BREAKER_PRELUDE + r"""
-- ARGV[own]: closed (reset), forced_open or disabled.
local target = ARGV[own]
if target == 'closed' then
  to_state('closed', 'reset')
else
  to_state(target, target:gsub('_', ' '))
end
save()
return snapshot(1)
"""

GCRA = rf"""
-- GCRA, the arithmetic of ragguard.quotas._gcra: n tokens at now from a bucket whose theoretical
-- arrival time is tat (false or nil: none yet, a full bucket), interval seconds per token and
-- tolerance = burst x interval seconds; gives tat' (to keep when the step is taken) and the wait
-- (<= GCRA_EPSILON: the tokens fit now). gcra_back: tat after n tokens are given back.
local GCRA_EPSILON = {EPSILON_S!r}
local function gcra(tat, now, n, interval, tolerance)
  if not tat or tat < now then tat = now end
  tat = tat + n * interval
  return tat, tat - now - tolerance
end
local function gcra_back(tat, n, interval)
  return tat - n * interval
end
"""
"""The Lua twin of :mod:`ragguard.quotas._gcra`, a prelude of every script that steps a bucket."""

QUOTA = GCRA + r"""
-- One script for a tenant's admissions and for the operations a replica sends alone (releases,
-- renewals, leases put back after an outage). A request counts against one or two levels: the
-- tenant's own quota and the pool it shares with other tenants (a level the other covers is left
-- out by the replica), each with three keys: KEYS[3i-2] L (the lease set: lease id -> expiry, and
-- the member 'tat' scored by the GCRA theoretical arrival time), KEYS[3i-1] Q (the queue: waiter
-- -> arrival), KEYS[3i] X (waiter -> expiry).
--   ARGV[1] the plan, encoded once per tenant: 'lease_s grant_s queue_ttl' then
--           ' maxc interval tolerance' per level (maxc 0: no concurrency limit; interval 0: no
--           rate; else the level's GCRA interval and tolerance, seconds)
--   ARGV[2] the request: 'now id wait_s flags' then ' id op' per operation carried; now '-' = TIME;
--           flags: 1 may queue, 2 id is a lease this replica released (the new request takes over
--           its slot: its release is not sent), 4 refresh the keys' TTL, 8 operations only (no
--           admission); op '+' puts the lease in (or renews it: expiry now + lease_s), a digit
--           releases it: +1 refunds its rate token (once: only if it was still recorded), +2 takes
--           it out of the queues too
-- Returns one string (a bulk reply parses faster than an array): 'ok <delay_s>' (admitted; start
-- after delay_s), 'queued <requests ahead>', 'concurrency <requests ahead>' or 'rate <retry_after_s>'.
-- The common case (one level, a slot and a token free, nobody queued, the release of the last
-- request taken over) is six commands and one write: TIME, ZCARD of the queue, ZSCORE of 'tat',
-- ZCARD of the leases, ZSCORE of the lease taken over, then one ZADD of the lease and 'tat'.
-- Rate-only levels record grants (for refunds) that live grant_s; expired leases, grants and
-- waiters are swept only when they matter. A queued request's place is its arrival on the
-- server's clock (TIME), whatever 'now' says.
local lease_s, grant_s, queue_ttl, spec = string.match(ARGV[1], '(%S+) (%S+) (%S+)(.*)')
lease_s, grant_s, queue_ttl = tonumber(lease_s), tonumber(grant_s), tonumber(queue_ttl)
local now, id, budget, flags, ops = string.match(ARGV[2], '(%S+) (%S+) (%S+) (%S+)(.*)')
if now == '-' then
  local t = redis.call('TIME')
  now = t[1] + t[2] / 1000000
else
  now = tonumber(now)
end
budget, flags = tonumber(budget), tonumber(flags)

-- The common case first, with no table: one level, nothing carried, no TTL to
-- refresh, nobody queued, a slot and a token free, and a key that exists (so it has its TTL). It
-- writes only when it admits; any other case goes on to the general path below, which decides
-- the same way.
do
  local maxc, interval, tolerance, more = string.match(spec, ' (%S+) (%S+) (%S+)(.*)')
  maxc, interval = tonumber(maxc), tonumber(interval)
  if more == '' and ops == '' and flags < 4 and (maxc == 0 or redis.call('ZCARD', KEYS[2]) == 0) then
    local L = KEYS[1]
    local tat = tonumber(redis.call('ZSCORE', L, 'tat'))
    local room, exists = true, tat ~= nil
    if maxc > 0 then
      local held = redis.call('ZCARD', L)
      exists = held > 0
      if tat then held = held - 1 end
      if flags >= 2 and redis.call('ZSCORE', L, id) then held = held - 1 end
      room = maxc - held > 0
    end
    if room and exists then
      local expiry = now + grant_s
      if maxc > 0 then expiry = now + lease_s end
      if interval == 0 then
        redis.call('ZADD', L, expiry, id)
        return 'ok 0'
      end
      local wait
      tat, wait = gcra(tat, now, 1, interval, tonumber(tolerance))
      if wait <= GCRA_EPSILON and tat - now <= lease_s then
        redis.call('ZADD', L, expiry, id, tat, 'tat')
        return 'ok 0'
      end
    end
  end
end

local levels = {}
for maxc, interval, tolerance in string.gmatch(spec, '(%S+) (%S+) (%S+)') do
  local k = 3 * #levels
  levels[#levels + 1] = {L = KEYS[k + 1], Q = KEYS[k + 2], X = KEYS[k + 3], maxc = tonumber(maxc),
    interval = tonumber(interval), tolerance = tonumber(tolerance)}
end

local function tat_of(lv)  -- read once; false when there is none
  if lv.tat == nil then lv.tat = tonumber(redis.call('ZSCORE', lv.L, 'tat')) or false end
  return lv.tat
end

local function extend(key, ms)  -- lengthen a key's TTL to ms, never shorten it
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

local put = false  -- leases put (back): the sets they went into get their TTL refreshed
for lid, op in string.gmatch(ops, '(%S+) (%S+)') do  -- what the replica owes Redis
  if op == '+' then
    put = true
    for _, lv in ipairs(levels) do
      if lv.maxc > 0 then redis.call('ZADD', lv.L, now + lease_s, lid) end
    end
  else
    op = tonumber(op)
    for _, lv in ipairs(levels) do
      local removed = redis.call('ZREM', lv.L, lid)
      if op >= 2 and redis.call('ZREM', lv.Q, lid) == 1 then redis.call('ZREM', lv.X, lid) end
      if op % 2 == 1 and removed == 1 and lv.interval > 0 and tat_of(lv) then
        lv.tat = gcra_back(lv.tat, 1, lv.interval)
        redis.call('ZADD', lv.L, lv.tat, 'tat')
      end
    end
  end
end

if put or (flags >= 8 and flags % 8 >= 4) then  -- the sets outlive the leases put in them
  for _, lv in ipairs(levels) do
    if lv.maxc > 0 then extend(lv.L, math.ceil(lease_s * 2000)) end
  end
end
if flags >= 8 then return 'ok 0' end
local may_queue, reuse, refresh = flags % 2 == 1, flags % 4 >= 2, flags % 8 >= 4

local function held_in(lv)  -- leases in the set, less 'tat' and the lease this request takes over
  local n = redis.call('ZCARD', lv.L)
  lv.card = n
  if tat_of(lv) then n = n - 1 end
  if reuse and redis.call('ZSCORE', lv.L, id) then n = n - 1 end
  return n
end

local ahead, full = 0, false
for _, lv in ipairs(levels) do
  if lv.maxc > 0 then
    local a = 0
    if redis.call('ZCARD', lv.Q) > 0 then  -- waiters first: drop those that stopped asking
      local gone = redis.call('ZRANGEBYSCORE', lv.X, '-inf', now, 'LIMIT', 0, 100)
      for _, w in ipairs(gone) do
        redis.call('ZREM', lv.Q, w)
        redis.call('ZREM', lv.X, w)
      end
      lv.rank = redis.call('ZRANK', lv.Q, id)
      if lv.rank then a = lv.rank else a = redis.call('ZCARD', lv.Q) end
    end
    local held = held_in(lv)
    if lv.maxc - held <= a then  -- full: leases of crashed replicas may have expired
      redis.call('ZREMRANGEBYSCORE', lv.L, '-inf', now)
      lv.tat = nil
      held = held_in(lv)
    end
    if lv.maxc - held <= a then full = true end
    if a > ahead then ahead = a end
  end
end

local function leave()  -- refused: out of every queue, and the slot taken over is given back
  for _, lv in ipairs(levels) do
    if lv.rank then
      redis.call('ZREM', lv.Q, id)
      redis.call('ZREM', lv.X, id)
    end
    if reuse then redis.call('ZREM', lv.L, id) end
  end
end

if full then
  if not may_queue then
    leave()
    return 'concurrency ' .. ahead
  end
  local arrival = nil
  for _, lv in ipairs(levels) do
    if reuse then redis.call('ZREM', lv.L, id) end
    if lv.maxc > 0 then
      if not lv.rank then
        if arrival == nil then
          local t = redis.call('TIME')
          arrival = t[1] + t[2] / 1000000
        end
        redis.call('ZADD', lv.Q, arrival, id)
      end
      redis.call('ZADD', lv.X, now + queue_ttl, id)
      local ttl = math.ceil(queue_ttl * 2000)
      redis.call('PEXPIRE', lv.Q, ttl)
      redis.call('PEXPIRE', lv.X, ttl)
    end
  end
  return 'queued ' .. ahead
end

local delay = 0
for _, lv in ipairs(levels) do
  if lv.interval > 0 then
    local d
    lv.next_tat, d = gcra(tat_of(lv), now, 1, lv.interval, lv.tolerance)
    if d > delay then delay = d end
  end
end
if delay <= GCRA_EPSILON then
  delay = 0
elseif delay > budget then
  leave()
  return 'rate ' .. string.format('%.17g', delay)
end

for _, lv in ipairs(levels) do
  local expiry, horizon = now + lease_s, now + lease_s
  if lv.maxc == 0 then
    expiry = now + grant_s
    if refresh then redis.call('ZREMRANGEBYSCORE', lv.L, '-inf', now) end  -- expired grants
  end
  if lv.interval > 0 then
    redis.call('ZADD', lv.L, expiry, id, lv.next_tat, 'tat')
    if lv.next_tat > horizon then horizon = lv.next_tat end
  else
    redis.call('ZADD', lv.L, expiry, id)
  end
  if lv.rank then
    redis.call('ZREM', lv.Q, id)
    redis.call('ZREM', lv.X, id)
  end
  -- The set outlives what is in it: a new set gets a TTL at once (one lease_s more than its
  -- horizon), and every replica refreshes it at least every lease_s / 2 (flag 4).
  if refresh or lv.card == 0 or (lv.maxc == 0 and not lv.tat) or horizon - now > lease_s then
    extend(lv.L, math.ceil((horizon - now + lease_s) * 1000))
  end
end
if delay == 0 then return 'ok 0' end
return 'ok ' .. string.format('%.17g', delay)
"""

PROBE = r"""
-- The health probe: returns the commands of ARGV (each 'NAME arg ...', '$k' standing for KEYS[1],
-- a key of the component's own hash tag, which no component uses) that the ACL user may not run,
-- '' when it may run them all (redis.acl_check_cmd, Redis >= 7; an older server checks the script
-- and the key only). It also writes, harmlessly (a TTL on a key that does not exist), so that a
-- read-only replica fails it as it fails the scripts.
redis.call('PEXPIRE', KEYS[1], 1)
local denied = {}
if redis.acl_check_cmd then
  for i = 1, #ARGV do
    local parts = {}
    for w in string.gmatch(ARGV[i], '%S+') do
      if w == '$k' then w = KEYS[1] end
      parts[#parts + 1] = w
    end
    if not redis.acl_check_cmd(unpack(parts)) then denied[#denied + 1] = parts[1] end
  end
end
return table.concat(denied, ' ')
"""

QUOTA_SHARE = _NOW + r"""
-- Local-lease mode (after Doorman): a replica borrows a share of a tenant's rate and concurrency
-- for a short time. KEYS[1] leases ZSET, KEYS[2] share HASH (holder -> "demand rate expiry").
-- ARGV: [1] now, [2] holder, [3] period_s (a holder that stops renewing leaves after 2 periods),
-- [4] this holder's demand (requests/s), [5] rate_per_s (0 = none), [6] max_concurrency (0 =
-- none), [7] slots in use here, [8] prefix of new slot ids, [9] '1' when this holder refused
-- requests for want of a slot since its last renewal, [10] n, [11..10+n] the slot ids held.
-- The share is this holder's demand over the total (equal shares while nobody reports any).
-- Rate: the holder gets rate_per_s x share, but never more than what the other live holders'
-- grants leave, so the grants together never exceed rate_per_s (a holder whose share grew gets it
-- once the others have renewed and shrunk: within a period).
-- Slots are real leases in the tenant's lease set, so the replicas together never hold more than
-- max_concurrency: a holder keeps floor(share x max_concurrency) (or what runs here, if more),
-- gives the rest back, and takes free slots up to ceil(share x max_concurrency), or every free
-- slot when it was short of slots (it gives the extra back at its next renewal).
-- Returns {share, rate granted (text), slots kept (the first ones of the list), slots granted
-- (prefix .. 1..g)}.
local leases, shares = KEYS[1], KEYS[2]
local holder, period, demand = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local rate, maxc, in_use, prefix = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local short, n = ARGV[9] == '1', tonumber(ARGV[10])
local total, live, others = demand, 1, 0
local fields = redis.call('HGETALL', shares)
for i = 1, #fields, 2 do
  if fields[i] ~= holder then
    local d, g, exp = string.match(fields[i + 1], '(%S+) (%S+) (%S+)')
    if exp == nil or tonumber(exp) <= now then
      redis.call('HDEL', shares, fields[i])
    else
      total = total + tonumber(d)
      others = others + tonumber(g)
      live = live + 1
    end
  end
end
local share
if total > 0 then share = demand / total else share = 1 / live end
local grant = math.max(0, math.min(rate * share, rate - others))
redis.call('HSET', shares, holder, fmt(demand) .. ' ' .. fmt(grant) .. ' ' .. fmt(now + 2 * period))
redis.call('PEXPIRE', shares, math.ceil(period * 4000))
local kept, granted = 0, 0
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', leases, '-inf', fmt(now))
  local expiry = fmt(now + 2 * period)
  local keep = math.max(in_use, math.floor(maxc * share + 1e-9))
  local take = math.max(keep, math.ceil(maxc * share - 1e-9))
  if short then take = maxc end
  for i = 11, 10 + n do
    if kept < keep and redis.call('ZSCORE', leases, ARGV[i]) then
      redis.call('ZADD', leases, expiry, ARGV[i])
      kept = kept + 1
    else
      redis.call('ZREM', leases, ARGV[i])
    end
  end
  local free = maxc - redis.call('ZCARD', leases)
  if redis.call('ZSCORE', leases, 'tat') then free = free + 1 end  -- the rate's member, not a slot
  while kept + granted < take and free > 0 do
    granted = granted + 1
    free = free - 1
    redis.call('ZADD', leases, expiry, prefix .. granted)
  end
  local ttl = math.ceil(period * 4000)
  if redis.call('PTTL', leases) < ttl then redis.call('PEXPIRE', leases, ttl) end
end
return {fmt(share), fmt(grant), kept, granted}
"""
