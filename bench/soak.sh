#!/usr/bin/env bash
# A soak: mixed traffic for MINUTES (30) against one gateway on Redis, the
# Redis link through the fault proxy with faults in bursts, a reload every
# 10 s and a Redis restart every 10 minutes, sampled every 10 s (issue 52).
#
#   bash bench/soak.sh [BIN]      # MINUTES=30 OUT=soak.svg (a picture of the samples)
#
# Traffic, in back-to-back 10 s runs on CPU 1: `wrk -t1 -c28` where every
# request is a new client id (a steady stream of new keys) over 10 paths,
# and beside it `wrk -t1 -c4` from one hot client, whose 200s are counted
# against the bound. Rules: per client 200 per second (`gcra`, key from
# X-User) and a global ceiling never reached. Store: a redis-server of the
# script's own, `on_error: local`, reached through `fault_proxy` (the tests'
# fault proxy as a command). Faults, in a 2-minute cycle: 20 s of 200 ms
# (±50) added each way, 10 s of a link stalled both ways, 20 s of 0.1% of
# commands reset after they reach Redis, then healed. Every 10 s the config
# file is rewritten (a real reload); every 10 minutes redis-server stops for
# 10 s. Every 10 s: the gateway's RSS (kB), open descriptors and threads,
# the new-key traffic's p99 and statuses, the hot client's 200s. The bound
# for the hot client per 10 s sample: 10 windows of 200, one more for a
# sample's edges, one more for an outage's first window (the README's
# `limit + max(limit, N) + F`, N = 1), and F at most its 4 connections:
# 2,404. Pass: RSS and descriptors within 10% of their values after the
# first 2 minutes, no hot sample over the bound, no 5xx, no panic. The
# gateway runs on CPU 0, the rest on CPU 1. Loopback only; stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${MINUTES:-30}
OUT=${OUT:-soak.svg}
if [ $# -gt 0 ]; then BIN=$1; else
  cargo build --release --bin ratewarden -q
  BIN=$PWD/target/release/ratewarden
fi
cargo build --release -q -p ratewarden --example fault_proxy
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
# The fault proxy, its commands through a FIFO.
mkfifo "$WORK/faults"
taskset -c 1 target/release/examples/fault_proxy "$REDIS" < "$WORK/faults" > "$WORK/fp.out" & PIDS+=($!)
exec 7> "$WORK/faults"
until grep -q '^port=' "$WORK/fp.out"; do sleep 0.05; done
FP=$(sed -n 's/^port=//p' "$WORK/fp.out")
fault() { echo "$*" >&7; }
config() {
  cat > "$WORK/rw.yaml" <<EOF
# generation $1
listen: 127.0.0.1:$RW
upstream: http://127.0.0.1:$UP
workers: 1
admin: {listen: 127.0.0.1:$ADMIN}
store: {type: redis, url: 'redis://127.0.0.1:$FP', on_error: local, timeout: 500ms}
rules:
  - {name: per-client, key: ['header:x-user'], algorithm: gcra, limit: 200, window: 1s}
  - {name: ceiling, key: [global], algorithm: gcra, limit: 1000000, window: 1s}
EOF
}
config 0
RUST_LOG=warn taskset -c 0 "$BIN" serve -c "$WORK/rw.yaml" > "$WORK/rw.log" 2>&1 & PIDS+=($!); GW=$!
wait_port "$RW"
# statuses LUA USER-EXPR: a wrk script whose requests carry X-User USER-EXPR
# and which prints p99 and every status's count.
statuses() {
  cat <<EOF
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  statuses = {}
  n = 0
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
end
function request()
  n = n + 1
  return wrk.format("GET", "/api/" .. (n % 10), { ["X-User"] = $1 })
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
}
statuses '"u" .. math.random(1, 2000000000)' > "$WORK/churn.lua"
statuses '"hot"' > "$WORK/hot.lua"
BOUND=2404
printf '%6s %9s %5s %4s %9s %6s  %-16s %s\n' t_s rss_kB fds thr p99_ms hot_ok fault statuses | tee "$WORK/samples"
start=$(date +%s)
gen=0; down=""; fault_now=healed; over=0
while [ $(( $(date +%s) - start )) -lt $((MINUTES * 60)) ]; do
  elapsed=$(( $(date +%s) - start ))
  gen=$((gen + 1)); config "$gen"
  # Redis: down for 10 s every 10 minutes.
  if [ -n "$down" ]; then
    start_redis; down=""
  elif [ "$elapsed" -ge 60 ] && [ $(( elapsed % 600 )) -lt 10 ]; then
    kill "$REDIS_PID"; wait "$REDIS_PID" 2> /dev/null || true; down=1
  fi
  # Faults in a 2-minute cycle (10 s samples).
  case $(( (elapsed % 120) / 10 )) in
    2|3) fault heal; fault delay 200 50; fault_now=delay-200ms ;;
    5) fault heal; fault stall 1 1; fault_now=stalled ;;
    7|8) fault heal; fault reset 1000; fault_now=reset-0.1% ;;
    *) fault heal; fault_now=healed ;;
  esac
  [ -n "$down" ] && fault_now="$fault_now+redis-down"
  taskset -c 1 wrk -t1 -c4 -d10s -s "$WORK/hot.lua" "http://127.0.0.1:$RW/" > "$WORK/hot.out" &
  hotpid=$!
  line=$(taskset -c 1 wrk -t1 -c28 -d10s -s "$WORK/churn.lua" "http://127.0.0.1:$RW/" | grep '^p99_ms=' || true)
  wait $hotpid || true
  hot=$(grep -o '200:[0-9]*' "$WORK/hot.out" | cut -d: -f2 || true); hot=${hot:-0}
  [ "$hot" -gt "$BOUND" ] && over=$((over + 1))
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$GW/status")
  thr=$(awk '/^Threads/ {print $2}' "/proc/$GW/status")
  fds=$(ls "/proc/$GW/fd" | wc -l)
  p99=${line#p99_ms=}; p99=${p99%% *}
  printf '%6d %9d %5d %4d %9s %6d  %-16s %s\n' "$(( $(date +%s) - start ))" "$rss" "$fds" "$thr" \
    "${p99:-?}" "$hot" "$fault_now" "${line#* }" | tee -a "$WORK/samples"
done
fault heal
echo "hot samples over the bound ($BOUND): $over"
curl -s "http://127.0.0.1:$ADMIN/metrics" | grep -E '^ratewarden_config_reloads_total|^ratewarden_store_errors_total' || true
echo "gateway WARN/ERROR lines: $(grep -cE 'WARN|ERROR' "$WORK/rw.log" || true); panics: $(grep -c 'panicked' "$WORK/rw.log" || true)"
grep -E 'WARN|ERROR' "$WORK/rw.log" | cut -c1-220 | sort | uniq -c | sort -rn | head -12
# The picture: RSS, descriptors and the hot client's 200s per sample.
python3 - "$WORK/samples" "$OUT" "$BOUND" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]).read().splitlines()[1:] if l.strip()]
out, bound = sys.argv[2], int(sys.argv[3])
t = [int(r[0]) for r in rows]; rss = [int(r[1]) / 1024 for r in rows]
fds = [int(r[2]) for r in rows]; hot = [int(r[5]) for r in rows]
W, H, P = 900, 170, 50
def panel(y0, ys, top, label, colour, line=None):
    s = [f'<text x="{P}" y="{y0 - 6}" font-size="13" font-family="DejaVu Sans, sans-serif">{label}</text>',
         f'<rect x="{P}" y="{y0}" width="{W - 2 * P}" height="{H - 40}" fill="none" stroke="#999"/>']
    span = max(t[-1], 1)
    X = lambda v: P + (W - 2 * P) * v / span
    Y = lambda v: y0 + (H - 40) * (1 - v / top)
    s.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="' +
             " ".join(f"{X(a):.1f},{Y(b):.1f}" for a, b in zip(t, ys)) + '"/>')
    if line is not None:
        s.append(f'<line x1="{P}" x2="{W - P}" y1="{Y(line):.1f}" y2="{Y(line):.1f}" stroke="#c00" stroke-dasharray="4 3"/>')
    s.append(f'<text x="{W - P + 4}" y="{y0 + 10}" font-size="11" font-family="DejaVu Sans, sans-serif">{top:g}</text>')
    s.append(f'<text x="{W - P + 4}" y="{y0 + H - 40}" font-size="11" font-family="DejaVu Sans, sans-serif">0</text>')
    return s
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{3 * H + 20}" viewBox="0 0 {W} {3 * H + 20}">',
       '<rect width="100%" height="100%" fill="white"/>']
svg += panel(20, rss, max(rss) * 1.2, "gateway RSS (MB)", "#1f77b4")
svg += panel(20 + H, fds, max(fds) * 1.2, "open descriptors", "#2ca02c")
svg += panel(20 + 2 * H, hot, bound * 1.2, f"hot client's 200s per 10 s (dashed: the bound, {bound})", "#ff7f0e", bound)
svg.append(f'<text x="{P}" y="{3 * H + 12}" font-size="11" font-family="DejaVu Sans, sans-serif">0 s</text>')
svg.append(f'<text x="{W - P - 40}" y="{3 * H + 12}" font-size="11" font-family="DejaVu Sans, sans-serif">{t[-1]} s</text>')
svg.append('</svg>')
open(out, "w").write("\n".join(svg))
warm = [r for r, a in zip(zip(rss, fds), t) if a >= 120]
if warm:
    r0, f0 = warm[0]
    print(f"after warm-up: RSS {min(r for r, _ in warm):.1f}-{max(r for r, _ in warm):.1f} MB (first {r0:.1f}), descriptors {min(f for _, f in warm)}-{max(f for _, f in warm)} (first {f0})")
print(f"picture: {out}")
PY
