-- concurrency (algorithm/concurrency.rs)
-- p1 limit, p2 max_hold, p3 retry hint; st[1] summed cost of the leases,
-- st[2] last lease number; the leases are the zset st.log, score = when
-- the lease lapses (µs), member "lease:cost".
local A = {}
A.uses_log = true
-- Its charges are leases, released when their request ends: never
-- charged more afterwards.
A.holds_leases = true

-- Leases that lapsed: their holder never released them (a crashed
-- gateway, a lost connection to Redis).
local function lapsed(st)
  return redis.call('ZRANGEBYSCORE', st.log, '-inf', string.format('%d', now))
end

function A.check(p, st, cost)
  local limit, hint = p[1], p[3]
  local gone = 0
  for _, m in ipairs(lapsed(st)) do gone = gone + member_cost(m) end
  local held = st[1] - gone
  if cost <= limit and held + cost <= limit then
    return allow(limit - held - cost, p[2])
  end
  local reset = 0
  local last = redis.call('ZRANGE', st.log, '-1', '-1', 'WITHSCORES')
  if last[2] then reset = sat_sub(tonumber(last[2]), now) end
  local retry = NEVER
  if cost <= limit then
    retry = hint
    local left = held
    local live = redis.call('ZRANGEBYSCORE', st.log, '(' .. string.format('%d', now), '+inf', 'WITHSCORES')
    for i = 1, #live, 2 do
      left = left - member_cost(live[i])
      if left + cost <= limit then
        local at = tonumber(live[i + 1]) - now
        if at < retry then retry = at end
        break
      end
    end
  end
  return deny(sat_sub(limit, held), reset, retry)
end

function A.charge(p, st, cost)
  local gone = lapsed(st)
  if #gone > 0 then
    for _, m in ipairs(gone) do st[1] = st[1] - member_cost(m) end
    redis.call('ZREMRANGEBYSCORE', st.log, '-inf', string.format('%d', now))
  end
  st[2] = st[2] + 1
  redis.call('ZADD', st.log, string.format('%d', now + p[2]), member(st[2], cost))
  st[1] = st[1] + cost
  st.lease = st[2]
end

function A.release(p, st, lease, cost)
  if redis.call('ZREM', st.log, member(lease, cost)) == 1 then
    st[1] = st[1] - cost
  end
end

-- A lease still held is pushed back to lapse max_hold from now; one
-- lapsed (its score past) or released (not a member) stays so.
function A.renew(p, st, lease, cost)
  local m = member(lease, cost)
  local at = redis.call('ZSCORE', st.log, m)
  if at and tonumber(at) > now then
    redis.call('ZADD', st.log, 'XX', string.format('%d', now + p[2]), m)
  end
end

function A.idle(p, st)
  local last = redis.call('ZRANGE', st.log, '-1', '-1', 'WITHSCORES')
  if last[2] then return tonumber(last[2]) end
  return 0
end

return A
