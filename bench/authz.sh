#!/usr/bin/env bash
# CPU per decision on the authorisation listener (issue 36) beside
# POST /v1/check, one gateway, one run: the same rule and the same request
# described three ways, rounds alternating.
#
#   bash bench/authz.sh [BIN] [ROUNDS]     # BIN=target/release/ratewarden, ROUNDS=3, D=5 (seconds)
#
#   forward   GET /authz/forward with X-Forwarded-Method/-Uri/-For (Traefik, Caddy)
#   nginx     GET /authz/nginx with X-Original-Method/-URI, X-Real-IP
#   check     POST /v1/check {"request": {...}} (the admin API's decision)
#
# The gateway (--workers 1) on CPU 0, wrk -t2 -c64 over keep-alive on CPU 1;
# the gateway's CPU (user + system, /proc/PID/stat) over each wrk run divided
# by the requests wrk completed. A gcra rule at 1,000,000/s: never refused.
set -euo pipefail
BIN=${1:-target/release/ratewarden}; ROUNDS=${2:-3}; D=${D:-5}
cd "$(dirname "$0")/.."
. bench/lib.sh
install_missing wrk:wrk
[ -x "$BIN" ] || cargo build --release -q -p ratewarden-gateway --bin ratewarden
ADMIN=$(port); AUTHZ=$(port); RW=$(port)
cat > "$WORK/rw.yaml" <<YAML
admin: {listen: 127.0.0.1:$ADMIN}
authz: {listen: 127.0.0.1:$AUTHZ}
identity: {trusted_proxies: [127.0.0.1/32]}
rules:
  - {name: api, match: {path_prefix: /api/}, algorithm: gcra, limit: 1000000, window: 1s}
YAML
cat > "$WORK/check.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"request":{"method":"GET","path":"/api/orders","peer":"203.0.113.7"}}'
wrk.headers["Content-Type"] = "application/json"
LUA
RUST_LOG=off taskset -c 0 "$BIN" serve -c "$WORK/rw.yaml" --listen 127.0.0.1:$RW --workers 1 > /dev/null &
P=$!; PIDS+=($P)
wait_port "$ADMIN"; wait_port "$AUTHZ"
TICK=$(getconf CLK_TCK)
run() {
  local label=$1; shift
  local t0 t1 out n rps
  t0=$(awk '{print $14 + $15}' /proc/$P/stat)
  out=$(taskset -c 1 wrk -t2 -c64 -d${D}s "$@")
  t1=$(awk '{print $14 + $15}' /proc/$P/stat)
  n=$(awk '/requests in/ {print $1}' <<< "$out")
  rps=$(awk '/Requests\/sec/ {print $2}' <<< "$out")
  if grep -q "Non-2xx" <<< "$out"; then echo "$label: refusals or errors: $out" >&2; exit 1; fi
  awk -v b="$label" -v r="$rps" -v t="$((t1 - t0))" -v n="$n" -v k="$TICK" \
    'BEGIN { printf "%-10s %10.0f req/s %7.3f us CPU/decision\n", b, r, t * 1e6 / k / n }'
}
for _ in $(seq "$ROUNDS"); do
  run forward -H 'X-Forwarded-Method: GET' -H 'X-Forwarded-Uri: /api/orders' \
    -H 'X-Forwarded-Host: app.example' -H 'X-Forwarded-For: 203.0.113.7' \
    "http://127.0.0.1:$AUTHZ/authz/forward"
  run nginx -H 'X-Original-Method: GET' -H 'X-Original-URI: /api/orders' \
    -H 'X-Real-IP: 203.0.113.7' "http://127.0.0.1:$AUTHZ/authz/nginx"
  run check -s "$WORK/check.lua" "http://127.0.0.1:$ADMIN/v1/check"
done | awk '{ print; r[$1] += $2; c[$1] += $4; m[$1]++ }
  END { for (b in r) printf "mean %-10s %10.0f req/s %7.3f us CPU/decision\n", b, r[b] / m[b], c[b] / m[b];
        printf "forward / check %.3f   nginx / check %.3f\n", (c["forward"] / m["forward"]) / (c["check"] / m["check"]), (c["nginx"] / m["nginx"]) / (c["check"] / m["check"]) }'
