#!/usr/bin/env bash
# A soak: mixed traffic for MINUTES (30) against one gateway on Redis, with a
# reload every minute and a Redis restart halfway, sampled every 10 s.
#
#   bash bench/soak.sh [BIN]      # MINUTES=30
#
# Traffic (wrk -t2 -c32, in back-to-back 10 s runs, each printing its status
# counts and p99): a third of requests from one hot client (rejected past
# 200/s), the rest each from a new client id (a steady stream of new keys),
# over 10 paths. Rules: per client 200 per second (sliding window counter,
# key from X-User), and a global ceiling never reached. Store: a
# redis-server of the script's own, `on_error: local`. Every 60 s the config
# file is rewritten (a comment changes: a real reload, counted in
# ratewarden_config_reloads_total); at half time redis-server is stopped for
# 10 s and started again. Every 10 s: the gateway's RSS (kB) and open file
# descriptors, wrk's p99 and status counts. The gateway runs on CPU 0, the
# rest on CPU 1. Goal: flat memory, no descriptor leak, no 5xx (the restart
# is covered by on_error: local, so none there either).
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${MINUTES:-30}
if [ $# -gt 0 ]; then BIN=$1; else
  cargo build --release --bin ratewarden -q
  BIN=$PWD/target/release/ratewarden
fi
. bench/lib.sh
install_missing nginx:nginx-light wrk:wrk redis-server:redis-server
UP=$(port); RW=$(port); ADMIN=$(port); REDIS=$(port)
origin_conf "$WORK/o" "$UP"
taskset -c 1 nginx -p "$WORK/o" -c "$WORK/o/nginx.conf" & PIDS+=($!)
start_redis() {
  taskset -c 1 redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no \
    > "$WORK/redis.log" 2>&1 & REDIS_PID=$!
  PIDS+=($REDIS_PID)
  wait_port "$REDIS"
}
start_redis
wait_port "$UP"
config() {
  cat > "$WORK/rw.yaml" <<EOF
# generation $1
listen: 127.0.0.1:$RW
upstream: http://127.0.0.1:$UP
workers: 1
admin: {listen: 127.0.0.1:$ADMIN}
store: {type: redis, url: 'redis://127.0.0.1:$REDIS', on_error: local}
rules:
  - {name: per-client, key: ['header:x-user'], limit: 200, window: 1s}
  - {name: ceiling, key: [global], algorithm: gcra, limit: 1000000, window: 1s}
EOF
}
config 0
RUST_LOG=warn taskset -c 0 "$BIN" serve -c "$WORK/rw.yaml" > "$WORK/rw.log" 2>&1 & PIDS+=($!); GW=$!
wait_port "$RW"
cat > "$WORK/mix.lua" <<'EOF'
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  statuses = {}
  n = 0
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
end
function request()
  n = n + 1
  local user = (n % 3 == 0) and "hot" or ("u" .. math.random(1, 2000000000))
  return wrk.format("GET", "/api/" .. (n % 10), { ["X-User"] = user })
end
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end
function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("statuses")) do total[k] = (total[k] or 0) + v end
  end
  local parts = {}
  for k, v in pairs(total) do table.insert(parts, k .. ":" .. v) end
  table.sort(parts)
  io.write(string.format("p99_ms=%.2f statuses=%s\n", latency:percentile(99) / 1000, table.concat(parts, ",")))
end
EOF
printf '%6s %9s %5s %9s  %s\n' t_s rss_kB fds p99_ms statuses
start=$(date +%s)
gen=0; stopped_at=""; restarted=0
while [ $(( $(date +%s) - start )) -lt $((MINUTES * 60)) ]; do
  elapsed=$(( $(date +%s) - start ))
  if [ $((elapsed / 60)) -gt "$gen" ]; then gen=$((elapsed / 60)); config "$gen"; fi
  # Halfway: Redis stops; one 10 s sample later it starts again.
  if [ -n "$stopped_at" ]; then
    start_redis; stopped_at=""
    echo "# redis-server started again"
  elif [ "$restarted" = 0 ] && [ "$elapsed" -ge $((MINUTES * 30)) ]; then
    restarted=1; stopped_at=$elapsed
    kill "$REDIS_PID"; wait "$REDIS_PID" 2> /dev/null || true
    echo "# redis-server stopped"
  fi
  line=$(taskset -c 1 wrk -t2 -c32 -d10s -s "$WORK/mix.lua" "http://127.0.0.1:$RW/" | grep '^p99_ms=')
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$GW/status")
  fds=$(ls "/proc/$GW/fd" | wc -l)
  p99=${line#p99_ms=}; p99=${p99%% *}
  printf '%6d %9d %5d %9s  %s\n' "$(( $(date +%s) - start ))" "$rss" "$fds" "$p99" "${line#* }"
done
reloads=$(curl -s "http://127.0.0.1:$ADMIN/metrics" | grep '^ratewarden_config_reloads_total')
echo "$reloads"
echo "gateway WARN/ERROR lines: $(grep -cE 'WARN|ERROR' "$WORK/rw.log" || true)"
grep -E 'WARN|ERROR|INFO' "$WORK/rw.log" | head -20
