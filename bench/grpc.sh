#!/usr/bin/env bash
# CPU per unary gRPC call through ratewarden beside nginx's `grpc_pass`, one
# run (issue 37): the same tonic server (examples/grpc_server.rs:
# grpc.health.v1 Check) behind each, h2load sending the same call over h2c.
#
#   bash bench/grpc.sh [BIN] [ROUNDS]     # BIN=target/release/ratewarden, ROUNDS=3, N=100000 calls
#
# nginx keeps its upstream connections alive (`keepalive 16`) and its client
# connections for as many requests as h2load sends; ratewarden multiplexes one
# HTTP/2 connection to the server.
# The proxy (ratewarden --workers 1, or nginx with one worker) on CPU 0; the
# server and h2load (-c 8 -m 16) on CPU 1. CPU is the proxy's user + system
# (/proc/PID/stat) over the h2load run divided by the calls completed;
# ratewarden has a rule on the service (a limit never reached). Rounds
# alternate the two; means and the ratio at the end. Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
install_missing nginx:nginx-light h2load:nghttp2-client
BIN=${1:-target/release/ratewarden}; ROUNDS=${2:-3}; N=${N:-100000}
cargo build --release -q -p ratewarden-gateway --example grpc_server
[ -x "$BIN" ] || cargo build --release -q -p ratewarden-gateway --bin ratewarden
TICK=$(getconf CLK_TCK)
SERVER=$(port); RW=$(port); NG=$(port)
taskset -c 1 target/release/examples/grpc_server 127.0.0.1:$SERVER & PIDS+=($!)
wait_port "$SERVER"
# The call: HealthCheckRequest{} (an empty message), one gRPC frame.
printf '\x00\x00\x00\x00\x00' > "$WORK/call.bin"
cat > "$WORK/rw.yaml" <<YAML
admin: null
upstream: h2c://127.0.0.1:$SERVER
rules:
  - {name: health, match: {path_prefix: /grpc.health.v1.Health/}, algorithm: gcra, limit: 1000000, window: 1s}
YAML
mkdir -p "$WORK/ng/logs"
cat > "$WORK/ng/nginx.conf" <<NGINX
worker_processes 1;
error_log $WORK/ng/logs/error.log crit;
pid $WORK/ng/nginx.pid;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  upstream grpc_server {
    server 127.0.0.1:$SERVER;
    keepalive 16;
    keepalive_requests 10000000;
  }
  server {
    listen 127.0.0.1:$NG http2;
    location / { grpc_pass grpc://grpc_server; }
  }
}
NGINX
run() {
  local label=$1 pid=$2 port=$3 t0 t1 out n
  t0=$(awk '{print $14 + $15}' /proc/$pid/stat)
  out=$(taskset -c 1 h2load -n "$N" -c 8 -m 16 -d "$WORK/call.bin" \
    -H 'content-type: application/grpc' -H 'te: trailers' \
    "http://127.0.0.1:$port/grpc.health.v1.Health/Check")
  t1=$(awk '{print $14 + $15}' /proc/$pid/stat)
  n=$(awk '/^requests:/ {print $8}' <<< "$out")
  [ "$n" -gt 0 ] || { echo "$label: no call succeeded: $out" >&2; exit 1; }
  awk -v b="$label" -v t="$((t1 - t0))" -v n="$n" -v k="$TICK" \
    'BEGIN { printf "%-12s %8d calls %8.3f us CPU/call\n", b, n, t * 1e6 / k / n }'
}
for _ in $(seq "$ROUNDS"); do
  RUST_LOG=off taskset -c 0 "$BIN" serve -c "$WORK/rw.yaml" --listen 127.0.0.1:$RW --workers 1 > /dev/null &
  P=$!; wait_port "$RW"
  run ratewarden $P $RW
  kill $P; wait $P 2>/dev/null || true
  taskset -c 0 nginx -p "$WORK/ng" -c "$WORK/ng/nginx.conf" & P=$!
  wait_port "$NG"
  # The worker's CPU (the master only watches it).
  for _ in $(seq 50); do pgrep -P "$P" > /dev/null && break; sleep 0.05; done
  run nginx "$(pgrep -P "$P" | head -1)" $NG
  kill $P; wait $P 2>/dev/null || true
done | awk '{ print; c[$1] += $4; m[$1]++ }
  END { for (b in c) printf "mean %-12s %8.3f us CPU/call\n", b, c[b] / m[b];
        printf "ratewarden / nginx %.3f\n", (c["ratewarden"] / m["ratewarden"]) / (c["nginx"] / m["nginx"]) }'
