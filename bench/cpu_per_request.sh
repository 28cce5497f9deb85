#!/usr/bin/env bash
# CPU time per request of nginx and ratewarden as proxies, and of their peers.
#
#   bash bench/cpu_per_request.sh            # forwarding, no rule
#   MODE=gcra bash bench/cpu_per_request.sh  # forwarding through a gcra rule never reached
#   MODE=reject bash bench/cpu_per_request.sh  # a limit that rejects almost everything
#   PIN=1 ...                                # proxy on CPU 0, origin and wrk on CPU 1
#
# Same setup as bench/gateway.sh (nginx origin `return 200`, wrk -t2 -c64,
# ratewarden --workers 1 vs worker_processes 1). While wrk runs, samples
# /proc/PID/stat of the proxy, the origin worker and wrk over SECONDS (4 s)
# and prints user and system CPU per request (us) for each. Everything on
# 127.0.0.1, bounded, stopped at the end. Needs nginx, wrk (see gateway.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${MODE:-none}; SECONDS_SAMPLED=${SECONDS_SAMPLED:-4}
cargo build --release --bin ratewarden -q
BIN=$PWD/target/release/ratewarden
if [ "${PIN:-0}" = 1 ]; then PROXY="taskset -c 0"; REST="taskset -c 1"; else PROXY=""; REST=""; fi
. bench/lib.sh
UP=$(port); NG=$(port); RW=$(port)
case $MODE in
  reject) NGX_LIMIT=$NGX_SHUT; RULES=$'rules:\n  - {name: bench, algorithm: gcra, limit: 1, window: 60s}' ;;
  gcra) NGX_LIMIT=$NGX_OPEN; RULES=$'rules:\n  - {name: open, algorithm: gcra, limit: 1000000, window: 1s}' ;;
  none) NGX_LIMIT=""; RULES="rules: []" ;;
  *) echo "MODE is none, gcra or reject" >&2; exit 2 ;;
esac
origin_conf "$WORK/o" "$UP"
nginx_conf "$WORK/n" "$NGX_ZONES
  $(ngx_upstream "$UP")
  $(ngx_proxy "$NG" "$NGX_LIMIT")"
printf 'admin: null\n%s\n' "$RULES" > "$WORK/rw.yaml"
$REST nginx -p "$WORK/o" -c "$WORK/o/nginx.conf" & PIDS+=($!); ORIGIN=$!
$PROXY nginx -p "$WORK/n" -c "$WORK/n/nginx.conf" & PIDS+=($!); NGINX_MASTER=$!
RUST_LOG=off $PROXY "$BIN" serve -c "$WORK/rw.yaml" --listen 127.0.0.1:$RW --upstream http://127.0.0.1:$UP --workers 1 > /dev/null & PIDS+=($!); RWPID=$!
wait_port "$UP"; wait_port "$NG"; wait_port "$RW"
ORIGIN_WORKER=$(pgrep -P "$ORIGIN"); NGINX_WORKER=$(pgrep -P "$NGINX_MASTER")
ticks() { for p in "$@"; do awk '{printf "%d %d ", $14, $15}' "/proc/$p/stat"; done; }
echo "mode $MODE, $( [ "${PIN:-0}" = 1 ] && echo 'pinned: proxy CPU 0, origin+wrk CPU 1' || echo unpinned ), CPU us per request (user/sys)"
for target in "nginx $NG $NGINX_WORKER" "ratewarden $RW $RWPID"; do
  set -- $target
  $REST wrk -t2 -c64 -d$((SECONDS_SAMPLED + 2))s "http://127.0.0.1:$2/" > "$WORK/wrk.out" & WRK=$!
  sleep 1
  before=$(ticks "$3" "$ORIGIN_WORKER" "$WRK")
  sleep "$SECONDS_SAMPLED"
  after=$(ticks "$3" "$ORIGIN_WORKER" "$WRK")
  wait "$WRK"
  python3 - "$1" "$before" "$after" "$(awk '/Requests\/sec/ {print $2}' "$WORK/wrk.out")" "$SECONDS_SAMPLED" "$(getconf CLK_TCK)" <<'PY'
import sys
name, a, b, rps, secs, hz = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
d = [(int(y) - int(x)) / hz * 1e6 / (rps * secs) for x, y in zip(a, b)]
print(f"{name:10} {rps:9.0f} req/s  proxy {d[0]:.2f}/{d[1]:.2f} = {d[0]+d[1]:.2f}  origin {d[2]:.2f}/{d[3]:.2f}  wrk {d[4]:.2f}/{d[5]:.2f}")
PY
done
