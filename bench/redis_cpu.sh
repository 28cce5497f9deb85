#!/usr/bin/env bash
# Redis CPU per decision: redis-server's own CPU time (INFO cpu, user +
# system) divided by the decisions it made, for each algorithm's call of the
# store's script (by EVALSHA, and as the Redis Function the store calls
# where the server has Functions), on one key and over 100,000 keys, beside a minimal
# 11-line GCRA script (GET, arithmetic, SET PX) in the same run; then
# through the product: POST /v1/check and Envoy RLS on a gcra rule, 64
# calls in flight; the same product load on a 3-master cluster; and the
# script on one cluster node beside the standalone server at the same load
# shape.
#
#   bash bench/redis_cpu.sh [N]       # N=300000 calls per redis-benchmark run
#   bash bench/redis_cpu.sh overrides [ROUNDS]   # only: overrides on/off (below)
#   bash bench/redis_cpu.sh product [ROUNDS]     # only: the product beside its references (below;
#                                                # BIN=path: another ratewarden build)
#
# `overrides`: Redis CPU per decision of one rule through the product
# (POST /v1/check describing a request, so the proxy's matching and its
# override lookup run), 100k keys, 64 in flight, with `overrides: {max: 0}`
# (off: the table is never read) beside the default (on: its version
# polled every 250 ms, none set) and on with one override set on another
# key; ROUNDS (3) rounds alternating, the ratio to `off` per round.
#
# `product`: ROUNDS (3) rounds on one server, flushed before each figure: the minimal script
# (-P 16 and unpipelined), envoyproxy/ratelimit's fixed-window pattern
# (INCRBY then EXPIRE of the descriptor's key, two commands a decision,
# -P 16 and unpipelined), the store's FCALL gcra (-P 16), then the product
# at 64 in flight: POST /v1/check, Envoy RLS, and plain GETs through the
# proxy keyed by a header (the echo upstream answers), all over 100k keys;
# each figure's ratio to the minimal script's -P 16 and unpipelined.
#
# redis-server on CPU 0; redis-benchmark (-c 64, -P 16 and unpipelined) and
# the load generator on CPU 1; the gateway (--workers 1) on CPU 1 too, so
# that Redis has a core of its own. Loopback only; stopped at the end.
set -euo pipefail
MODE=all
if [ "${1:-}" = overrides ]; then MODE=overrides; shift; fi
if [ "${1:-}" = product ]; then MODE=product; shift; fi
N=${1:-300000}
cd "$(dirname "$0")/.."
. bench/lib.sh
install_missing redis-server:redis-server redis-benchmark:redis-tools

if [ $MODE = overrides ]; then
  ROUNDS=${1:-3}
  cargo build --release -q -p ratewarden-gateway --bin ratewarden --example rls_load
  redis_on_cpu0
  BODY='{"request":{"method":"GET","path":"/","identity":"{v}"}}'
  # Commands Redis ran so far (INFO stats), less the INFO calls themselves.
  commands() { cli info stats | tr -d '\r' | awk -F: '/^total_commands_processed:/ {print $2}'; }
  # run LABEL OVERRIDES-YAML [SET]: one gateway, 5 s of load; prints and
  # sets US (Redis CPU µs per decision).
  run() {
    local admin; admin=$(port)
    cat > "$WORK/o.yaml" <<YAML
admin: {listen: 127.0.0.1:$admin}
upstream: echo
store: {type: redis, url: 'redis://127.0.0.1:$PORT', timeout: 1s}
$2
rules:
  - {name: r, algorithm: gcra, limit: 1000000, window: 1s}
YAML
    cli flushall > /dev/null
    RUST_LOG=warn taskset -c 1 target/release/ratewarden serve -c "$WORK/o.yaml" \
      --listen 127.0.0.1:$(port) --workers 1 > /dev/null & local pid=$!
    wait_port "$admin"
    if [ -n "${3:-}" ]; then
      curl -fsS -X PUT -H 'content-type: application/json' -d '{"limit": 5}' \
        "http://127.0.0.1:$admin/v1/overrides/r/somebody-else" > /dev/null
    fi
    local before after out calls c0 c1
    before=$(cpu); c0=$(commands)
    out=$(taskset -c 1 target/release/examples/rls_load http "http://127.0.0.1:$admin/v1/check" \
      --seconds 5 --keys 100000 --body "$BODY")
    after=$(cpu); c1=$(commands)
    kill "$pid"; wait "$pid" 2>/dev/null || true
    calls=$(load_field calls "$out")
    US=$(echo "($after - $before) * 1000000 / $calls" | bc -l)
    printf '%-44s %9s calls/s  %6.3f us Redis CPU/decision  %.5f Redis commands/decision\n' \
      "$1" "$(load_field rate "$out")" "$US" "$(echo "($c1 - $c0 - 2) / $calls" | bc -l)"
  }
  for r in $(seq "$ROUNDS"); do
    echo "round $r"
    run "overrides off (max: 0)" "overrides: {max: 0}"; OFF=$US
    run "overrides on, none set" ""; ON=$US
    run "overrides on, one set (another key)" "" set; ONE=$US
    printf '  on/off %.3f   one-set/off %.3f\n' "$(echo "$ON / $OFF" | bc -l)" "$(echo "$ONE / $OFF" | bc -l)"
  done
  exit 0
