-- ratewarden: every decision on Redis, in one atomic script call.
--
-- This is a port of the Rust algorithms (crates/ratewarden/src/algorithm/*.rs)
-- and of the rule layer (rule.rs: verdict, commit, settle, idle_at). The Rust
-- code is the specification; tests/redis_cases.rs runs one table of cases
-- against both and they must agree to the microsecond.
--
-- KEYS (two per op, all sharing one cluster hash slot):
--   KEYS[2i-1]  hash: the op's state   s1 s2 s3 (algorithm) ml (last admitted)
--                                      mb (banned until) mv (ban level)
--   KEYS[2i]    zset: sliding_window_log entries, score = µs, member "seq:cost"
-- ARGV:
--   ARGV[1]  mode: 0 apply, 1 peek, 2 settle failure, 3 settle success,
--                  4 inspect (first op)
--   ARGV[2]  number of ops
--   ARGV[3]  0, or a time (µs) to use instead of TIME: only for tests that
--            run the shared case table on a manual clock, and for the test
--            showing what skewed local clocks would do
--   then 15 values per op:
--     kind (1 fixed_window, 2 sliding_window_log, 3 sliding_window_counter,
--           4 token_bucket, 5 leaky_bucket, 6 gcra)
--     p1 p2 p3 p4    algorithm parameters (see `params_of` in redis.rs)
--     min_interval   µs, 0 = none
--     pen_dur pen_mult pen_max pen_mem   penalty (pen_dur 0 = none)
--     failures reset_on_success count_rejected shadow   0/1 flags
--     cost
-- Returns, for apply and peek, 6 integers per op:
--   allowed (0/1), reason (0 none, 1 limit, 2 banned, 3 min_interval),
--   remaining, reset_after µs, retry_after µs (-1 = never), delay µs
--
-- Time is Redis's own (TIME), in integer microseconds: gateways whose clocks
-- disagree still agree. Lua numbers are doubles, exact to 2^53 µs (285 years);
-- the Rust rule validator keeps every product below that. Numbers are never
-- concatenated into strings (Lua would print 14 digits): they go to redis.call
-- as numbers, which Redis formats exactly.

local NEVER = -1

local now = tonumber(ARGV[3])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function ceil_div(a, b) return idiv(a + b - 1, b) end
local function sat_sub(a, b) if a > b then return a - b end return 0 end

-- A check: allowed, remaining, reset_after, retry_after, delay.
local function allow(rem, reset) return {true, rem, reset, 0, 0} end
local function deny(rem, reset, retry)
  if retry ~= NEVER and retry > reset then reset = retry end
  return {false, rem, reset, retry, 0}
end

-- ---------------------------------------------------------------- algorithms
-- Each: check(p, st, cost), charge(p, st, cost), idle(p, st).
-- `st` is {s1, s2, s3, log = zset key}; missing fields read as 0 (fresh).

local algo = {}

algo[1] = { -- fixed_window: p1 limit, p2 window
  check = function(p, st, cost)
    local limit, w = p[1], p[2]
    local start = now - now % w
    local used = 0
    if st[1] == start then used = st[2] end
    local reset = start + w - now
    if cost <= limit and used + cost <= limit then
      return allow(limit - used - cost, reset)
    end
    local retry = reset
    if cost > limit then retry = NEVER end
    return deny(sat_sub(limit, used), reset, retry)
  end,
  charge = function(p, st, cost)
    local start = now - now % p[2]
    if st[1] ~= start then st[1] = start; st[2] = 0 end
    st[2] = math.min(st[2] + cost, p[1])
  end,
  idle = function(p, st) return st[1] + p[2] end,
}

-- sliding_window_log: p1 limit, p2 window; st[1] total, st[2] seq.
local function log_expired(p, st)
  -- Entries with t + window <= now, i.e. t <= now - window.
  return redis.call('ZRANGEBYSCORE', st.log, '-inf', now - p[2])
end
local function member_cost(m)
  return tonumber(string.match(m, ':(%d+)$'))
end
algo[2] = {
  check = function(p, st, cost)
    local limit, w = p[1], p[2]
    local expired = 0
    for _, m in ipairs(log_expired(p, st)) do expired = expired + member_cost(m) end
    local used = st[1] - expired
    if cost <= limit and used + cost <= limit then
      return allow(limit - used - cost, w)
    end
    local reset = 0
    local newest = redis.call('ZRANGE', st.log, -1, -1, 'WITHSCORES')
    if newest[2] then reset = sat_sub(tonumber(newest[2]) + w, now) end
    local retry = NEVER
    if cost <= limit then
      local left = used
      local live = redis.call('ZRANGEBYSCORE', st.log, '(' .. string.format('%d', now - w), '+inf', 'WITHSCORES')
      for i = 1, #live, 2 do
        left = left - member_cost(live[i])
        if left + cost <= limit then
          retry = tonumber(live[i + 1]) + w - now
          break
        end
      end
    end
    return deny(sat_sub(limit, used), reset, retry)
  end,
  charge = function(p, st, cost)
    local limit, w = p[1], p[2]
    local expired = log_expired(p, st)
    if #expired > 0 then
      for _, m in ipairs(expired) do st[1] = st[1] - member_cost(m) end
      redis.call('ZREMRANGEBYSCORE', st.log, '-inf', now - w)
    end
    -- Keep the log in time order; each charge is its own member, so two
    -- requests in the same microsecond are two entries.
    local at = now
    local newest = redis.call('ZRANGE', st.log, -1, -1, 'WITHSCORES')
    if newest[2] and tonumber(newest[2]) > at then at = tonumber(newest[2]) end
    st[2] = st[2] + 1
    redis.call('ZADD', st.log, at, string.format('%015d:%d', st[2], cost))
    st[1] = st[1] + cost
    -- Drop the oldest while the newer ones alone still reach the limit.
    while true do
      local oldest = redis.call('ZRANGE', st.log, 0, 0)
      if not oldest[1] then break end
      local c = member_cost(oldest[1])
      if st[1] - c < limit then break end
      st[1] = st[1] - c
      redis.call('ZREM', st.log, oldest[1])
    end
    st.newest = at
  end,
  idle = function(p, st)
    if st.newest then return st.newest + p[2] end
    local newest = redis.call('ZRANGE', st.log, -1, -1, 'WITHSCORES')
    if newest[2] then return tonumber(newest[2]) + p[2] end
    return 0
  end,
}

algo[3] = { -- sliding_window_counter: p1 limit, p2 window, p3 tick
  check = function(p, st, cost)
    local limit, window, tick = p[1], p[2], p[3]
    local w = window / tick
    local start = now - now % window
    local prev, cur = 0, 0
    if st[1] == start then prev, cur = st[2], st[3]
    elseif st[1] + window == start then prev = st[3] end
    local elapsed = idiv(now - start, tick)
    local left_in_window = start + window - now
    local estimate = prev * (w - elapsed) + cur * w
    local lim = limit * w
    if cost <= limit and estimate + cost * w <= lim then
      return allow(idiv(sat_sub(lim, estimate + cost * w), w), left_in_window)
    end
    local retry
    if cost > limit then
      retry = NEVER
    elseif cur + cost <= limit then
      local e = w - idiv((limit - cur - cost) * w, prev)
      retry = start + e * tick - now
    else
      local e = w - idiv((limit - cost) * w, cur)
      retry = start + window + e * tick - now
    end
    return deny(idiv(sat_sub(lim, estimate), w), left_in_window, retry)
  end,
  charge = function(p, st, cost)
    local window = p[2]
    local start = now - now % window
    local prev, cur = 0, 0
    if st[1] == start then prev, cur = st[2], st[3]
    elseif st[1] + window == start then prev = st[3] end
    st[1], st[2], st[3] = start, prev, math.min(cur + cost, p[1])
  end,
  idle = function(p, st) return st[1] + 2 * p[2] end,
}

-- Fluid level (token_bucket deficit, leaky_bucket level): p1 unit, p2 rate,
-- p3 capacity; st[1] level, st[2] last.
local function drained(p, st)
  local elapsed = sat_sub(now, st[2])
  local cap = ceil_div(p[3], p[2])
  if elapsed > cap then elapsed = cap end
  return sat_sub(st[1], elapsed * p[2])
end
local function fluid_charge(p, st, cost)
  st[1] = math.min(drained(p, st) + cost * p[1], p[3])
  if now > st[2] then st[2] = now end
end
local function fluid_idle(p, st) return st[2] + ceil_div(st[1], p[2]) end

algo[4] = { -- token_bucket
  check = function(p, st, cost)
    local unit, rate, capacity = p[1], p[2], p[3]
    local level = drained(p, st)
    local need = cost * unit
    if level + need <= capacity then
      local after = level + need
      return allow(idiv(capacity - after, unit), ceil_div(after, rate))
    end
    local retry = NEVER
    if need <= capacity then retry = ceil_div(level + need - capacity, rate) end
    return deny(idiv(capacity - level, unit), ceil_div(level, rate), retry)
  end,
  charge = fluid_charge,
  idle = fluid_idle,
}

algo[5] = { -- leaky_bucket: p4 max_delay (-1 = reject mode)
  check = function(p, st, cost)
    local unit, rate, capacity, max_delay = p[1], p[2], p[3], p[4]
    local level = drained(p, st)
    local need = cost * unit
    local delay = 0
    if max_delay >= 0 then delay = ceil_div(level, rate) end
    local fits = level + need <= capacity
    local delay_ok = max_delay < 0 or delay <= max_delay
    if fits and delay_ok then
      local after = level + need
      local c = allow(idiv(capacity - after, unit), ceil_div(after, rate))
      c[5] = delay
      return c
    end
    local retry = NEVER
    if need <= capacity then
      local over = sat_sub(level + need, capacity)
      if max_delay >= 0 then
        local over_delay = sat_sub(level, max_delay * rate)
        if over_delay > over then over = over_delay end
      end
      retry = ceil_div(over, rate)
    end
    return deny(idiv(capacity - level, unit), ceil_div(level, rate), retry)
  end,
  charge = fluid_charge,
  idle = fluid_idle,
}

algo[6] = { -- gcra: p1 interval, p2 tolerance, p3 burst; st[1] tat
  check = function(p, st, cost)
    local interval, tolerance, burst = p[1], p[2], p[3]
    local start = math.max(st[1], now)
    local used = start - now
    if cost > burst then
      return deny(idiv(sat_sub(tolerance, used), interval), used, NEVER)
    end
    local new_tat = start + cost * interval
    if new_tat - now <= tolerance then
      return allow(idiv(tolerance - (new_tat - now), interval), new_tat - now)
    end
    return deny(idiv(sat_sub(tolerance, used), interval), used, new_tat - now - tolerance)
  end,
  charge = function(p, st, cost)
    local start = math.max(st[1], now)
    st[1] = math.min(start + cost * p[1], now + p[2])
  end,
  idle = function(p, st) return st[1] end,
}

-- ---------------------------------------------------------------- the rule layer

local FIELDS = 15
local mode = tonumber(ARGV[1])
local nops = tonumber(ARGV[2])

local function rule_of(i)
  local b = 3 + (i - 1) * FIELDS
  local a = function(k) return tonumber(ARGV[b + k]) end
  return {
    kind = a(1), p = {a(2), a(3), a(4), a(5)},
    min_interval = a(6),
    pen_dur = a(7), pen_mult = a(8), pen_max = a(9), pen_mem = a(10),
    failures = a(11) == 1, reset_on_success = a(12) == 1,
    count_rejected = a(13) == 1, shadow = a(14) == 1, cost = a(15),
  }
end

local function load(i)
  local h = redis.call('HMGET', KEYS[2 * i - 1], 's1', 's2', 's3', 'ml', 'mb', 'mv')
  local n = function(v) return tonumber(v) or 0 end
  return {n(h[1]), n(h[2]), n(h[3]), ml = n(h[4]), mb = n(h[5]), mv = n(h[6]),
          log = KEYS[2 * i]}
end

local function next_ban(r, st)
  local remembered = st.mb > 0 and now <= st.mb + r.pen_mem
  local level = 0
  if remembered then level = st.mv + 1 end
  local len = r.pen_dur * r.pen_mult ^ level
  if len > r.pen_max then len = r.pen_max end
  return len, level
end

-- Returns {check, reason}: reason 0 none, 1 limit, 2 banned, 3 min_interval.
local function verdict(r, st)
  local c = algo[r.kind].check(r.p, st, r.cost)
  if st.mb > now then
    return {deny(0, c[3], st.mb - now), 2}
  end
  if r.min_interval > 0 and st.ml > 0 and now < st.ml + r.min_interval then
    local wait = st.ml + r.min_interval - now
    local retry = wait
    if not c[1] then
      if c[4] == NEVER or c[4] > wait then retry = c[4] end
    end
    return {deny(c[2], c[3], retry), 3}
  end
  if not c[1] then
    if r.pen_dur > 0 then
      local len = next_ban(r, st)
      c[4] = len
      if len > c[3] then c[3] = len end
    end
    return {c, 1}
  end
  return {c, 0}
end

-- Mirrors Rule::commit; returns whether the state changed.
local function commit(r, st, v, admitted)
  local reason = v[2]
  if reason == 0 then
    if not admitted then return false end
    if not r.failures then algo[r.kind].charge(r.p, st, r.cost) end
    if r.min_interval > 0 then st.ml = now end
    return (not r.failures) or r.min_interval > 0
  end
  if reason == 2 then return false end
  local dirty = false
  if r.count_rejected then
    algo[r.kind].charge(r.p, st, r.cost)
    if r.min_interval > 0 then st.ml = now end
    dirty = true
  end
  if reason == 1 and r.pen_dur > 0 then
    local len, level = next_ban(r, st)
    st.mb = now + len
    st.mv = level
    dirty = true
  end
  return dirty
end

local function idle_at(r, st)
  local at = algo[r.kind].idle(r.p, st)
  if st.ml > 0 then at = math.max(at, st.ml + r.min_interval) end
  if st.mb > 0 then at = math.max(at, st.mb + r.pen_mem) end
  return at
end

-- Writes a state back with an expiry exactly when it reads as fresh again
-- (rounded up to the millisecond). The expiry follows the state: a rejected
-- request that changes nothing moves nothing (seed 004's bug).
local function store(i, r, st)
  local key = KEYS[2 * i - 1]
  local at = idle_at(r, st)
  if at <= now then
    redis.call('DEL', key, st.log)
    return
  end
  redis.call('HSET', key, 's1', st[1], 's2', st[2], 's3', st[3],
             'ml', st.ml, 'mb', st.mb, 'mv', st.mv)
  local ms = ceil_div(at, 1000)
  redis.call('PEXPIREAT', key, ms)
  if r.kind == 2 then redis.call('PEXPIREAT', st.log, ms) end
end

if mode == 0 or mode == 1 then
  local rules, states, verdicts = {}, {}, {}
  local admitted = true
  for i = 1, nops do
    rules[i] = rule_of(i)
    states[i] = load(i)
    verdicts[i] = verdict(rules[i], states[i])
    if verdicts[i][2] ~= 0 and not rules[i].shadow then admitted = false end
  end
  local out = {}
  for i = 1, nops do
    local c, reason = verdicts[i][1], verdicts[i][2]
    if mode == 0 and commit(rules[i], states[i], verdicts[i], admitted) then
      store(i, rules[i], states[i])
    end
    local allowed = 0
    if reason == 0 then allowed = 1 end
    local n = #out
    out[n + 1] = allowed
    out[n + 2] = reason
    out[n + 3] = c[2]
    out[n + 4] = c[3]
    out[n + 5] = c[4]
    out[n + 6] = c[5]
  end
  return out
elseif mode == 2 or mode == 3 then
  for i = 1, nops do
    local r = rule_of(i)
    if r.failures then
      local st = load(i)
      if mode == 2 then
        algo[r.kind].charge(r.p, st, r.cost)
        store(i, r, st)
      elseif r.reset_on_success then
        st[1], st[2], st[3] = 0, 0, 0
        redis.call('DEL', st.log)
        store(i, r, st)
      end
    end
  end
  return {}
elseif mode == 4 then
  local r = rule_of(1)
  local exists = redis.call('EXISTS', KEYS[1])
  local st = load(1)
  local c = algo[r.kind].check(r.p, st, 1)
  local ban_left = -1
  if st.mb > now then ban_left = st.mb - now end
  return {exists, c[2], c[3], ban_left, st.mv}
end
return redis.error_reply('ratewarden: unknown mode')
