-- sliding_window_log (algorithm/sliding_window_log.rs)
-- p1 limit, p2 window; st[1] summed cost of the log, st[2] last member
-- number, st[3] the newest entry's time (0: none). The log, oldest first:
-- - while it has at most SMALL entries, in the state itself: st.tail,
--   (time, cost) pairs of little-endian doubles after the six fields
--   (rule.lua's load and store), so a decision on a key with a short log
--   is a GET and a SET, as for the O(1) algorithms (BENCHMARKS.md);
-- - past that, the zset st.log, score = µs, member "seq:cost", until the
--   state is next written with no entries.
-- Which one: every entry costs at least 1, so a state with entries (st[1]
-- > 0) and no tail has them in the zset; otherwise they are in the tail
-- (or there are none). Keeping the newest time in the state spares a
-- ZRANGE per charge and per expiry.
local A = {}
A.uses_log = true
local SMALL = 4

local function in_zset(st) return st[1] > 0 and not st.tail end

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
-- window), and how many of the tail's they are (st.ng). Read once per
-- call: a check and the charge that follows it share it. Only a log in
-- the zset costs a call; a missing state has none (a zset is written only
-- with its state and expires with it: store, rule.lua).
local function gone(p, st)
  if st.gone then return st.gone end
  local g = 0
  if in_zset(st) then
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', st.log, '-inf', string.format('%d', now - p[2]))) do
      g = g + member_cost(m)
    end
  elseif st.tail then
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
  local used = st[1] - gone(p, st)
  if cost <= limit and used + cost <= limit then
    return allow(limit - used - cost, w)
  end
  local reset = 0
  if st[3] > 0 then reset = sat_sub(st[3] + w, now) end
  local retry = NEVER
  if cost <= limit then
    -- The live entries, oldest first: once enough have left, it fits.
    local left = used
    if in_zset(st) then
      local live = redis.call('ZRANGEBYSCORE', st.log, '(' .. string.format('%d', now - w), '+inf', 'WITHSCORES')
      for i = 1, #live, 2 do
        left = left - member_cost(live[i])
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
  local zset = in_zset(st)
  local g = gone(p, st)
  st.gone = nil
  if zset and g == st[1] then
    -- Every entry has left: the zset goes, and the log starts again in
    -- the tail.
    redis.call('DEL', st.log)
    zset, st.e, st.ng = false, {}, 0
  end
  -- Keep the log in time order; each charge is its own entry, so two
  -- requests in the same microsecond are two entries.
  local at = now
  if st[3] > at then at = st[3] end
  st[3] = at
  st[2] = st[2] + 1
  st[1] = st[1] - g + cost
  if zset then
    if g > 0 then redis.call('ZREMRANGEBYSCORE', st.log, '-inf', string.format('%d', now - w)) end
    redis.call('ZADD', st.log, string.format('%d', at), member(st[2], cost))
    -- Drop the oldest while the newer ones alone still reach the limit (an
    -- entry costs at least 1: at or under the limit, none can go).
    while st[1] > limit do
      local oldest = redis.call('ZRANGE', st.log, '0', '0')
      if not oldest[1] then break end
      local c = member_cost(oldest[1])
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
    args[#args + 1] = member(seq, live[i + 1])
  end
  redis.call('ZADD', st.log, unpack(args))
  st.tail, st.e = nil, nil
end

-- The newest entries taken out of the log (the last partly).
function A.refund(p, st, cost)
  local left = cost
  if in_zset(st) then
    while left > 0 do
      local newest = redis.call('ZRANGE', st.log, '-1', '-1', 'WITHSCORES')
      if not newest[1] then break end
      local c = member_cost(newest[1])
      redis.call('ZREM', st.log, newest[1])
      if c <= left then
        st[1] = st[1] - c
        left = left - c
      else
        st[2] = st[2] + 1
        redis.call('ZADD', st.log, tonumber(newest[2]), member(st[2], c - left))
        st[1] = st[1] - left
        left = 0
      end
    end
    local newest = redis.call('ZRANGE', st.log, '-1', '-1', 'WITHSCORES')
    st[3] = tonumber(newest[2]) or 0
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
