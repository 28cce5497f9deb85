#!/usr/bin/env bash
# Load benchmark of the gateway, with nginx as the reference, in one run.
#
#   bash bench/gateway.sh            # DURATION=10s by default
#
# Needs nginx, wrk and redis-server (Debian: nginx-light wrk redis-server);
# installs them with apt-get when missing. Everything listens on 127.0.0.1,
# every load is bounded by DURATION, and every process is stopped at the end.
# Same core budget for both proxies: ratewarden --workers 1, nginx
# worker_processes 1. wrk: 2 threads, 64 connections.
#
#   PIN=1 bash bench/gateway.sh      # the proxy under test alone on CPU 0
#
# With PIN=1 the proxies under test (nginx's worker, every ratewarden) run on
# CPU 0 and everything else (wrk, the origin, Redis) on CPU 1: each proxy
# gets exactly one core and its throughput is its CPU cost per request.
# Without it the scheduler places all processes on both cores as it likes.
#
#   BUDGET=0.5 bash bench/gateway.sh # as PIN=1, the proxies under test
#                                    # limited to half of CPU 0
#
# In both layouts above wrk can be what limits a run: on the rejecting path
# it needs a core of its own to keep up with either proxy. With BUDGET the
# proxies under test share a CFS bandwidth quota of that many cores (a
# cgroup; needs root), so the proxy is the bottleneck and the ratios compare
# the proxies' CPU cost per request. p99 then measures the quota's 100 ms
# throttling periods, not the proxies.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
. bench/lib.sh
under_test() { exec "$@"; }
rest() { exec "$@"; }
LAYOUT="unpinned"
if { [ "${PIN:-0}" = 1 ] || [ -n "${BUDGET:-}" ]; } && [ "$(nproc)" -ge 2 ]; then
  under_test() { exec taskset -c 0 "$@"; }
  rest() { exec taskset -c 1 "$@"; }
  LAYOUT="pinned: proxy under test on CPU 0, wrk/origin/redis on CPU 1"
fi
if [ -n "${BUDGET:-}" ]; then
  cpu_budget "$BUDGET"
  under_test() { in_budget taskset -c 0 "$@"; }
  LAYOUT="budget: proxies under test limited to $BUDGET of CPU 0, wrk/origin/redis on CPU 1"
fi
install_missing nginx:nginx-light wrk:wrk redis-server:redis-server

cargo build --release --bin ratewarden -q
BIN=target/release/ratewarden

UP=$(port); NG_PASS=$(port); NG_REJ=$(port); RW_PASS=$(port); RW_REJ=$(port); RW_ADMIN=$(port); RW_ADMIN2=$(port); RW_R=$(port); RW_RADMIN=$(port); REDIS=$(port); RW_NONE=$(port); RW_ECHO=$(port)

# Two nginx instances: the upstream (its own worker, shared by both proxies)
# and the proxy under test (one worker, like ratewarden --workers 1).
origin_conf "$WORK/origin" "$UP"
# nginx proxying with limit_req at a limit never reached, and with a limit
# that rejects almost everything.
nginx_conf "$WORK/nginx" "$NGX_ZONES
  $(ngx_upstream "$UP")
  $(ngx_proxy "$NG_PASS" "$NGX_OPEN")
  $(ngx_proxy "$NG_REJ" "$NGX_SHUT")"
rest nginx -p "$WORK/origin" -c "$WORK/origin/nginx.conf" & PIDS+=($!)
under_test nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" & PIDS+=($!)
wait_port "$NG_PASS"; wait_port "$UP"

cat > "$WORK/pass.yaml" <<YAML
admin: {listen: 127.0.0.1:$RW_ADMIN}
rules:
  - name: open
    algorithm: gcra
    limit: 1000000
    window: 1s
YAML
cat > "$WORK/reject.yaml" <<YAML
admin: {listen: 127.0.0.1:$RW_ADMIN2}
rules:
  - name: bench
    algorithm: gcra
    limit: 1
    window: 60s
YAML
# The proxy path alone, no rule at all: the ceiling of our HTTP stack.
cat > "$WORK/none.yaml" <<YAML
admin: null
rules: []
YAML
cat > "$WORK/redis.yaml" <<YAML
admin: {listen: 127.0.0.1:$RW_RADMIN}
store: {type: redis, url: "redis://127.0.0.1:$REDIS/0", timeout: 200ms, on_error: deny}
rules:
  - name: bench
    algorithm: gcra
    limit: 1000000
    window: 1s
