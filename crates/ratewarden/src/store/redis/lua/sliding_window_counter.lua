-- sliding_window_counter (algorithm/sliding_window_counter.rs)
-- p1 limit, p2 window, p3 tick; st[1] window start, st[2] previous
-- window's count, st[3] this window's count.
local A = {}

-- The rule's constants, kept in its parsed spec (rule.lua's spec_of): p5
-- ticks in a window, p6 the limit in tick units.
function A.prepare(p)
  p[5] = p[2] / p[3]
  p[6] = p[1] * p[5]
end

function A.check(p, st, cost)
  local limit, window, tick, w, lim = p[1], p[2], p[3], p[5], p[6]
  local into = now % window
  local start = now - into
  local prev, cur = 0, 0
  if st[1] == start then prev, cur = st[2], st[3]
  elseif st[1] + window == start then prev = st[3] end
  -- Whole ticks into the window (a multiple of tick divided: exact).
  local elapsed = (into - into % tick) / tick
  local left_in_window = start + window - now
  local estimate = prev * (w - elapsed) + cur * w
  local after = estimate + cost * w
  if cost <= limit and after <= lim then
    -- (lim - after is not negative here: no sat_sub.)
    return allow(idiv(lim - after, w), left_in_window)
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

-- Moves the state to the window now is in: its start, and the counts of
-- it and the one before (in place: no values returned, a little cheaper).
local function roll(p, st)
  local window = p[2]
  local start = now - now % window
  if st[1] == start then return end
  if st[1] + window == start then st[2], st[3] = st[3], 0 else st[2], st[3] = 0, 0 end
  st[1] = start
end

function A.charge(p, st, cost)
  roll(p, st)
  local cur = st[3] + cost
  if cur > p[1] then cur = p[1] end
  st[3] = cur
end

function A.refund(p, st, cost)
  roll(p, st)
  local from_cur = math.min(st[3], cost)
  st[2], st[3] = sat_sub(st[2], cost - from_cur), st[3] - from_cur
end

function A.idle(p, st) return st[1] + 2 * p[2] end

return A
