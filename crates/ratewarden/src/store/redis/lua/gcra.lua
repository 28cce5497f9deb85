-- gcra (algorithm/gcra.rs)
-- p1 interval, p2 tolerance, p3 burst; st[1] theoretical arrival time.
local A = {}

function A.check(p, st, cost)
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
end

function A.charge(p, st, cost)
  local start = math.max(st[1], now)
  st[1] = math.min(start + cost * p[1], now + p[2])
end

function A.refund(p, st, cost)
  if st[1] > now then st[1] = math.max(now, st[1] - cost * p[1]) end
end

function A.idle(p, st) return st[1] end

return A
