-- sliding_window_log (algorithm/sliding_window_log.rs)
-- p1 limit, p2 window; st[1] summed cost of the log, st[2] last member
-- number, st[3] the newest entry's time (0: none). The log, oldest first:
-- - while it has at most SMALL entries, in the state itself: st.tail,
--   (time, cost) pairs of little-endian doubles after the six fields
--   (rule.lua's load and store), so a decision on a key with a short log
--   is a GET and a SET, as for the O(1) algorithms (BENCHMARKS.md);
-- - past that, the zset st.log, score = µs, member (seq, cost) as two
--   big-endian doubles (entry, below), until the state is next written
--   with no entries. The state then lives in the zset too (st.z), as one
--   member scored -inf: the zset's expiry in ms and the state's fields
--   (store_log); the string is LOGGED. One read (ZRANGEBYSCORE
--   -inf..now-window) brings the state and the entries that left; one
--   ZREMRANGEBYRANK removes both; one ZADD writes both; the expiries are
--   set only when their millisecond moves. On a hot key that is a GET and
--   3 zset calls a decision, where a state string beside the zset took 6
--   calls (BENCHMARKS.md). Keeping the newest time in the state spares a
--   ZRANGE per charge and per expiry.
local A = {}
A.uses_log = true

-- An entry's member: its number and cost as big-endian doubles, the cost
-- left out where it is 1 (most entries). Equal scores order members by
-- their bytes, and for positive doubles those sort as the numbers do: by
-- number, as "%015d:%d" did. Packing and unpacking cost Redis a third of
-- formatting and matching (BENCHMARKS.md).
local function entry(seq, cost)
  if cost == 1 then return struct.pack('>d', seq) end
  return struct.pack('>dd', seq, cost)
end
local function entry_cost(m)
  if #m == 8 then return 1 end
  return (struct.unpack('>d', m, 9))
end
local SMALL = 4
-- Ranks as the strings Redis is given (a number argument would be
-- printed with "%.17g").
local RANKS = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11', '12', '13', '14', '15'}

-- A LOGGED state, from its zset `log` (rule.lua's load): the table made
-- with every field a long log sets (a field added later can grow its hash
-- part: a rehash). The expired entries' summed cost comes with it (gone's
-- cache), and how many they are (ranks: the charge removes them by rank).
function A.load_log(p, log)
  local got = redis.call('ZRANGEBYSCORE', log, '-inf', string.format('%d', now - p[2]))
  local s = got[1]
  if not s then
    -- (Never written so: read as fresh.)
    return {0, 0, 0, 0, 0, 0, log = log}
  end
  local g = 0
  for i = 2, #got do g = g + entry_cost(got[i]) end
  local ms, s1, s2, s3, s4, s5, s6
  if #s == 32 then
    ms, s1, s2, s3 = struct.unpack('<dddd', s)
    s4, s5, s6 = 0, 0, 0
  else
    ms, s1, s2, s3, s4, s5, s6 = struct.unpack('<ddddddd', s)
  end
  return {s1, s2, s3, s4, s5, s6, log = log, z = true, zs = s, ms = ms, gone = g,
          ranks = #got - 1, m = false}
end

-- Writes a state that lives in the zset (rule.lua's store; ms its expiry
-- in ms): the state's member replaced, the entry a charge left (st.m, its
-- member; its time is the newest, st[3]) added in the same ZADD; the
-- expiry of the zset and of the key's LOGGED string moved together, only
-- when its millisecond does. The state's member: the expiry, then the
-- state's fields, little-endian doubles: the algorithm's three, and the
-- marks' three only where one is not zero (a rule with min_interval or a
-- penalty).
function A.store_log(st, key, ms)
  -- The old member, unless a charge removed it with the entries that left.
  if st.zs then redis.call('ZREM', st.log, st.zs) end
  local s
  if st[4] == 0 and st[5] == 0 and st[6] == 0 then
    s = struct.pack('<dddd', ms, st[1], st[2], st[3])
  else
    s = struct.pack('<ddddddd', ms, st[1], st[2], st[3], st[4], st[5], st[6])
  end
  if st.m then
    redis.call('ZADD', st.log, '-inf', s, string.format('%d', st[3]), st.m)
  else
    redis.call('ZADD', st.log, '-inf', s)
  end
  if st.ms ~= ms then
    local at = string.format('%d', ms)
    redis.call('PEXPIREAT', st.log, at)
    if st.spilled then
      -- Spilled from the string this call: the string becomes LOGGED.
      redis.call('SET', key, LOGGED, 'PXAT', at)
    else
      redis.call('PEXPIREAT', key, at)
    end
  end
end

-- The packing of 1 to SMALL entries (literals: the library's top level
-- runs where Redis gives it no `string`).
local PAIRS = {'<dd', '<dddd', '<dddddd', '<dddddddd'}

