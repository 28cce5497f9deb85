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
WORK=$(mktemp -d); PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }
UP=$(port); NG=$(port); RW=$(port)
case $MODE in
  reject) NGX_LIMIT="limit_req zone=shut nodelay;"; RULES=$'rules:\n  - {name: bench, algorithm: gcra, limit: 1, window: 60s}' ;;
  gcra) NGX_LIMIT="limit_req zone=open burst=100000000 nodelay;"; RULES=$'rules:\n  - {name: open, algorithm: gcra, limit: 1000000, window: 1s}' ;;
  none) NGX_LIMIT=""; RULES="rules: []" ;;
  *) echo "MODE is none, gcra or reject" >&2; exit 2 ;;
esac
mkdir -p "$WORK/o/logs" "$WORK/n/logs"
cat > "$WORK/o/nginx.conf" <<NGINX
worker_processes 1; error_log $WORK/o/logs/e.log crit; pid $WORK/o/nginx.pid; daemon off;
events { worker_connections 4096; }
http { access_log off; server { listen 127.0.0.1:$UP; location / { return 200 "ok\n"; } } }
NGINX
cat > "$WORK/n/nginx.conf" <<NGINX
worker_processes 1; error_log $WORK/n/logs/e.log crit; pid $WORK/n/nginx.pid; daemon off;
events { worker_connections 4096; }
http { access_log off;
  limit_req_zone \$binary_remote_addr zone=open:10m rate=100000000r/s;
  limit_req_zone \$binary_remote_addr zone=shut:10m rate=1r/m;
  limit_req_status 429;
  upstream origin { server 127.0.0.1:$UP; keepalive 64; }
  server { listen 127.0.0.1:$NG; location / { $NGX_LIMIT
    proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
NGINX
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
