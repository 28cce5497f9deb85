-- sliding_window_log (algorithm/sliding_window_log.rs)
-- p1 limit, p2 window; st[1] summed cost of the log, st[2] last member
-- number, st[3] the newest entry's time (0: none); the log is the zset
-- st.log, score = µs, member "seq:cost". Keeping the newest time in the
-- state spares a ZRANGE per charge and per expiry (BENCHMARKS.md).
local A = {}
A.uses_log = true

-- Entries with t + window <= now, i.e. t <= now - window. Read once per
-- call: a check and the charge that follows it share the list. A state
-- that has never been charged (st[2] = 0: fresh) has no log to read: a
-- log is written only with its state and expires with it (store, rule.lua).
local function expired(p, st)
  if not st.gone then
    if st[2] == 0 then
      st.gone = {}
    else
      st.gone = redis.call('ZRANGEBYSCORE', st.log, '-inf', string.format('%d', now - p[2])) end
  end
  return st.gone
end

function A.check(p, st, cost)
  local limit, w = p[1], p[2]
  local gone = 0
  for _, m in ipairs(expired(p, st)) do gone = gone + member_cost(m) end
  local used = st[1] - gone
  if cost <= limit and used + cost <= limit then
    return allow(limit - used - cost, w)
  end
  local reset = 0
  if st[3] > 0 then reset = sat_sub(st[3] + w, now) end
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
end

function A.charge(p, st, cost)
  local limit, w = p[1], p[2]
  local gone = expired(p, st)
  if #gone > 0 then
    for _, m in ipairs(gone) do st[1] = st[1] - member_cost(m) end
    redis.call('ZREMRANGEBYSCORE', st.log, '-inf', string.format('%d', now - w))
  end
  -- Keep the log in time order; each charge is its own member, so two
  -- requests in the same microsecond are two entries.
  local at = now
  if st[3] > at then at = st[3] end
  st[3] = at
  st[2] = st[2] + 1
  redis.call('ZADD', st.log, string.format('%d', at), member(st[2], cost))
  st[1] = st[1] + cost
  st.gone = nil
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
end

-- The newest entries taken out of the log (the last partly).
function A.refund(p, st, cost)
  local left = cost
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
end

function A.idle(p, st)
  if st[3] > 0 then return st[3] + p[2] end
  return 0
end

return A