fi
if [ $MODE = product ]; then
  ROUNDS=${1:-3}
  N=200000
fi
cargo build --release -q -p ratewarden --example redis_argv
cargo build --release -q -p ratewarden-gateway --bin ratewarden --example rls_load
FN=$(target/release/examples/redis_argv "$WORK/decide.lua" "$WORK/library.lua" 2>&1 > "$WORK/argv")
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

redis_on_cpu0
DECIDE=$(cli script load "$(cat "$WORK/decide.lua")")
MINIMAL=$(cli script load "$(cat "$WORK/gcra.lua")")
cli function load "$(cat "$WORK/library.lua")" > /dev/null

# bench LABEL PIPELINE KEYS-ARGS... : one redis-benchmark run; prints µs of
# Redis CPU per call and calls/s.
bench() {
  local label=$1 pipe=$2; shift 2
  cli flushall > /dev/null
  local before after rps
  before=$(cpu)
  rps=$(taskset -c 1 redis-benchmark -p "$PORT" -c 64 -P "$pipe" -n "$N" -q "$@" \
    | tr '\r' '\n' | grep -oE '[0-9.]+ requests per second' | tail -1 | cut -d' ' -f1)
  after=$(cpu)
  US=$(echo "($after - $before) * 1000000 / $N" | bc -l)
  printf '%-40s -P %-2s %9s calls/s  %6.2f us Redis CPU/decision\n' "$label" "$pipe" "$rps" "$US"
}

# product LABEL ARGS...: the product's load (rls_load ARGS), 5 s, 100k
# keys; prints and sets US (Redis CPU µs per decision).
product() {
  local label=$1; shift
  cli flushall > /dev/null
  local before after out calls
  before=$(cpu)
  out=$(taskset -c 1 target/release/examples/rls_load "$@" --seconds 5 --keys 100000)
  after=$(cpu)
  calls=$(load_field calls "$out")
  US=$(echo "($after - $before) * 1000000 / $calls" | bc -l)
  printf '%-40s       %9s calls/s  %6.2f us Redis CPU/decision  (%s over)\n' "$label" \
    "$(load_field rate "$out")" "$US" "$(load_field over "$out")"
}

if [ $MODE = product ]; then
  GCRA_ARGS=$(awk '$1 == "gcra" { $1 = ""; $2 = ""; print }' "$WORK/argv")
  ADMIN=$(port); LISTEN=$(port); RLS=$(port)
  cat > "$WORK/p.yaml" <<YAML
