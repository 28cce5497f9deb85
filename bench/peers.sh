#!/usr/bin/env bash
# ratewarden, nginx (`limit_req`) and HAProxy (a stick table) side by side,
# in one run: CPU per request, requests per second and p99 latency, each as a
# ratio to nginx and to HAProxy (issue 38).
#
#   bash bench/peers.sh [BIN] [ROUNDS]      # BIN: a ratewarden binary (default: builds
#                                           # target/release/ratewarden); ROUNDS=3, D=5 (seconds)
#
# Each proxy has one worker or thread, pinned to CPU 0, in front of the same
# nginx `return 200` origin; wrk -t1 -c64 on CPU 1. Two modes: forwarding (a
# limit never reached) and rejecting (1 request per minute per client, so
# nearly every request is answered 429 by the proxy). Rounds alternate the
# three proxies; CPU is user + system from /proc/PID/stat over the wrk run,
# divided by the requests wrk completed. Means per proxy and mode, and the
# ratios, at the end. Everything on 127.0.0.1, bounded by D, stopped at the
# end. Installs nginx, wrk and haproxy with apt-get when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
install_missing nginx:nginx-light wrk:wrk haproxy:haproxy
BIN=${1:-}
ROUNDS=${2:-3}; D=${D:-5}
if [ -z "$BIN" ]; then
  cargo build --release --bin ratewarden -q
  BIN=$PWD/target/release/ratewarden
fi
TICK=$(getconf CLK_TCK)
UP=$(port)
origin_conf "$WORK/o" "$UP"
taskset -c 1 nginx -p "$WORK/o" -c "$WORK/o/nginx.conf" & PIDS+=($!)
wait_port "$UP"

# start NAME MODE PORT: one proxy, pinned to CPU 0; prints its worker's pid.
start() {
  local name=$1 mode=$2 p=$3 dir=$WORK/$1-$2
  mkdir -p "$dir"
  case $name in
    ratewarden)
      local limit=1000000 window=1s
      [ "$mode" = rejecting ] && { limit=1; window=1m; }
      printf 'admin: null\nrules:\n  - {name: bench, algorithm: gcra, limit: %s, window: %s}\n' "$limit" "$window" > "$dir/rw.yaml"
      RUST_LOG=off taskset -c 0 "$BIN" serve -c "$dir/rw.yaml" --listen 127.0.0.1:$p \
        --upstream http://127.0.0.1:$UP --workers 1 > /dev/null 2>&1 &
      echo $! ;;
    nginx)
      local lim=$NGX_OPEN
      [ "$mode" = rejecting ] && lim=$NGX_SHUT
      nginx_conf "$dir" "$NGX_ZONES
        $(ngx_upstream "$UP")
        $(ngx_proxy "$p" "$lim")"
      taskset -c 0 nginx -p "$dir" -c "$dir/nginx.conf" > /dev/null 2>&1 &
      local master=$!
      for _ in $(seq 50); do pgrep -P "$master" > /dev/null && break; sleep 0.05; done
      echo "$master $(pgrep -P "$master")" ;;
    haproxy)
      # http_req_rate over 1 s, denied past 100000000 (forwarding) or over
      # 1 minute past 1 (rejecting), per source address.
      local period=1s max=100000000
      [ "$mode" = rejecting ] && { period=1m; max=1; }
      cat > "$dir/haproxy.cfg" <<CFG
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend fe
  bind 127.0.0.1:$p
  stick-table type ip size 100k expire 2m store http_req_rate($period)
  http-request track-sc0 src
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt $max }
  default_backend be
backend be
  http-reuse always
  server origin 127.0.0.1:$UP maxconn 64
CFG
      taskset -c 0 haproxy -f "$dir/haproxy.cfg" -db > /dev/null 2>&1 &
      echo $! ;;
  esac
}

# run NAME MODE: one round; prints "rps cpu_us p99_us".
run() {
  local name=$1 mode=$2 p pids worker out t0 t1 reqs secs rps p99
  p=$(port)
  pids=$(start "$name" "$mode" "$p")
  worker=${pids##* }
  wait_port "$p"
  # Warm: a first short run, not counted.
  taskset -c 1 wrk -t1 -c64 -d1s "http://127.0.0.1:$p/" > /dev/null
  read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$worker/stat")
  out=$(taskset -c 1 wrk -t1 -c64 -d${D}s --latency "http://127.0.0.1:$p/")
  read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$worker/stat")
  t0=$((u0 + s0)); t1=$((u1 + s1))
  for pid in $pids; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  reqs=$(awk '/requests in/ {print $1}' <<< "$out")
  secs=$(awk '/requests in/ {gsub(/s,/, "", $4); print $4}' <<< "$out")
  rps=$(python3 -c "print(round($reqs / $secs))")
  p99=$(awk '$1 == "99%" {print $2}' <<< "$out" | python3 -c "
import sys
v = sys.stdin.read().strip()
for unit, f in (('us', 1), ('ms', 1000), ('s', 1000000)):
    if v.endswith(unit):
        print(round(float(v[:-len(unit)]) * f)); break")
  echo "$rps $(python3 -c "print(round(($t1 - $t0) / $TICK * 1e6 / $reqs, 3))") $p99 $(python3 -c "print(round(($u1 - $u0) / $TICK * 1e6 / $reqs, 3), round(($s1 - $s0) / $TICK * 1e6 / $reqs, 3))")"
}

declare -A SUM_CPU SUM_RPS SUM_P99
for mode in ${MODES:-forwarding rejecting}; do
  for _ in $(seq "$ROUNDS"); do
    for name in ratewarden nginx haproxy; do
      read -r rps cpu p99 user sys < <(run "$name" "$mode")
      printf '%-10s %-11s %8s req/s %9s us CPU/req (user %s, system %s)  p99 %6s us\n' "$name" "$mode" "$rps" "$cpu" "$user" "$sys" "$p99"
      k="$name $mode"
      SUM_CPU[$k]=$(python3 -c "print(${SUM_CPU[$k]:-0} + $cpu)")
      SUM_RPS[$k]=$(python3 -c "print(${SUM_RPS[$k]:-0} + $rps)")
      SUM_P99[$k]=$(python3 -c "print(${SUM_P99[$k]:-0} + $p99)")
    done
  done
done
echo
echo "means over $ROUNDS rounds, and ratewarden / peer:"
for mode in ${MODES:-forwarding rejecting}; do
  for name in ratewarden nginx haproxy; do
    k="$name $mode"
    printf '%-10s %-11s %8.0f req/s %9.3f us CPU/req  p99 %6.0f us\n' "$name" "$mode" \
      "$(python3 -c "print(${SUM_RPS[$k]} / $ROUNDS)")" \
      "$(python3 -c "print(${SUM_CPU[$k]} / $ROUNDS)")" \
      "$(python3 -c "print(${SUM_P99[$k]} / $ROUNDS)")"
  done
  for peer in nginx haproxy; do
    python3 -c "
r, p = '$mode', '$peer'
cpu = ${SUM_CPU[ratewarden $mode]} / ${SUM_CPU[$peer $mode]}
rps = ${SUM_RPS[ratewarden $mode]} / ${SUM_RPS[$peer $mode]}
p99 = ${SUM_P99[ratewarden $mode]} / ${SUM_P99[$peer $mode]}
print(f'{r:<11} ratewarden / {p:<8} CPU/req {cpu:.3f}  req/s {rps:.3f}  p99 {p99:.3f}')"
  done
done
