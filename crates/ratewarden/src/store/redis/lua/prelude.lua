-- ratewarden: every decision on Redis, in one atomic script call.
--
-- Assembled at build time (store/redis/script.rs) from this prelude, one
-- file per algorithm (lua/<algorithm>.lua, each returning its check,
-- charge and idle functions, registered as algo[<id>] with the id of the
-- Rust algorithm table, algorithm/mod.rs) and the rule layer (rule.lua).
-- It is a port of the Rust algorithms and of the rule layer (rule/eval.rs).
-- The Rust code is the specification; the case table
-- (crates/ratewarden/tests/cases.table, run by tests/case_table.rs) runs
-- against both, and they must agree to the microsecond.
--
-- The common call, one op applied, is compact (script::argv_one):
--   KEYS[1]  the op's state; KEYS[2] its zset, only for the algorithms
--            that keep one (sliding_window_log, concurrency)
--   ARGV     'a', the rule's spec, the cost, and (tests only) the time
-- Every other call has the general form:
-- KEYS (two per op, all sharing one cluster hash slot; a grant adds the
-- key's lease hash, holder -> "units until since", after them):
--   KEYS[2i-1]  string: the op's state s1 s2 s3 ml mb mv, each a
--               little-endian double (struct.pack '<d'): s1-s3 the
--               algorithm's, ml last admitted, mb banned until, mv ban level
--               (trailing zero fields left out: 8 bytes read as s1 0 0 0 0 0);
--               in the Lua, st[1]..st[6]; after all six, a
--               sliding_window_log of at most 4 entries keeps them
--               ((time, cost) pairs of doubles) instead of in its zset;
--               a longer one has 'z' here (LOGGED) and its state in the
--               zset
--   KEYS[2i]    zset: sliding_window_log entries past 4 (member: number,
--               and cost where not 1, as big-endian doubles) and then its
--               state (a member scored -inf), or concurrency leases
--               (member "seq:cost")
-- ARGV:
--   ARGV[1]  mode: 0 apply, 1 peek, 2 settle failure, 3 settle success,
--                  4 inspect (first op), 5 release (each op's lease),
--                  6 refund (each op's cost), 7 grant a leased slice of
--                  the first op's key (store/lease: its 8 values after the
--                  op's, see `grant` in rule.lua)
--   ARGV[2]  number of ops
--   ARGV[3]  0, or a time (µs) to use instead of TIME: only for tests that
--            run the case table on a manual clock, and for the test
--            showing what skewed local clocks would do
--   then 3 values per op (see script::argv, script.rs):
--     spec           the rule, one string of 14 integers separated by
--                    commas (parsed once per library load, rule.lua):
--       kind           the algorithm's id in the Rust table
--       p1 p2 p3 p4    algorithm parameters (Algorithm::script_params)
--       min_interval   µs, 0 = none
--       pen_dur pen_mult pen_max pen_mem   penalty (pen_dur 0 = none)
--       failures reset_on_success count_rejected shadow   0/1 flags
--     cost
--     lease          the lease to release (mode 5), else 0
-- Returns, for apply and peek, one string of 7 integers per op, each a
-- little-endian double (struct.pack '<d': one bulk reply is cheaper for
-- Redis than an array of integers, and packing cheaper than formatting):
--   allowed (0/1), reason (0 none, 1 limit, 2 banned, 3 min_interval),
--   remaining, reset_after µs, retry_after µs (-1 = never), delay µs,
--   lease (the concurrency lease taken, 0 = none)
-- except where one op was admitted with no delay and no lease, and
-- remaining < 2^21, reset_after < 2^32 µs: then one integer, remaining x
-- 2^32 + reset_after (cheaper still; `one` in rule.lua, script::reply).
--
-- Time is Redis's own (TIME), in integer microseconds: gateways whose clocks
-- disagree still agree. Lua numbers are doubles, exact to 2^53 µs (285 years);
-- the Rust rule validator keeps every product below that. Numbers are never
-- concatenated into strings (Lua would print 14 digits): they go to redis.call
-- as numbers, which Redis formats exactly, through string.format('%d'), or
-- packed as doubles (the reply).

local NEVER = -1

-- The string of a state kept in its zset (sliding_window_log's long log):
-- it marks the key as logged, so that a missing string still means a
-- fresh key (no zset read) and SCAN ... TYPE string still finds every key.
-- It expires with the zset.
local LOGGED = 'z'

-- The call's time, set first thing by dispatch (rule.lua): the same code
-- runs as one EVAL per call or loaded once as a Redis Function.
local now
local function set_now(at)
  if at and at ~= '0' then
    now = tonumber(at)
  else
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
end

local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function ceil_div(a, b) return idiv(a + b - 1, b) end
local function sat_sub(a, b) if a > b then return a - b end return 0 end

-- A check: allowed, remaining, reset_after, retry_after, delay.
local function allow(rem, reset) return {true, rem, reset, 0, 0} end
local function deny(rem, reset, retry)
  if retry ~= NEVER and retry > reset then reset = retry end
  return {false, rem, reset, retry, 0}
end

-- Zset members "seq:cost" (concurrency leases).
local function member(seq, cost) return string.format('%015d:%d', seq, cost) end
local function member_cost(m) return tonumber(string.match(m, ':(%d+)$')) end

-- A fluid level (token_bucket deficit, leaky_bucket level; algorithm/fluid.rs):
-- p1 unit, p2 rate, p3 capacity; st[1] level, st[2] last.
-- (Comparisons written out rather than sat_sub and math.min: this runs
-- twice a bucket decision, and each call saved is ~1% of its Redis CPU.)
--
-- Unlike the Rust (algorithm/fluid.rs), elapsed time is not first capped at
-- a full drain: that guards a u64 product there, and here a product past
-- 2^53 is only inexact where the level is drained whole anyway (the level
-- is below 2^53, so any exact difference is).
local function drained(p, st)
  local elapsed = now - st[2]
  if elapsed <= 0 then return st[1] end
  local level = st[1] - elapsed * p[2]
  if level < 0 then return 0 end
  return level
end
local function fluid_charge(p, st, cost)
  local level = drained(p, st) + cost * p[1]
  if level > p[3] then level = p[3] end
  st[1] = level
  if now > st[2] then st[2] = now end
end
local function fluid_refund(p, st, cost)
  st[1] = sat_sub(drained(p, st), cost * p[1])
  if now > st[2] then st[2] = now end
end
local function fluid_idle(p, st) return st[2] + ceil_div(st[1], p[2]) end

-- Each algorithm: check(p, st, cost), charge(p, st, cost), idle(p, st), and
-- for concurrency release(p, st, lease, cost). `st` is {s1, s2, s3,
-- log = zset key}; missing fields read as 0 (fresh).
local algo = {}