admin: {listen: 127.0.0.1:$ADMIN}
upstream: echo
identity: {from: header, header: X-Key}
store: {type: redis, url: 'redis://127.0.0.1:$PORT', timeout: 1s}
rules:
  - {name: r, algorithm: gcra, limit: 1000000, window: 1s}
rls:
  listen: 127.0.0.1:$RLS
  domains:
    - domain: ns
      descriptors:
        - key: k
          rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: gcra}
YAML
  RUST_LOG=warn taskset -c 1 "${BIN:-target/release/ratewarden}" serve -c "$WORK/p.yaml" \
    --listen 127.0.0.1:$LISTEN --workers 1 > /dev/null & PIDS+=($!)
  wait_port "$ADMIN"; wait_port "$RLS"; wait_port "$LISTEN"
  ratio() { printf '    / minimal -P 16: %.3f   / minimal -P 1: %.3f\n' "$(echo "$1 / $M16" | bc -l)" "$(echo "$1 / $M1" | bc -l)"; }
  R=(-r 100000); K='k:__rand_int__'
  for r in $(seq "$ROUNDS"); do
    echo "round $r"
    bench "minimal gcra script, 100k keys" 16 "${R[@]}" evalsha "$MINIMAL" 1 "{$K}" 1 1000000; M16=$US
    bench "minimal gcra script, 100k keys" 1 "${R[@]}" evalsha "$MINIMAL" 1 "{$K}" 1 1000000; M1=$US
    for pipe in 16 1; do
      bench "envoy fixed window: INCRBY" "$pipe" "${R[@]}" incrby "$K" 1; E=$US
      bench "                  + EXPIRE" "$pipe" "${R[@]}" expire "$K" 60
      E=$(echo "$E + $US" | bc -l)
      printf '%-40s -P %-2s            %6.2f us Redis CPU/decision\n' "envoy fixed window: both" "$pipe" "$E"
      ratio "$E"
    done
    # shellcheck disable=SC2086
    bench "FCALL gcra, 100k keys" 16 "${R[@]}" fcall "$FN" 1 "{$K}:s" $GCRA_ARGS; ratio "$US"
    product "product: POST /v1/check gcra" http "http://127.0.0.1:$ADMIN/v1/check"; ratio "$US"
    product "product: RLS gcra" grpc "http://127.0.0.1:$RLS"; ratio "$US"
    product "product: proxy GET, X-Key" http "http://127.0.0.1:$LISTEN/" --header X-Key; ratio "$US"
  done
  exit 0
fi

for pipe in 16 1; do
  for keys in one 100k; do
    if [ $keys = one ]; then R=(); K=k; else R=(-r 100000); K='k:__rand_int__'; fi
    bench "minimal gcra script, $keys key" "$pipe" "${R[@]}" evalsha "$MINIMAL" 1 "{$K}" 1 1000000
    while read -r algo nkeys args; do
      # The state, and its zset where the algorithm keeps one.
      KS=("{$K}:s"); [ "$nkeys" = 2 ] && KS+=("{$K}:s:log")
      # shellcheck disable=SC2086
      bench "decide.lua $algo, $keys key" "$pipe" "${R[@]}" evalsha "$DECIDE" "$nkeys" "${KS[@]}" $args
      # shellcheck disable=SC2086
      bench "  as a Function (FCALL)" "$pipe" "${R[@]}" fcall "$FN" "$nkeys" "${KS[@]}" $args
    done < "$WORK/argv"
  done
done

# Through the product: /v1/check and RLS, gcra, 64 in flight, 100k keys.
# rw_serve STORE: a gateway on STORE with a gcra rule for /v1/check and an
# RLS descriptor of the same size; sets ADMIN and RLS.
rw_serve() {
  ADMIN=$(port); RLS=$(port)
  cat > "$WORK/rw.yaml" <<YAML
admin: {listen: 127.0.0.1:$ADMIN}
store: $1
rules:
  - {name: r, algorithm: gcra, limit: 1000000, window: 1s}
rls:
  listen: 127.0.0.1:$RLS
  domains:
    - domain: ns
      descriptors:
        - key: k
          rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: gcra}
