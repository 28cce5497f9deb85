-- The rule layer (rule/eval.rs: verdict, commit, settle, idle_at) and the
-- modes of a call.

local FIELDS = 3
-- A state: one string of up to six little-endian doubles, s1 s2 s3 ml mb
-- mv (one GET, one SET ... PXAT: cheaper for Redis than a hash's HMGET,
-- HSET and PEXPIREAT), trailing zero fields left out: most gcra states
-- are s1 alone. Packed rather than written as decimal integers: parsing
-- and printing decimals (strtod, sprintf) cost a two-field state 0.2-0.4
-- us of Redis CPU a decision (BENCHMARKS.md); every value is an integer
-- below 2^53, exact as a double. An algorithm may keep more after the
-- six (then all six are written): sliding_window_log's short log; or keep
-- the state in its zset, the string then just LOGGED (its long log:
-- load_log and store_log).
local PACK = {'<d', '<dd', '<ddd', '<dddd', '<ddddd', '<dddddd'}
-- Zero fields to pad a short state with (a literal: the library's
-- top level runs where Redis gives it no `string`).
local ZEROS = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'

-- A rule's spec arrives as one ARGV string of 14 integers (a rule's
-- fixed part: Redis makes one string per ARGV, so one is cheaper than
-- fourteen), parsed once and kept while the library is loaded (as a
-- Function; run by EVAL the cache starts empty each call). Parsed specs
-- are never changed (the per-call cost and lease come apart), so ops of
-- one call may share one. At most SPECS kept; then it starts afresh.
local SPECS = 1000
local specs, nspecs = {}, 0
local function spec_of(s)
  local r = specs[s]
  if r then return r end
  local v = {}
  for n in string.gmatch(s, '%-?%d+') do v[#v + 1] = tonumber(n) end
  if #v ~= 14 then error('ratewarden: bad rule spec ' .. s) end
  local a = algo[v[1]]
  if not a then error('ratewarden: unknown algorithm in rule spec ' .. s) end
  r = {
    kind = v[1], a = a, p = {v[2], v[3], v[4], v[5]},
    min_interval = v[6],
    pen_dur = v[7], pen_mult = v[8], pen_max = v[9], pen_mem = v[10],
    failures = v[11] == 1, reset_on_success = v[12] == 1,
    count_rejected = v[13] == 1, shadow = v[14] == 1,
  }
  -- An algorithm's constants, computed once per rule.
  if a.prepare then a.prepare(r.p) end
  if nspecs >= SPECS then specs, nspecs = {}, 0 end
  specs[s] = r
  nspecs = nspecs + 1
  return r
end

-- Op i's rule, cost and lease (ARGV: spec, cost, lease).
local function rule_of(i)
  local b = 3 + (i - 1) * FIELDS
  return spec_of(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
end

-- Op i's state under rule r: {s1, s2, s3, ml, mb, mv, log = its zset
-- where the call names one, tail = any bytes after the six fields
-- (sliding_window_log's short log)}; a missing state reads as zeros. One
-- table with an array part only (the modifier fields by index, not name:
-- a hash part per call cost more). A string of just LOGGED says the state
-- is in the zset (sliding_window_log's long log: its load_log reads it).
local function load(i, r)
  local zset = KEYS[2 * i]
  local v = redis.call('GET', KEYS[2 * i - 1])
  if v == LOGGED then return r.a.load_log(r.p, zset) end
  local st = {0, 0, 0, 0, 0, 0}
  if zset then st.log = zset end
  if not v then return st end
  local n = #v
  if n == 8 then
    st[1] = struct.unpack('<d', v)
  elseif n == 16 then
    st[1], st[2] = struct.unpack('<dd', v)
  elseif n == 24 then
    st[1], st[2], st[3] = struct.unpack('<ddd', v)
  elseif n <= 48 then
    st[1], st[2], st[3], st[4], st[5], st[6] =
      struct.unpack('<dddddd', v .. string.sub(ZEROS, n + 1))
  else
    -- All six fields, then bytes the algorithm keeps (its tail:
    -- sliding_window_log's short log).
    st[1], st[2], st[3], st[4], st[5], st[6] = struct.unpack('<dddddd', v)
    st.tail = string.sub(v, 49)
  end
  return st
end

local function next_ban(r, st)
  local remembered = st[5] > 0 and now <= st[5] + r.pen_mem
  local level = 0
  if remembered then level = st[6] + 1 end
  local len = r.pen_dur * r.pen_mult ^ level
  if len > r.pen_max then len = r.pen_max end
  return len, level
end

-- Returns check, reason: reason 0 none, 1 limit, 2 banned, 3 min_interval
-- (two values, not a table: a table per op per call cost Redis 10%).
local function verdict(r, st, cost)
  local c = r.a.check(r.p, st, cost)
  if st[5] > now then
    return deny(0, c[3], st[5] - now), 2
  end
  if r.min_interval > 0 and st[4] > 0 and now < st[4] + r.min_interval then
    local wait = st[4] + r.min_interval - now
    local retry = wait
    if not c[1] then
      if c[4] == NEVER or c[4] > wait then retry = c[4] end
    end
    return deny(c[2], c[3], retry), 3
  end
  if not c[1] then
    if r.pen_dur > 0 then
      local len = next_ban(r, st)
      c[4] = len
      if len > c[3] then c[3] = len end
    end
    return c, 1
  end
  return c, 0
end

-- Mirrors Rule::commit; returns whether the state changed.
local function commit(r, st, reason, admitted, cost)
  if reason == 0 then
    if not admitted then return false end
    if not r.failures then r.a.charge(r.p, st, cost) end
    if r.min_interval > 0 then st[4] = now end
    return (not r.failures) or r.min_interval > 0
  end
  if reason == 2 then return false end
  local dirty = false
  if r.count_rejected then
    r.a.charge(r.p, st, cost)
    if r.min_interval > 0 then st[4] = now end
    dirty = true
  end
  if reason == 1 and r.pen_dur > 0 then
    local len, level = next_ban(r, st)
    st[5] = now + len
    st[6] = level
    dirty = true
  end
  return dirty
end

-- Writes a state back with an expiry exactly when it reads as fresh again
-- (rounded up to the millisecond). The expiry follows the state: a rejected
-- request that changes nothing moves nothing (seed 004's bug).
local function store(i, r, st)
  local key = KEYS[2 * i - 1]
  -- When it reads as fresh (Rule::idle_at): the algorithm's time, and the
  -- marks' (written out here, not called: this runs on every decision).
  local at = r.a.idle(r.p, st)
  if st[4] > 0 and st[4] + r.min_interval > at then at = st[4] + r.min_interval end
  if st[5] > 0 and st[5] + r.pen_mem > at then at = st[5] + r.pen_mem end
  if at <= now then
    -- (A compact call names no zset where the algorithm keeps none.)
    if st.log then redis.call('DEL', key, st.log) else redis.call('DEL', key) end
    return
  end
  -- As a string: Redis 7.0 writes a number argument with "%.17g", a
  -- floating-point conversion that costs more than an integer's.
  -- (floor of the rounded quotient: exact for at + 999 below 2^53, so the
  -- same as ceil_div without its two calls.)
  local expiry = math.floor((at + 999) / 1000)
  if st.z then
    -- The state is a member of its zset (sliding_window_log's long log).
    r.a.store_log(st, key, expiry)
    return
  end
  local ms = string.format('%d', expiry)
  local tail = st.tail
  if tail and tail ~= '' then
    redis.call('SET', key, struct.pack('<dddddd', st[1], st[2], st[3], st[4], st[5], st[6]) .. tail,
               'PXAT', ms)
    return
  end
  -- Fields up to the last that is not zero.
  local n = 1
  if st[2] ~= 0 then n = 2 end
  if st[3] ~= 0 then n = 3 end
  if st[4] ~= 0 then n = 4 end
  if st[5] ~= 0 then n = 5 end
  if st[6] ~= 0 then n = 6 end
  redis.call('SET', key, struct.pack(PACK[n], st[1], st[2], st[3], st[4], st[5], st[6]),
             'PXAT', ms)
  -- (concurrency's leases; sliding_window_log's log has no zset while its
  -- state is a string.)
  if r.a.uses_log and not r.a.load_log then redis.call('PEXPIREAT', st.log, ms) end
end

-- An op's part of an apply or peek reply: 7 integers as little-endian
-- doubles (see the prelude; exact: every value is below 2^53).
local function reply(c, reason, st)
  local allowed = 0
  if reason == 0 then allowed = 1 end
  return struct.pack('<ddddddd', allowed, reason, c[2], c[3], c[4], c[5], st.lease or 0)
end

-- A lease (store/lease.rs, grant_with, step by step). KEYS[3] holds the
-- key's slices: a hash of holder -> "units until since". ARGV after the op:
-- holder, want, need, held, returned, lifetime, cap, gives_back. The
-- reply is an op's 7 values: allowed, then 0 granted, 1 refused, 4 the
-- lease room is full, 5 only given back; the last value the slice.
local function grant()
  local r, c = rule_of(1)
  local holder = ARGV[7]
  local want, need = tonumber(ARGV[8]), tonumber(ARGV[9])
  local held, returned = tonumber(ARGV[10]), tonumber(ARGV[11])
  local life, cap, gives_back = tonumber(ARGV[12]), tonumber(ARGV[13]), ARGV[14] == '1'
  local hk = KEYS[3]
  local all = redis.call('HGETALL', hk)
  local others, last, mine, since = 0, 0, nil, 0
  for i = 1, #all, 2 do
    local u, t, s = string.match(all[i + 1], '(%d+) (%d+) (%d+)')
    u, t = tonumber(u), tonumber(t)
    if t <= now then
      redis.call('HDEL', hk, all[i])
    elseif all[i] == holder then
      mine, since = u, tonumber(s)
    else
      others = others + u
      if t > last then last = t end
    end
  end
  local kept = 0
  if mine then
    redis.call('HDEL', hk, holder)
    kept = math.min(held, mine)
    local back = math.min(returned, mine - kept)
    -- fixed_window (id 1): only within the window the slice was charged in.
    local w = r.p[2]
    local same = r.kind ~= 1 or idiv(since, w) == idiv(now, w)
    if back > 0 and gives_back and same and redis.call('EXISTS', KEYS[1]) == 1 then
      local st = load(1, r)
      r.a.refund(r.p, st, back * c)
      store(1, r, st)
    end
  end
  local function keep(units)
    if units > 0 then
      redis.call('HSET', hk, holder, string.format('%d %d %d', units, now + life, now))
      if now + life > last then last = now + life end
    end
    if last > 0 then redis.call('PEXPIREAT', hk, ceil_div(last, 1000)) end
  end
  local function answer(code, ch, units)
    local allowed = 0
    if code == 0 then allowed = 1 end
    ch = ch or {false, 0, 0, 0, 0}
    return struct.pack('<ddddddd', allowed, code, ch[2], ch[3], ch[4], ch[5], units)
  end
  if need == 0 then
    keep(kept)
    return answer(5, nil, 0)
  end
  local g = cap - others - kept
  if want < g then g = want end
  if g < need then
    keep(kept)
    return answer(4, nil, 0)
  end
  local st = load(1, r)
  local ch, reason = verdict(r, st, g * c)
  if reason ~= 0 then
    local left = math.floor(ch[2] / c)
    if left >= need and left < g then
      g = left
      ch, reason = verdict(r, st, g * c)
    end
  end
  if reason ~= 0 then
    keep(kept)
    return answer(1, ch, 0)
  end
  commit(r, st, 0, true, g * c)
  store(1, r, st)
  keep(kept + g)
  return answer(0, ch, g)
end

-- One op decided, and recorded if `apply` (most calls): no tables for the
-- call.
--
-- The most common answer (admitted, no delay, no lease, remaining below
-- 2^21 and reset_after below 2^32 us) is one integer, remaining x 2^32 +
-- reset_after: an integer reply costs Redis 0.4 us less than packing and
-- sending the bulk string (BENCHMARKS.md). script::verdicts reads both.
local function one(r, cost, apply)
  local st = load(1, r)
  local c, reason = verdict(r, st, cost)
  if apply and commit(r, st, reason, reason == 0 or r.shadow, cost) then
    store(1, r, st)
  end
  if reason == 0 and c[5] == 0 and not st.lease and c[2] < 2097152 and c[3] < 4294967296 then
    return c[2] * 4294967296 + c[3]
  end
  return reply(c, reason, st)
end

-- One call: its time, its mode, its ops.
local function dispatch()
  if ARGV[1] == 'a' then
    -- The common call, compact (script::argv_one): one op applied. ARGV:
    -- 'a', the rule's spec, the cost, and the time where the caller gives
    -- it (tests); KEYS: the state, and its zset only where the algorithm
    -- keeps one. Each argument is a string Redis makes and Lua interns:
    -- three instead of six, one key instead of two, took 0.8 us off a
    -- decision's Redis CPU (BENCHMARKS.md).
    set_now(ARGV[4])
    return one(spec_of(ARGV[2]), tonumber(ARGV[3]), true)
  end
  set_now(ARGV[3])
  local mode, nops = tonumber(ARGV[1]), tonumber(ARGV[2])
  if (mode == 0 or mode == 1) and nops == 1 then
    local r, cost = rule_of(1)
    return one(r, cost, mode == 0)
  elseif mode == 0 or mode == 1 then
    local rules, costs, states, checks, reasons, first = {}, {}, {}, {}, {}, {}
    local admitted = true
    -- Several ops on one key (an Envoy call naming a descriptor twice)
    -- are decided on their sum, as one charge: the first carries it, the
    -- others copy its verdict. A key's name holds its rule's id, so one
    -- name is one rule on one key (store::memory does the same).
    for i = 1, nops do
      rules[i], costs[i] = rule_of(i)
      first[i] = i
      local k = KEYS[2 * i - 1]
      for j = 1, i - 1 do
        if first[j] == j and KEYS[2 * j - 1] == k then
          first[i] = j
          costs[j] = costs[j] + costs[i]
          break
        end
      end
    end
    for i = 1, nops do
      if first[i] == i then
        states[i] = load(i, rules[i])
        checks[i], reasons[i] = verdict(rules[i], states[i], costs[i])
        if reasons[i] ~= 0 and not rules[i].shadow then admitted = false end
      end
    end
    local out = {}
    for i = 1, nops do
      local j = first[i]
      if j == i and mode == 0 and commit(rules[i], states[i], reasons[i], admitted, costs[i]) then
        store(i, rules[i], states[i])
      end
      out[i] = reply(checks[j], reasons[j], states[j])
    end
    return table.concat(out)
  elseif mode == 2 or mode == 3 then
    for i = 1, nops do
      local r, cost = rule_of(i)
      if r.failures then
        local st = load(i, r)
        if mode == 2 then
          r.a.charge(r.p, st, cost)
          store(i, r, st)
        elseif r.reset_on_success then
          st[1], st[2], st[3], st.tail, st.z, st.zs = 0, 0, 0, nil, nil, nil
          redis.call('DEL', st.log)
          store(i, r, st)
        end
      end
    end
    return {}
  elseif mode == 4 then
    local r = rule_of(1)
    local exists = redis.call('EXISTS', KEYS[1])
    local st = load(1, r)
    local c = r.a.check(r.p, st, 1)
    local ban_left = -1
    if st[5] > now then ban_left = st[5] - now end
    local admits = 0
    if c[1] then admits = 1 end
    return {exists, c[2], c[3], ban_left, st[6], admits}
  elseif mode == 5 then
    for i = 1, nops do
      local r, cost, lease = rule_of(i)
      local release = r.a.release
      if release and lease > 0 then
        local st = load(i, r)
        release(r.p, st, lease, cost)
        store(i, r, st)
      end
    end
    return {}
  elseif mode == 10 then
    -- Charge each op's cost more: its request's answer cost more than its
    -- admission charged (rule/eval.rs settle). Past the limit if need be:
    -- the request has been served. Not concurrency's leases.
    for i = 1, nops do
      local r, cost = rule_of(i)
      if not r.a.holds_leases and cost > 0 then
        local st = load(i, r)
        r.a.charge(r.p, st, cost)
        store(i, r, st)
      end
    end
    return {}
  elseif mode == 9 then
    -- Renew each op's lease: its request is still going (a stream, a
    -- tunnel). A lease lapsed or released stays so.
    for i = 1, nops do
      local r, cost, lease = rule_of(i)
      local renew = r.a.renew
      if renew and lease > 0 and redis.call('EXISTS', KEYS[2 * i - 1]) == 1 then
        local st = load(i, r)
        renew(r.p, st, lease, cost)
        store(i, r, st)
      end
    end
    return {}
  elseif mode == 6 then
    for i = 1, nops do
      local r, cost = rule_of(i)
      local refund = r.a.refund
      if refund and redis.call('EXISTS', KEYS[2 * i - 1]) == 1 then
        local st = load(i, r)
        refund(r.p, st, cost)
        store(i, r, st)
      end
    end
    return {}
  elseif mode == 7 then
    return grant()
  elseif mode == 8 then
    -- A ban an operator set (the admin API): each op's key banned until
    -- now + its `cost` (µs here) at least; a longer ban stays. Its count
    -- is left as it is.
    for i = 1, nops do
      local r, left = rule_of(i)
      local st = load(i, r)
      if st[5] < now + left then st[5] = now + left end
      store(i, r, st)
    end
    return {}
  end
  return redis.error_reply('ratewarden: unknown mode')
end