YAML
rest redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no > /dev/null & PIDS+=($!)
RUST_LOG=warn under_test $BIN serve -c "$WORK/pass.yaml" --listen 127.0.0.1:$RW_PASS --upstream http://127.0.0.1:$UP --workers 1 > /dev/null & PIDS+=($!)
RUST_LOG=off under_test $BIN serve -c "$WORK/reject.yaml" --listen 127.0.0.1:$RW_REJ --upstream http://127.0.0.1:$UP --workers 1 > /dev/null & PIDS+=($!)
RUST_LOG=warn under_test $BIN serve -c "$WORK/none.yaml" --listen 127.0.0.1:$RW_NONE --upstream http://127.0.0.1:$UP --workers 1 > /dev/null & PIDS+=($!)
# Our HTTP server alone: the built-in echo upstream, no rule (vs nginx `return 200`).
RUST_LOG=warn under_test $BIN serve -c "$WORK/none.yaml" --listen 127.0.0.1:$RW_ECHO --upstream echo --workers 1 > /dev/null & PIDS+=($!)
RUST_LOG=warn under_test $BIN serve -c "$WORK/redis.yaml" --listen 127.0.0.1:$RW_R --upstream http://127.0.0.1:$UP --workers 1 > /dev/null & PIDS+=($!)
wait_port "$RW_PASS"; wait_port "$RW_REJ"; wait_port "$RW_R"; wait_port "$REDIS"; wait_port "$RW_NONE"; wait_port "$RW_ECHO"

cat > "$WORK/check.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"rule":"bench","key":"client-1"}'
LUA

# run NAME URL [wrk args...] -> "NAME req/s p50 p99"
run() {
  local name=$1 url=$2; shift 2
  local out; out=$(rest wrk -t2 -c64 -d"$DURATION" --latency "$@" "$url")
  local rps p50 p99
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1=="50%" {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  local non2xx; non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
  printf "%-44s %12s %10s %10s %10s\n" "$name" "$rps" "$p50" "$p99" "${non2xx:-0}"
  echo "$name|$rps|$p99" >> "$WORK/results"
}

echo "wrk -t2 -c64 -d$DURATION, all on 127.0.0.1, $(nproc) cores, $LAYOUT"
printf "%-44s %12s %10s %10s %10s\n" "target" "req/s" "p50" "p99" "non-2xx"
run "upstream directly (nginx return 200)" "http://127.0.0.1:$UP/"
run "ratewarden, echo upstream, no rule" "http://127.0.0.1:$RW_ECHO/"
run "nginx proxy, limit_req never reached" "http://127.0.0.1:$NG_PASS/"
run "ratewarden proxy, gcra never reached" "http://127.0.0.1:$RW_PASS/"
run "ratewarden proxy, no rule at all" "http://127.0.0.1:$RW_NONE/"
run "nginx, limit_req rejecting" "http://127.0.0.1:$NG_REJ/"
run "ratewarden, gcra rejecting" "http://127.0.0.1:$RW_REJ/"
run "ratewarden POST /v1/check (memory)" "http://127.0.0.1:$RW_ADMIN2/v1/check" -s "$WORK/check.lua"
run "ratewarden POST /v1/check (redis)" "http://127.0.0.1:$RW_RADMIN/v1/check" -s "$WORK/check.lua"

python3 - "$WORK/results" "$LAYOUT" <<'PY'
import sys
r = {}
for line in open(sys.argv[1]):
    name, rps, p99 = line.strip().split("|")
    r[name] = (float(rps), p99)
def ms(s):
    return float(s[:-2]) if s.endswith("ms") else float(s[:-2]) / 1000 if s.endswith("us") else float(s[:-1]) * 1000
pn, pr = r["nginx proxy, limit_req never reached"], r["ratewarden proxy, gcra never reached"]
rn, rr = r["nginx, limit_req rejecting"], r["ratewarden, gcra rejecting"]
print()
print(f"forwarding: ratewarden/nginx throughput {pr[0]/pn[0]:.2f}, p99 {ms(pr[1]):.2f} ms vs {ms(pn[1]):.2f} ms")
print(f"rejecting:  ratewarden/nginx throughput {rr[0]/rn[0]:.2f}, p99 {ms(rr[1]):.2f} ms vs {ms(rn[1]):.2f} ms")
print(f"ratewarden rejecting / forwarding: {rr[0]/pr[0]:.2f}")
up, ec = r["upstream directly (nginx return 200)"], r["ratewarden, echo upstream, no rule"]
if sys.argv[2] == "unpinned":
    print(f"serving alone: ratewarden echo / nginx return 200 {ec[0]/up[0]:.2f}")
else:
    print("serving alone: not compared when pinned (the origin shares CPU 1 with wrk)")
nr = r["ratewarden proxy, no rule at all"]
print(f"proxy path without rules: ratewarden/nginx {nr[0]/pn[0]:.2f}; the limiter's cost on forwarding {1 - pr[0]/nr[0]:.0%}")
PY
