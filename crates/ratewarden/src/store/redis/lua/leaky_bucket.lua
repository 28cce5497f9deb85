-- leaky_bucket (algorithm/leaky_bucket.rs), a fluid level (prelude):
-- p1 unit, p2 rate, p3 capacity, p4 max_delay (-1 = reject mode);
-- st[1] level, st[2] last.
local A = {}

function A.check(p, st, cost)
  local unit, rate, capacity, max_delay = p[1], p[2], p[3], p[4]
  local level = drained(p, st)
  local need = cost * unit
  local delay = 0
  if max_delay >= 0 then delay = ceil_div(level, rate) end
  local fits = level + need <= capacity
  local delay_ok = max_delay < 0 or delay <= max_delay
  if fits and delay_ok then
    local after = level + need
    local c = allow(idiv(capacity - after, unit), ceil_div(after, rate))
    c[5] = delay
    return c
  end
  local retry = NEVER
  if need <= capacity then
    local over = sat_sub(level + need, capacity)
    if max_delay >= 0 then
      local over_delay = sat_sub(level, max_delay * rate)
      if over_delay > over then over = over_delay end
    end
    retry = ceil_div(over, rate)
  end
  return deny(idiv(capacity - level, unit), ceil_div(level, rate), retry)
end

A.charge = fluid_charge
A.refund = fluid_refund
A.idle = fluid_idle

return A
