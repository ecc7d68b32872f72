"""The Lua scripts that change shared state in Redis (each runs atomically, EVALSHA).

Breaker keys (one hash tag per breaker, so all of them land in one Redis Cluster slot)::

    {<prefix>:breaker:<name>}:state    HASH  state epoch open_until open_base consecutive reason calls
                                             failures slow pos head trial_calls trial_failures trial_slow
    {<prefix>:breaker:<name>}:window   STRING ring of one byte per outcome code, next write at pos
                                       (count window), or HASH c<i> f<i> s<i> per one-second
                                       bucket i (time window)
    {<prefix>:breaker:<name>}:trials   ZSET  half-open trial lease id -> expiry (clock seconds)

The breaker scripts mirror ``ragguard.breakers.CircuitBreaker`` (the same window arithmetic and
transitions); outcome codes are its ``FAILED | SLOW`` bits. Times are the caller's shared clock
in seconds (wall time by default, so every replica agrees). Every write refreshes the keys' TTL
(``ttl_ms``, lengthened by the time left open); a script that changes nothing writes nothing.

Quota keys (one hash tag per tenant)::

    {<prefix>:quota:<tenant>}:leases   ZSET  lease id (holder:n) -> expiry; one per in-flight call
    {<prefix>:quota:<tenant>}:tat      STRING GCRA theoretical arrival time (seconds)

Rate is the Generic Cell Rate Algorithm (ATM Forum TM 4.0), the same arithmetic as
``ragguard.quotas.LocalQuotas``; concurrency counts the unexpired leases.
"""

from __future__ import annotations

__all__ = [
    "BREAKER_REPORT",
    "BREAKER_SET_STATE",
    "BREAKER_TRIAL_ACQUIRE",
    "BREAKER_TRIAL_DONE",
    "QUOTA_ACQUIRE",
    "QUOTA_RELEASE",
    "QUOTA_RENEW",
]

# ARGV[1..13] are the same for every breaker script; script-specific arguments follow.
_BREAKER_PRELUDE = r"""
local S, W, T = KEYS[1], KEYS[2], KEYS[3]
local now = tonumber(ARGV[1])
local ttl_ms = tonumber(ARGV[2])
local wtype = ARGV[3]
local wsize = tonumber(ARGV[4])
local min_calls = tonumber(ARGV[5])
local f_thr = tonumber(ARGV[6])
local s_thr = tonumber(ARGV[7])
local c_thr = tonumber(ARGV[8])
local permits = tonumber(ARGV[9])
local open_for = tonumber(ARGV[10])
local mult = tonumber(ARGV[11])
local open_max = tonumber(ARGV[12])
local spread = tonumber(ARGV[13])

local function fmt(x) return string.format('%.17g', x) end

local f = redis.call('HMGET', S, 'state', 'epoch', 'open_until', 'open_base', 'consecutive', 'reason',
  'calls', 'failures', 'slow', 'head', 'trial_calls', 'trial_failures', 'trial_slow', 'pos')
local st = {
  state = f[1] or 'closed', epoch = tonumber(f[2]) or 0, open_until = tonumber(f[3]) or 0,
  open_base = tonumber(f[4]) or 0, consecutive = tonumber(f[5]) or 0, reason = f[6] or '',
  calls = tonumber(f[7]) or 0, failures = tonumber(f[8]) or 0, slow = tonumber(f[9]) or 0,
  head = tonumber(f[10]) or -1, trial_calls = tonumber(f[11]) or 0,
  trial_failures = tonumber(f[12]) or 0, trial_slow = tonumber(f[13]) or 0, pos = tonumber(f[14]) or 0,
}
local dirty = false

local function advance(sec)
  if sec <= st.head then return end
  if sec - st.head >= wsize then
    redis.call('DEL', W)
    st.calls, st.failures, st.slow = 0, 0, 0
  else
    for s = st.head + 1, sec do
      local i = s % wsize
      local v = redis.call('HMGET', W, 'c' .. i, 'f' .. i, 's' .. i)
      st.calls = st.calls - (tonumber(v[1]) or 0)
      st.failures = st.failures - (tonumber(v[2]) or 0)
      st.slow = st.slow - (tonumber(v[3]) or 0)
      redis.call('HDEL', W, 'c' .. i, 'f' .. i, 's' .. i)
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
  st.epoch = st.epoch + 1
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
    st.trial_calls, st.trial_failures, st.trial_slow = 0, 0, 0
  elseif new == 'closed' then
    redis.call('DEL', W)
    st.calls, st.failures, st.slow, st.consecutive, st.open_base, st.pos = 0, 0, 0, 0, 0, 0
  end
  dirty = true
end

local function check()
  if st.calls < min_calls then return false end
  if st.failures * 100 >= f_thr * st.calls then
    to_state('open', string.format('failure rate %.1f%% >= %s%%', st.failures * 100 / st.calls, f_thr))
  elseif st.slow * 100 >= s_thr * st.calls then
    to_state('open', string.format('slow-call rate %.1f%% >= %s%%', st.slow * 100 / st.calls, s_thr))
  elseif c_thr > 0 and st.consecutive >= c_thr then
    to_state('open', st.consecutive .. ' consecutive failures')
  else
    return false
  end
  return true
end

local function save()
  if not dirty then return end
  redis.call('HSET', S, 'state', st.state, 'epoch', st.epoch, 'open_until', fmt(st.open_until),
    'open_base', fmt(st.open_base), 'consecutive', st.consecutive, 'reason', st.reason,
    'calls', st.calls, 'failures', st.failures, 'slow', st.slow, 'head', st.head, 'pos', st.pos,
    'trial_calls', st.trial_calls, 'trial_failures', st.trial_failures, 'trial_slow', st.trial_slow)
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
  return {extra, st.state, tostring(st.epoch), fmt(st.open_until), st.reason}
end
"""

