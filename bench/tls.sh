#!/usr/bin/env bash
# TLS termination: ratewarden's TLS listener against nginx `ssl`, same
# certificate (ECDSA P-256), same protocol and cipher suite (TLS 1.3,
# TLS_AES_256_GCM_SHA384 with X25519: what the clients below ask for first
# and both servers accept; the script prints what each one negotiated),
# both proxying to the same plain nginx origin with keep-alive.
#
#   bash bench/tls.sh [BIN...]      # default: target/release/ratewarden; D=5 (seconds)
#
# Several BINs (e.g. a ring and an aws-lc-rs build) are measured in the same
# run against the same nginx. Proxies under test run alone on CPU 0; the
# origin, wrk and openssl on CPU 1. For each proxy:
# - forwarding (a gcra rule never reached) and rejecting (1 per minute):
#   `wrk -t2 -c64` over https, kept-alive connections; req/s and the proxy's
#   CPU per request (user + system from /proc/PID/stat over the run);
# - new handshakes: `openssl s_time -new` (a full handshake per connection,
#   no resumption, one request each) for D seconds; connections per second
#   and the proxy's CPU per handshake.
# Everything on 127.0.0.1, bounded by D, stopped at the end. Needs nginx, wrk
# and openssl (installed with apt-get when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
D=${D:-5}
BINS=("$@")
if [ ${#BINS[@]} -eq 0 ]; then
  cargo build --release --bin ratewarden -q
  BINS=("$PWD/target/release/ratewarden")
fi
. bench/lib.sh
install_missing nginx:nginx-light wrk:wrk openssl:openssl
TICK=$(getconf CLK_TCK)

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -keyout "$WORK/key.pem" -out "$WORK/cert.pem" -subj /CN=localhost \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2> /dev/null

UP=$(port); NF=$(port); NR=$(port)
origin_conf "$WORK/o" "$UP"
SSL="ssl_certificate $WORK/cert.pem; ssl_certificate_key $WORK/key.pem;
  ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache off; ssl_session_tickets off;"
nginx_conf "$WORK/n" "$NGX_ZONES
  $(ngx_upstream "$UP")
  server { listen 127.0.0.1:$NF ssl; $SSL location / { $NGX_OPEN
    proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }
  server { listen 127.0.0.1:$NR ssl; $SSL location / { $NGX_SHUT
    proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
taskset -c 1 nginx -p "$WORK/o" -c "$WORK/o/nginx.conf" & PIDS+=($!)
taskset -c 0 nginx -p "$WORK/n" -c "$WORK/n/nginx.conf" & PIDS+=($!); NGINX_MASTER=$!
wait_port "$UP"; wait_port "$NF"; wait_port "$NR"
NGINX_WORKER=$(pgrep -P "$NGINX_MASTER")

TLS="tls: {cert: $WORK/cert.pem, key: $WORK/key.pem}"
printf 'admin: null\n%s\nrules:\n  - {name: open, algorithm: gcra, limit: 1000000, window: 1s}\n' "$TLS" > "$WORK/fwd.yaml"
printf 'admin: null\n%s\nrules:\n  - {name: shut, algorithm: gcra, limit: 1, window: 60s}\n' "$TLS" > "$WORK/rej.yaml"

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# keepalive NAME KIND PID PORT: wrk over https; req/s and PID's CPU per request.
keepalive() {
  local t0 t1 out
  t0=$(cpu "$3")
  out=$(taskset -c 1 wrk -t2 -c64 -d"${D}s" "https://127.0.0.1:$4/")
  t1=$(cpu "$3")
  awk -v w="$1" -v k="$2" -v r="$(awk '/Requests\/sec/ {print $2}' <<< "$out")" -v t="$((t1 - t0))" \
    -v n="$(awk '/requests in/ {print $1}' <<< "$out")" -v hz="$TICK" \
    'BEGIN { printf "%-44s %-10s %9.0f req/s      %7.2f us CPU/req\n", w, k, r, t * 1e6 / hz / n }'
}

# handshakes NAME PID PORT: full handshakes for D seconds; rate and PID's CPU
# per handshake; then what a client negotiates with it.
handshakes() {
  local t0 t1 out n
  t0=$(cpu "$2")
  out=$(taskset -c 1 openssl s_time -connect "127.0.0.1:$3" -new -time "$D" -www / 2>&1 || true)
  t1=$(cpu "$2")
  n=$(awk '/connections in/ && /real seconds/ {print $1; exit}' <<< "$out")
  awk -v w="$1" -v t="$((t1 - t0))" -v n="${n:-0}" -v d="$D" -v hz="$TICK" \
    'BEGIN { if (n == 0) { printf "%-44s handshake  none completed\n", w; exit }
             printf "%-44s handshake  %9.0f new/s      %7.1f us CPU/handshake\n", w, n / d, t * 1e6 / hz / n }'
  echo | taskset -c 1 openssl s_client -connect "127.0.0.1:$3" -servername localhost 2> /dev/null \
    | awk -v w="$1" '/^New, / { sub(/^New, /, ""); printf "%-44s negotiated %s\n", w, $0 }'
}

# nginx: one worker serves both its servers.
keepalive nginx forwarding "$NGINX_WORKER" "$NF"
keepalive nginx rejecting "$NGINX_WORKER" "$NR"
handshakes nginx "$NGINX_WORKER" "$NF"
for bin in "${BINS[@]}"; do
  RF=$(port); RR=$(port)
  RUST_LOG=off taskset -c 0 "$bin" serve -c "$WORK/fwd.yaml" --listen 127.0.0.1:$RF \
    --upstream http://127.0.0.1:$UP --workers 1 > /dev/null & PIDS+=($!); P1=$!
  RUST_LOG=off taskset -c 0 "$bin" serve -c "$WORK/rej.yaml" --listen 127.0.0.1:$RR \
    --upstream http://127.0.0.1:$UP --workers 1 > /dev/null & PIDS+=($!); P2=$!
  wait_port "$RF"; wait_port "$RR"
  keepalive "$bin" forwarding "$P1" "$RF"
  keepalive "$bin" rejecting "$P2" "$RR"
  handshakes "$bin" "$P1" "$RF"
  kill "$P1" "$P2"; wait "$P1" "$P2" 2> /dev/null || true
done