YAML
  RUST_LOG=warn taskset -c 1 target/release/ratewarden serve -c "$WORK/rw.yaml" \
    --listen 127.0.0.1:$(port) --workers 1 > /dev/null & PIDS+=($!)
  wait_port "$ADMIN"; wait_port "$RLS"
}
rw_serve "{type: redis, url: 'redis://127.0.0.1:$PORT', timeout: 1s}"
product "product: POST /v1/check gcra, 100k keys" http "http://127.0.0.1:$ADMIN/v1/check"
product "product: RLS gcra, 100k keys" grpc "http://127.0.0.1:$RLS"
# The same at one cluster node's share of the load: the cluster below
# spreads 64 calls in flight over three masters, ~21 each, and Redis's
# cost per call grows as fewer calls share a read (its pipelining).
product "product: POST /v1/check gcra, 21 in flight" http "http://127.0.0.1:$ADMIN/v1/check" --inflight 21

# Cluster overhead: the same product load on a 3-master cluster, Redis CPU
# summed over its nodes (all on CPU 0), beside the standalone figure above.
CPORTS=()
for i in 1 2 3; do
  # A cluster node also binds its port + 10000 (the cluster bus).
  p=$(port); while [ "$p" -gt 55000 ]; do p=$(port); done
  mkdir -p "$WORK/c$p"
  taskset -c 0 redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no \
    --cluster-enabled yes --cluster-config-file nodes.conf --dir "$WORK/c$p" > /dev/null & PIDS+=($!)
  CPORTS+=("$p")
done
for p in "${CPORTS[@]}"; do wait_port "$p"; done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${CPORTS[@]}") --cluster-replicas 0 \
  --cluster-yes > /dev/null
for p in "${CPORTS[@]}"; do
  until redis-cli -p "$p" cluster info | grep -q cluster_state:ok; do sleep 0.1; done
done
cpu() { # summed over the cluster's nodes
  for p in "${CPORTS[@]}"; do redis-cli -p "$p" info cpu; done | tr -d '\r' \
    | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'
}
cli() { for p in "${CPORTS[@]}"; do redis-cli -p "$p" "$@"; done; }
SEEDS=$(printf "'redis://127.0.0.1:%s', " "${CPORTS[@]}")
rw_serve "{type: redis, cluster: [${SEEDS%, }], timeout: 1s}"
product "cluster: POST /v1/check gcra, 100k keys" http "http://127.0.0.1:$ADMIN/v1/check"
product "cluster: RLS gcra, 100k keys" grpc "http://127.0.0.1:$RLS"

# The script itself on one cluster node beside the standalone server, at
# the same load shape (FCALL gcra, -P 16, 100k keys under one hash tag that
# the node holds; one key: gcra keeps no log): what cluster mode adds per
# call, apart from how the product's calls spread over three nodes.
GCRA_ARGS=$(awk '$1 == "gcra" { $1 = ""; $2 = ""; print }' "$WORK/argv")
NODE=${CPORTS[0]}
TAG=""
for t in a b c d e f g h i j k l m n o p q r s t u v w x y z; do
  if [ "$(redis-cli -p "$NODE" set "{$t}probe" 1)" = OK ]; then TAG=$t; break; fi
done
redis-cli -p "$NODE" function load "$(cat "$WORK/library.lua")" > /dev/null 2>&1 || true
# One server at PORT again: the node, then the standalone one.
cli() { redis_cli "$@"; }
cpu() { redis_cpu; }
PORT_STANDALONE=$PORT; PORT=$NODE
# shellcheck disable=SC2086
bench "FCALL gcra on one cluster node, 100k keys" 16 -r 100000 fcall "$FN" 1 "{$TAG}:k:__rand_int__" $GCRA_ARGS
PORT=$PORT_STANDALONE
# shellcheck disable=SC2086
bench "  the same on the standalone server" 16 -r 100000 fcall "$FN" 1 "{$TAG}:k:__rand_int__" $GCRA_ARGS
