-- sliding_window_counter (algorithm/sliding_window_counter.rs)
-- p1 limit, p2 window, p3 tick; st[1] window start, st[2] previous
-- window's count, st[3] this window's count.
local A = {}

function A.check(p, st, cost)
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
end

-- The window now starts at, and the counts of it and the one before.
local function roll(p, st)
  local window = p[2]
  local start = now - now % window
  if st[1] == start then return start, st[2], st[3] end
  if st[1] + window == start then return start, st[3], 0 end
  return start, 0, 0
end

function A.charge(p, st, cost)
  local start, prev, cur = roll(p, st)
  st[1], st[2], st[3] = start, prev, math.min(cur + cost, p[1])
end

function A.refund(p, st, cost)
  local start, prev, cur = roll(p, st)
  local from_cur = math.min(cur, cost)
  st[1], st[2], st[3] = start, sat_sub(prev, cost - from_cur), cur - from_cur
end

function A.idle(p, st) return st[1] + 2 * p[2] end

return A