BREAKER_REPORT = _BREAKER_PRELUDE + r"""
-- ARGV[14]: the epoch the outcomes were recorded in; ARGV[15]: one byte per outcome code.
-- Codes are applied in order and the rules checked after each, as the in-memory breaker does;
-- the codes after a trip are dropped (the window they belonged to is over).
local expected, codes = tonumber(ARGV[14]), ARGV[15]
local k = #codes
if k > 0 and st.state == 'closed' and st.epoch == expected then
  dirty = true
  local sec = math.floor(now)
  local tc, tf, ts = 0, 0, 0
  if wtype ~= 'count' then advance(sec) end
  local i, tripped = 1, false
  while i <= k and not tripped do
    local m = math.min(wsize, k - i + 1)
    local old = nil
    if wtype == 'count' then old = ring_read(st.pos, m) end
    local n = 0
    for j = 1, m do
      local code = string.byte(codes, i + j - 1)
      local failed, slow = code % 2, math.floor(code / 2)
      if wtype == 'count' then
        if st.calls >= wsize then
          local o = string.byte(old, j)
          st.failures = st.failures - o % 2
          st.slow = st.slow - math.floor(o / 2)
        else
          st.calls = st.calls + 1
        end
      else
        st.calls = st.calls + 1
        tc, tf, ts = tc + 1, tf + failed, ts + slow
      end
      st.failures = st.failures + failed
      st.slow = st.slow + slow
      if failed == 1 then st.consecutive = st.consecutive + 1 else st.consecutive = 0 end
      n = j
      if check() then tripped = true break end
    end
    if wtype == 'count' then
      ring_write(st.pos, string.sub(codes, i, i + n - 1))
      st.pos = (st.pos + n) % wsize
    end
    i = i + n
  end
  if tc > 0 then
    local b = sec % wsize
    redis.call('HINCRBY', W, 'c' .. b, tc)
    if tf > 0 then redis.call('HINCRBY', W, 'f' .. b, tf) end
    if ts > 0 then redis.call('HINCRBY', W, 's' .. b, ts) end
  end
end
save()
return snapshot(#codes)
"""

BREAKER_TRIAL_ACQUIRE = _BREAKER_PRELUDE + r"""
-- ARGV[14]: lease id; ARGV[15]: lease duration (seconds). Returns extra = 1 when granted.
local lease, lease_s = ARGV[14], tonumber(ARGV[15])
if st.state == 'open' and now >= st.open_until then to_state('half_open', 'open duration elapsed') end
local granted = 0
if st.state == 'half_open' then
  redis.call('ZREMRANGEBYSCORE', T, '-inf', fmt(now))
  if permits - st.trial_calls - redis.call('ZCARD', T) > 0 then
    redis.call('ZADD', T, fmt(now + lease_s), lease)
    granted = 1
    dirty = true
  end
end
save()
return snapshot(granted)
"""

