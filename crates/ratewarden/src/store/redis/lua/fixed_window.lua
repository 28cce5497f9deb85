-- fixed_window (algorithm/fixed_window.rs)
-- p1 limit, p2 window; st[1] window start, st[2] count.
local A = {}

function A.check(p, st, cost)
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
end

function A.charge(p, st, cost)
  local start = now - now % p[2]
  if st[1] ~= start then st[1] = start; st[2] = 0 end
  st[2] = math.min(st[2] + cost, p[1])
end

function A.refund(p, st, cost)
  if st[1] == now - now % p[2] then st[2] = sat_sub(st[2], cost) end
end

function A.idle(p, st) return st[1] + p[2] end

return A
