#!/usr/bin/env bash
# Issue 18's first measurement of the script's options, before any of them
# is built into the store: the store's script as EVALSHA (what runs today),
# the same text loaded as a Redis Function (FUNCTION LOAD once, then FCALL:
# its ~30 local functions and tables built once per load, not per call),
# and that Function with each state packed into one string (GET / SET PXAT
# instead of HMGET and HSET + PEXPIREAT), beside the minimal GCRA script of
# bench/redis_cpu.sh. Redis CPU µs per call (INFO cpu), -c 64 -P 16, 100k keys.
#
#   bash bench/redis_script_options.sh [N]      # N=200000 calls per run
set -euo pipefail
N=${1:-200000}
cd "$(dirname "$0")/.."
. bench/lib.sh
install_missing redis-server:redis-server redis-benchmark:redis-tools python3:python3
cargo build --release -q -p ratewarden --example redis_argv
target/release/examples/redis_argv "$WORK/decide.lua" > "$WORK/argv"
# The Function variants, made from the script's text (the same code: only
# `now`, KEYS, ARGV and the mode dispatch move into a registered function).
python3 - "$WORK" <<'PY'
import sys
w = sys.argv[1]
s = open(f"{w}/decide.lua").read()
def sub(a, b):
    global s
    assert a in s, a
    s = s.replace(a, b, 1)
sub("""local now = tonumber(ARGV[3])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end""", """local now
local function set_now()
  now = tonumber(ARGV[3])
  if now == 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
end""")
sub("""local mode = tonumber(ARGV[1])
local nops = tonumber(ARGV[2])""", "local mode, nops")
i = s.index("if mode == 0 or mode == 1 then")
s = s[:i] + """local function dispatch(keys, argv)
KEYS, ARGV = keys, argv
set_now()
mode = tonumber(ARGV[1])
nops = tonumber(ARGV[2])
""" + s[i:] + "\nend\nredis.register_function('rw_fn', dispatch)\n"
open(f"{w}/fn.lua", "w").write("#!lua name=rw_fn\nlocal KEYS, ARGV\n" + s)
sub("""  local h = redis.call('HMGET', KEYS[2 * i - 1], 's1', 's2', 's3', 'ml', 'mb', 'mv')
  local n = function(v) return tonumber(v) or 0 end
  return {n(h[1]), n(h[2]), n(h[3]), ml = n(h[4]), mb = n(h[5]), mv = n(h[6]),
          log = KEYS[2 * i]}""", """  local v = redis.call('GET', KEYS[2 * i - 1])
  if not v then return {0, 0, 0, ml = 0, mb = 0, mv = 0, log = KEYS[2 * i]} end
  local a, b, c, d, e, f = string.match(v, '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+)$')
  return {tonumber(a), tonumber(b), tonumber(c), ml = tonumber(d), mb = tonumber(e),
          mv = tonumber(f), log = KEYS[2 * i]}""")
sub("""  redis.call('HSET', key, 's1', st[1], 's2', st[2], 's3', st[3],
             'ml', st.ml, 'mb', st.mb, 'mv', st.mv)
  local ms = ceil_div(at, 1000)
  redis.call('PEXPIREAT', key, ms)""", """  local ms = ceil_div(at, 1000)
  redis.call('SET', key, string.format('%d %d %d %d %d %d', st[1], st[2], st[3], st.ml, st.mb, st.mv), 'PXAT', ms)""")
open(f"{w}/fn_packed.lua", "w").write(
    ("#!lua name=rw_fn_packed\nlocal KEYS, ARGV\n" + s).replace("register_function('rw_fn'", "register_function('rw_fn_packed'"))
PY
cat > "$WORK/gcra.lua" <<'LUA'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new = tat + interval
if new - now > tolerance then return 0 end
redis.call('SET', KEYS[1], new, 'PX', math.ceil((new - now) / 1000))
return 1
LUA
PORT=$(port)
taskset -c 0 redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$WORK" > /dev/null & PIDS+=($!)
wait_port "$PORT"
cli() { redis-cli -p "$PORT" "$@"; }
cpu() { cli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'; }
SHA=$(cli script load "$(cat "$WORK/decide.lua")")
MINIMAL=$(cli script load "$(cat "$WORK/gcra.lua")")
cli function load "$(cat "$WORK/fn.lua")" > /dev/null
cli function load "$(cat "$WORK/fn_packed.lua")" > /dev/null
us() {
  cli flushall > /dev/null
  local b a
  b=$(cpu)
  taskset -c 1 redis-benchmark -p "$PORT" -c 64 -P 16 -n "$N" -q -r 100000 "$@" > /dev/null
  a=$(cpu)
  printf '%6.2f' "$(echo "($a - $b) * 1000000 / $N" | bc -l)"
}
K='{k:__rand_int__}'
printf 'minimal gcra script: %s us Redis CPU/call\n' "$(us evalsha "$MINIMAL" 1 "$K" 1 1000000)"
printf '%-24s %10s %10s %14s  (us Redis CPU/call)\n' algorithm EVALSHA FCALL 'FCALL packed'
while read -r algo args; do
  # shellcheck disable=SC2086
  printf '%-24s %10s %10s %14s\n' "$algo" \
    "$(us evalsha "$SHA" 2 "$K:s" "$K:s:log" $args)" \
    "$(us fcall rw_fn 2 "$K:s" "$K:s:log" $args)" \
    "$(us fcall rw_fn_packed 2 "$K:s" "$K:s:log" $args)"
done < "$WORK/argv"