BREAKER_TRIAL_DONE = _BREAKER_PRELUDE + r"""
-- ARGV[14]: lease id; ARGV[15]: the epoch it was granted in; ARGV[16]: outcome code, or -1 to
-- give the permit back unrecorded (cancelled, ignored error, unused). Late results of expired
-- leases are dropped: their permit was already handed to another trial.
local lease, epoch, code = ARGV[14], tonumber(ARGV[15]), tonumber(ARGV[16])
local counted = 0
if st.state == 'half_open' and st.epoch == epoch and redis.call('ZREM', T, lease) == 1 then
  dirty = true
  if code >= 0 then
    counted = 1
    st.trial_calls = st.trial_calls + 1
    st.trial_failures = st.trial_failures + code % 2
    st.trial_slow = st.trial_slow + math.floor(code / 2)
    local done = st.trial_calls
    if done >= permits then
      if st.trial_failures * 100 >= f_thr * done then
        to_state('open', st.trial_failures .. ' of ' .. done .. ' trial calls failed')
      elseif st.trial_slow * 100 >= s_thr * done then
        to_state('open', st.trial_slow .. ' of ' .. done .. ' trial calls were slow')
      else
        to_state('closed', done .. ' trial calls passed')
      end
    end
  end
end
save()
return snapshot(counted)
"""

BREAKER_SET_STATE = _BREAKER_PRELUDE + r"""
-- ARGV[14]: closed (reset), forced_open or disabled.
local target = ARGV[14]
if target == 'closed' then
  to_state('closed', 'reset')
else
  to_state(target, target:gsub('_', ' '))
end
save()
return snapshot(1)
"""

QUOTA_ACQUIRE = r"""
-- KEYS[1] leases ZSET, KEYS[2] GCRA tat.
-- ARGV: now (seconds, '' = the server's TIME), lease id, lease_s, max_concurrency (0 = none),
-- rate_per_s (0 = none), burst, wait budget (seconds a rate reservation may wait).
-- Returns {1, 'ok', delay_s} (admitted; start after delay_s) or {0, reason, retry_after_s}.
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(ARGV[1])
end
local lease, lease_s = ARGV[2], tonumber(ARGV[3])
local maxc, rate, burst, budget = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local function fmt(x) return string.format('%.17g', x) end
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now))
  if redis.call('ZCARD', KEYS[1]) >= maxc then
    return {0, 'concurrency', '0'}
  end
end
local delay = 0
if rate > 0 then
  local interval = 1 / rate
  local tat = tonumber(redis.call('GET', KEYS[2])) or now
  if tat < now then tat = now end
  tat = tat + interval
  delay = tat - now - burst * interval
  if delay <= 1e-9 then
    delay = 0
  elseif delay > budget then
    return {0, 'rate', fmt(delay)}
  end
  redis.call('SET', KEYS[2], fmt(tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
end
if maxc > 0 then
  redis.call('ZADD', KEYS[1], fmt(now + lease_s), lease)
  redis.call('PEXPIRE', KEYS[1], math.ceil(lease_s * 2000))
end
return {1, 'ok', fmt(delay)}
"""

QUOTA_RELEASE = r"""
-- KEYS[1] leases ZSET, KEYS[2] GCRA tat. ARGV[1]: lease id; ARGV[2]: seconds of rate to refund
-- (1/rate_per_s for a call cancelled before it ran, else 0).
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
local refund = tonumber(ARGV[2])
if refund > 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('INCRBYFLOAT', KEYS[2], string.format('%.17g', -refund))
end
return removed
"""

QUOTA_RENEW = r"""
-- KEYS[1] leases ZSET. ARGV[1]: now ('' = the server's TIME); ARGV[2]: lease_s; ARGV[3..]: lease
-- ids still held by this replica. XX: a lease that already expired is not brought back.
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(ARGV[1])
end
local lease_s = tonumber(ARGV[2])
local expiry = string.format('%.17g', now + lease_s)
local renewed = 0
for i = 3, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, ARGV[i])
end
if renewed > 0 then redis.call('PEXPIRE', KEYS[1], math.ceil(lease_s * 2000)) end
return renewed
"""