-- The tail's entries as one flat list {t1, c1, t2, c2, ...}, read once.
local function small(st)
  local e = st.e
  if not e then
    local tail = st.tail
    if tail and tail ~= '' then
      e = {struct.unpack(PAIRS[#tail / 16], tail)}
      e[#e] = nil -- (unpack's last value: the position after)
    else
      e = {}
    end
    st.e = e
  end
  return e
end

-- Writes a list of at most SMALL entries back as the tail.
local function set_small(st, e)
  st.e = e
  if #e == 0 then
    st.tail = ''
  else
    st.tail = struct.pack(PAIRS[#e / 2], unpack(e))
  end
end

-- The summed cost of the entries that have left the window (t <= now -
-- window), and how many of the tail's they are (st.ng), kept as st.gone:
-- callers read that first, so a check and the charge that follows it
-- share one count. A log in the zset has it from load_log, read with the
-- state (a charge removes those entries: none have left after it).
local function gone(p, st)
  local g = 0
  if st.tail then
    local e, cut, k = small(st), now - p[2], 0
    while k < #e and e[k + 1] <= cut do
      g = g + e[k + 2]
      k = k + 2
    end
    st.ng = k / 2
  end
  st.gone = g
  return g
end

function A.check(p, st, cost)
  local limit, w = p[1], p[2]
  local used = st[1] - (st.gone or gone(p, st))
  if cost <= limit and used + cost <= limit then
    return allow(limit - used - cost, w)
  end
  local reset = 0
  if st[3] > 0 then reset = sat_sub(st[3] + w, now) end
  local retry = NEVER
  if cost <= limit then
    -- The live entries, oldest first: once enough have left, it fits.
    local left = used
    if st.z then
      local live = redis.call('ZRANGEBYSCORE', st.log, '(' .. string.format('%d', now - w), '+inf', 'WITHSCORES')
      for i = 1, #live, 2 do
        left = left - entry_cost(live[i])
        if left + cost <= limit then
          retry = tonumber(live[i + 1]) + w - now
          break
        end
      end
    else
      local e = small(st)
      for i = 1, #e, 2 do
        if e[i] > now - w then
          left = left - e[i + 1]
          if left + cost <= limit then
            retry = e[i] + w - now
            break
          end
        end
      end
    end
  end
  return deny(sat_sub(limit, used), reset, retry)
end

function A.charge(p, st, cost)
  local limit, w = p[1], p[2]
  local zset = st.z
  local g = st.gone or gone(p, st)
  st.gone = nil
  if zset and g == st[1] then
    -- Every entry has left: the zset goes (the state's member with it),
    -- and the log starts again in the tail, the state in its string.
    redis.call('DEL', st.log)
    zset, st.e, st.ng, st.z, st.zs = false, {}, 0, false, false
  end
  -- Keep the log in time order; each charge is its own entry, so two
  -- requests in the same microsecond are two entries.
  local at = now
  if st[3] > at then at = st[3] end
  st[3] = at
  st[2] = st[2] + 1
  st[1] = st[1] - g + cost
  if zset then
    -- The state's old member and the entries that left, in one call: the
    -- lowest ranks (integers: Redis parses no score); the new entry is
    -- added with the new state (store_log).
    local k = st.ranks
    redis.call('ZREMRANGEBYRANK', st.log, '0', RANKS[k + 1] or string.format('%d', k))
    st.zs = nil
    st.m = entry(st[2], cost)
    -- Drop the oldest while the newer ones alone still reach the limit (an
    -- entry costs at least 1: at or under the limit, none can go). The
    -- new entry is the newest and not in the zset yet: with only it left,
    -- none can go either.
    while st[1] > limit do
      local oldest = redis.call('ZRANGE', st.log, '0', '0')
      if not oldest[1] then break end
      local c = entry_cost(oldest[1])
      if st[1] - c < limit then break end
      st[1] = st[1] - c
      redis.call('ZREM', st.log, oldest[1])
    end
    return
  end
  -- The tail, this entry after it; kept from `first` on: past the
  -- expired entries, then past those the same dropping lets go.
  local live = small(st)
  live[#live + 1], live[#live + 2] = at, cost
  local first = 2 * (st.ng or 0) + 1
  while st[1] > limit and first < #live - 1 and st[1] - live[first + 1] >= limit do
    st[1] = st[1] - live[first + 1]
    first = first + 2
  end
  if first > 1 then
    local kept = {}
    for i = first, #live do kept[#kept + 1] = live[i] end
    live = kept
  end
  if #live <= 2 * SMALL then
    set_small(st, live)
    return
  end
  -- Too many for the tail: all of them to the zset, numbered in order.
  local args, seq = {}, st[2] - #live / 2
  for i = 1, #live, 2 do
    seq = seq + 1
    args[#args + 1] = string.format('%d', live[i])
    args[#args + 1] = entry(seq, live[i + 1])
  end
  redis.call('ZADD', st.log, unpack(args))
  st.tail, st.e, st.z, st.spilled = nil, nil, true, true
end

-- The newest entries taken out of the log (the last partly).
function A.refund(p, st, cost)
  local left = cost
  if st.z then
    -- (Entries score 0 or more: the state's member, at -inf, is never one.)
    while left > 0 do
      local newest = redis.call('ZREVRANGEBYSCORE', st.log, '+inf', '0', 'WITHSCORES', 'LIMIT', '0', '1')
      if not newest[1] then break end
      local c = entry_cost(newest[1])
      redis.call('ZREM', st.log, newest[1])
      if c <= left then
        st[1] = st[1] - c
        left = left - c
      else
        st[2] = st[2] + 1
        redis.call('ZADD', st.log, tonumber(newest[2]), entry(st[2], c - left))
        st[1] = st[1] - left
        left = 0
      end
    end
    local newest = redis.call('ZREVRANGEBYSCORE', st.log, '+inf', '0', 'WITHSCORES', 'LIMIT', '0', '1')
    st[3] = tonumber(newest[2]) or 0
    if st[1] == 0 then
      -- No entries left: the zset goes, the state back to its string.
      redis.call('DEL', st.log)
      st.z, st.zs, st.tail = false, false, ''
    end
    return
  end
  local e = small(st)
  while left > 0 and #e > 0 do
    local c = e[#e]
    if c <= left then
      st[1] = st[1] - c
      left = left - c
      local n = #e
      e[n], e[n - 1] = nil, nil
    else
      e[#e] = c - left
      st[1] = st[1] - left
      left = 0
    end
  end
  st[3] = e[#e - 1] or 0
  set_small(st, e)
end

function A.idle(p, st)
  if st[3] > 0 then return st[3] + p[2] end
  return 0
end

return A
