-- token_bucket (algorithm/token_bucket.rs), a fluid level (prelude):
-- p1 unit, p2 rate, p3 capacity; st[1] deficit, st[2] last.
local A = {}

function A.check(p, st, cost)
  local unit, rate, capacity = p[1], p[2], p[3]
  local level = drained(p, st)
  local need = cost * unit
  if level + need <= capacity then
    local after = level + need
    return allow(idiv(capacity - after, unit), ceil_div(after, rate))
  end
  local retry = NEVER
  if need <= capacity then retry = ceil_div(level + need - capacity, rate) end
  return deny(idiv(capacity - level, unit), ceil_div(level, rate), retry)
end

A.charge = fluid_charge
A.refund = fluid_refund
A.idle = fluid_idle

return A
