-- fixed_window (algorithm/fixed_window.rs)
-- p1 limit, p2 window; st[1] window start, st[2] count.
-- A calendar window (p4 > 0): p2..p3..p4 bound two periods, the one the
-- gateway's time falls in (less a minute) and the next; Redis's time
-- picks (FixedWindow::script_bounds).
local A = {}

local function bounds(p)
  if p[4] > 0 then
    if now < p[3] then return p[2], p[3] end
    return p[3], p[4]
  end
  local start = now - now % p[2]
  return start, start + p[2]
end

function A.check(p, st, cost)
  local limit = p[1]
  local start, stop = bounds(p)
  local used = 0
  if st[1] == start then used = st[2] end
  local reset = stop - now
  if cost <= limit and used + cost <= limit then
    return allow(limit - used - cost, reset)
  end
  local retry = reset
  if cost > limit then retry = NEVER end
  return deny(sat_sub(limit, used), reset, retry)
end

function A.charge(p, st, cost)
  local start = bounds(p)
  if st[1] ~= start then st[1] = start; st[2] = 0 end
  st[2] = math.min(st[2] + cost, p[1])
end

function A.refund(p, st, cost)
  if st[1] == bounds(p) then st[2] = sat_sub(st[2], cost) end
end

function A.idle(p, st)
  if p[4] > 0 then
    if st[1] >= p[3] then return p[4] end
    return p[3]
  end
  return st[1] + p[2]
end

return A
