#!/usr/bin/env bash
# A soak: mixed traffic for MINUTES (30) against one gateway on Redis, the
# Redis link through the fault proxy with faults in bursts, a reload every
# 10 s and a Redis restart every 10 minutes, sampled every 10 s (issue 52).
# With STORE=cluster: a Redis Cluster of 3 masters and 3 replicas, each
# node behind its own fault proxy (it announces the proxy's port), a master
# killed in turn every 10 minutes (its replica promoted, the node back 10 s
# later as a replica) and a `CLUSTER FAILOVER` every 30 minutes from 5.
#
#   bash bench/soak.sh [BIN]      # MINUTES=30 OUT=soak.svg STORE=single|cluster
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
# 10 s. Every 10 s: the gateway's RSS (kB), open descriptors, threads, live
# runtime tasks and in-process keys (read halfway through the sample),
# the new-key traffic's p99 and statuses, the hot client's 200s. The bound
# for the hot client per 10 s sample: 10 windows of 200, one more for a
# sample's edges, and an outage's first and last windows at most one more
# each (the README's `limit + max(limit, N) + F` per window, N = 1: in the
# window an outage begins, Redis had admitted and the local store admits
# afresh; in the one it ends, the local store had admitted and Redis's
# bucket refilled meanwhile), and F at most its 4 connections: 2,604 (a
# Cluster's failover fits both in one sample). Pass: RSS and descriptors
# within 10% after warm-up (WARM, below), no hot sample over the bound, no
# 5xx, no panic. The
# gateway runs on CPU 0, the rest on CPU 1. Loopback only; stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${MINUTES:-30}
OUT=${OUT:-soak.svg}
STORE=${STORE:-single}
# Seconds between Redis restarts (master kills), between failovers, and to the first failover.
KILL_EVERY=${KILL_EVERY:-600} FAILOVER_EVERY=${FAILOVER_EVERY:-1800} FAILOVER_FROM=${FAILOVER_FROM:-300}
# Warm-up, in seconds: until the first outage is over. The fallback store's
# tables are sized for its 1,000,000 keys when the first outage brings its
# first keys (48 bytes a slot and a control byte: about 54 MiB), and their
# pages are touched as the outage's new keys land; after that it does not grow.
WARM=${WARM:-$((KILL_EVERY + 30))}
if [ $# -gt 0 ]; then BIN=$1; else
  cargo build --release --bin ratewarden -q
  BIN=$PWD/target/release/ratewarden
fi
cargo build --release -q -p ratewarden --example fault_proxy
. bench/lib.sh
install_missing nginx:nginx-light wrk:wrk redis-server:redis-server
UP=$(port); REDIS=$(port)
origin_conf "$WORK/o" "$UP"
taskset -c 1 nginx -p "$WORK/o" -c "$WORK/o/nginx.conf" & PIDS+=($!)
start_redis() {
  taskset -c 1 redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no \
    > "$WORK/redis.log" 2>&1 & REDIS_PID=$!
  PIDS+=($REDIS_PID)
  wait_port "$REDIS"
}
# proxy NAME TARGET: a fault proxy to TARGET, its commands through a FIFO
# on a descriptor kept in FDS; its port in PROXY_PORT.
FDS=()
proxy() {
  mkfifo "$WORK/faults.$1"
  taskset -c 1 target/release/examples/fault_proxy "$2" < "$WORK/faults.$1" > "$WORK/fp.$1.out" & PIDS+=($!)
  local fd; exec {fd}> "$WORK/faults.$1"; FDS+=("$fd")
  until grep -q '^port=' "$WORK/fp.$1.out"; do sleep 0.05; done
  PROXY_PORT=$(sed -n 's/^port=//p' "$WORK/fp.$1.out")
}
fault() { for fd in "${FDS[@]}"; do echo "$*" >&"$fd"; done; }
if [ "$STORE" = cluster ]; then
  # 3 masters and 3 replicas, each node announcing its fault proxy's port
  # (clients, replication and redirects all go through the proxies; the
  # cluster bus goes direct). Ports below 55,000: the bus is 10,000 above.
  low_port() { python3 -c 'import socket,random
while True:
    p = random.randrange(20000, 40000)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
        print(p); break
    except OSError: pass'; }
  NODE=(); FPN=(); NODE_PID=()
  for i in 0 1 2 3 4 5; do NODE[$i]=$(low_port); proxy "$i" "${NODE[$i]}"; FPN[$i]=$PROXY_PORT; done
  start_node() {
    mkdir -p "$WORK/n$1"
    taskset -c 1 redis-server --port "${NODE[$1]}" --bind 127.0.0.1 --dir "$WORK/n$1" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --cluster-announce-ip 127.0.0.1 --cluster-announce-port "${FPN[$1]}" \
      --cluster-announce-bus-port $(( NODE[$1] + 10000 )) --save "" --appendonly no \
      > "$WORK/n$1.log" 2>&1 & NODE_PID[$1]=$!
    PIDS+=($!)
    wait_port "${NODE[$1]}"
  }
  for i in 0 1 2 3 4 5; do start_node "$i"; done
  redis-cli --cluster create $(for i in 0 1 2 3 4 5; do printf '127.0.0.1:%s ' "${NODE[$i]}"; done) \
    --cluster-replicas 1 --cluster-yes > "$WORK/create.log"
  for i in 0 1 2 3 4 5; do
    until redis-cli -p "${NODE[$i]}" cluster info | grep -q cluster_state:ok; do sleep 0.1; done
  done
  # node_of FAULT_PROXY_PORT: the node's index.
  node_of() { for i in 0 1 2 3 4 5; do [ "${FPN[$i]}" = "$1" ] && echo "$i"; done; }
  # The masters (or replicas) as a live node sees them, as node indexes.
  nodes_that() {
    for i in 0 1 2 3 4 5; do
      redis-cli -p "${NODE[$i]}" cluster nodes 2> /dev/null && break
    done | awk -v r="$1" '$3 ~ r && $3 !~ /fail/ {split($2, a, "[:@]"); print a[2]}' |
      while read -r p; do node_of "$p"; done
  }
  SEEDS=$(for i in 0 1 2 3 4 5; do printf "'redis://127.0.0.1:%s', " "${FPN[$i]}"; done)
  STORE_YAML="{type: redis, cluster: [${SEEDS%, }], on_error: local, timeout: 500ms}"
else
  start_redis
  proxy 0 "$REDIS"; FP=$PROXY_PORT
  STORE_YAML="{type: redis, url: 'redis://127.0.0.1:$FP', on_error: local, timeout: 500ms}"
fi
config() {
  cat > "$WORK/rw.yaml" <<EOF
# generation $1
listen: 127.0.0.1:$RW
upstream: http://127.0.0.1:$UP
workers: 1
admin: {listen: 127.0.0.1:$ADMIN}
store: $STORE_YAML
rules:
  - {name: per-client, key: ['header:x-user'], algorithm: gcra, limit: 200, window: 1s}
  - {name: ceiling, key: [global], algorithm: gcra, limit: 1000000, window: 1s}
EOF
}
# The gateway's ports are picked after the fault proxies have bound theirs
# (port 0): picked before, one was once a proxy's, and the gateway could not
# bind it while `wait_port` saw the proxy.
RW=$(port); ADMIN=$(port)
config 0
RUST_LOG=warn taskset -c 0 "$BIN" serve -c "$WORK/rw.yaml" > "$WORK/rw.log" 2>&1 & PIDS+=($!); GW=$!
wait_port "$RW"
kill -0 "$GW" 2> /dev/null || { echo "the gateway did not start:"; cat "$WORK/rw.log"; exit 1; }
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
BOUND=2604
printf '%6s %9s %5s %4s %5s %7s %9s %6s  %-16s %s\n' t_s rss_kB fds thr tasks keys p99_ms hot_ok fault statuses | tee "$WORK/samples"
start=$(date +%s)
gen=0; down=""; fault_now=healed; over=0
while [ $(( $(date +%s) - start )) -lt $((MINUTES * 60)) ]; do
  elapsed=$(( $(date +%s) - start ))
  gen=$((gen + 1)); config "$gen"
  # Redis: down for 10 s every 10 minutes (on a cluster: a master, in
  # turn, killed and its replica promoted; back 10 s later as a replica).
  event=""
  if [ -n "$down" ]; then
    if [ "$STORE" = cluster ]; then start_node "$down"; else start_redis; fi
    down=""
  elif [ "$elapsed" -ge 60 ] && [ $(( elapsed % KILL_EVERY )) -lt 10 ]; then
    if [ "$STORE" = cluster ]; then
      kills=$((${kills:-0} + 1))
      mapfile -t masters < <(nodes_that master)
      down=${masters[$(( kills % ${#masters[@]} ))]}
      kill "${NODE_PID[$down]}"; wait "${NODE_PID[$down]}" 2> /dev/null || true
      event=+master-killed
    else
      kill "$REDIS_PID"; wait "$REDIS_PID" 2> /dev/null || true; down=1
      event=+redis-down
    fi
  elif [ "$STORE" = cluster ] && [ "$elapsed" -ge "$FAILOVER_FROM" ] && [ $(( (elapsed - FAILOVER_FROM) % FAILOVER_EVERY )) -lt 10 ]; then
    # A Cluster failover every 30 minutes: a replica, in turn, takes over.
    failovers=$((${failovers:-0} + 1))
    mapfile -t replicas < <(nodes_that slave)
    r=${replicas[$(( failovers % ${#replicas[@]} ))]}
    redis-cli -p "${NODE[$r]}" cluster failover > /dev/null
    event=+failover
  fi
  # Faults in a 2-minute cycle (10 s samples).
  case $(( (elapsed % 120) / 10 )) in
    2|3) fault heal; fault delay 200 50; fault_now=delay-200ms ;;
    5) fault heal; fault stall 1 1; fault_now=stalled ;;
    7|8) fault heal; fault reset 1000; fault_now=reset-0.1% ;;
    *) fault heal; fault_now=healed ;;
  esac
  fault_now="$fault_now$event"
  taskset -c 1 wrk -t1 -c4 -d10s -s "$WORK/hot.lua" "http://127.0.0.1:$RW/" > "$WORK/hot.out" &
  hotpid=$!
  taskset -c 1 wrk -t1 -c28 -d10s -s "$WORK/churn.lua" "http://127.0.0.1:$RW/" > "$WORK/churn.out" &
  churnpid=$!
  # The gateway's figures halfway through the run, with all 32 clients
  # connected (between runs, the count caught sockets still closing).
  sleep 5
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$GW/status")
  thr=$(awk '/^Threads/ {print $2}' "/proc/$GW/status")
  fds=$(ls "/proc/$GW/fd" | wc -l)
  # The runtime's live tasks, and the keys the in-process store holds (the
  # outage's fallback).
  metrics=$(curl -s --max-time 2 "http://127.0.0.1:$ADMIN/metrics" || true)
  tasks=$(awk '/^ratewarden_runtime_tasks / {print $2}' <<< "$metrics"); tasks=${tasks:-?}
  keys=$(awk '/^ratewarden_memory_keys / {print $2}' <<< "$metrics"); keys=${keys:-?}
  wait $churnpid $hotpid || true
  line=$(grep '^p99_ms=' "$WORK/churn.out" || true)
  hot=$(grep -o '200:[0-9]*' "$WORK/hot.out" | cut -d: -f2 || true); hot=${hot:-0}
  [ "$hot" -gt "$BOUND" ] && over=$((over + 1))
  p99=${line#p99_ms=}; p99=${p99%% *}
  printf '%6d %9d %5d %4d %5s %7s %9s %6d  %-16s %s\n' "$(( $(date +%s) - start ))" "$rss" "$fds" "$thr" \
    "$tasks" "$keys" "${p99:-?}" "$hot" "$fault_now" "${line#* }" | tee -a "$WORK/samples"
done
fault heal
echo "hot samples over the bound ($BOUND): $over"
curl -s "http://127.0.0.1:$ADMIN/metrics" | grep -E '^ratewarden_config_reloads_total|^ratewarden_store_errors_total' || true
echo "gateway WARN/ERROR lines: $(grep -cE 'WARN|ERROR' "$WORK/rw.log" || true); panics: $(grep -c 'panicked' "$WORK/rw.log" || true)"
# The commonest lines, without their timestamps and changing figures. (Under
# `pipefail`, `head` closing the pipe early failed it, and `set -e` ended
# the script before the picture.)
{ grep -E 'WARN|ERROR' "$WORK/rw.log" | cut -c29- | sed -E 's/[0-9]+(\.[0-9]+)?(s|ms)\b/N\2/g' |
  cut -c1-200 | sort | uniq -c | sort -rn | head -12; } || true
# The picture: RSS, descriptors and the hot client's 200s per sample.
python3 - "$WORK/samples" "$OUT" "$BOUND" "$WARM" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]).read().splitlines()[1:] if l.strip()]
out, bound = sys.argv[2], int(sys.argv[3])
t = [int(r[0]) for r in rows]; rss = [int(r[1]) / 1024 for r in rows]
fds = [int(r[2]) for r in rows]; hot = [int(r[7]) for r in rows]
tasks = [int(r[4]) if r[4].isdigit() else 0 for r in rows]
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
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{4 * H + 20}" viewBox="0 0 {W} {4 * H + 20}">',
       '<rect width="100%" height="100%" fill="white"/>']
svg += panel(20, rss, max(rss) * 1.2, "gateway RSS (MB)", "#1f77b4")
svg += panel(20 + H, fds, max(fds) * 1.2, "open descriptors", "#2ca02c")
svg += panel(20 + 2 * H, tasks, max(max(tasks), 1) * 1.2, "runtime tasks (ratewarden_runtime_tasks)", "#9467bd")
svg += panel(20 + 3 * H, hot, bound * 1.2, f"hot client's 200s per 10 s (dashed: the bound, {bound})", "#ff7f0e", bound)
svg.append(f'<text x="{P}" y="{4 * H + 12}" font-size="11" font-family="DejaVu Sans, sans-serif">0 s</text>')
svg.append(f'<text x="{W - P - 40}" y="{4 * H + 12}" font-size="11" font-family="DejaVu Sans, sans-serif">{t[-1]} s</text>')
svg.append('</svg>')
open(out, "w").write("\n".join(svg))
warm_s = int(sys.argv[4])
warm = [r for r, a in zip(zip(rss, fds, tasks), t) if a >= warm_s]
if warm:
    r0, f0, k0 = warm[0]
    lo, hi = min(r for r, _, _ in warm), max(r for r, _, _ in warm)
    print(f"after warm-up ({warm_s} s): RSS {lo:.1f}-{hi:.1f} MB (first {r0:.1f}; span {100 * (hi - lo) / lo:.1f}% of the least), "
          f"descriptors {min(f for _, f, _ in warm)}-{max(f for _, f, _ in warm)} (first {f0}), "
          f"tasks {min(k for _, _, k in warm)}-{max(k for _, _, k in warm)} (first {k0})")
# Like against like: descriptors and tasks follow the connections a fault
# holds open or lets close, so the leak check compares the samples without
# a fault (and without a kill or failover in them).
calm = [(int(r[1]) / 1024, int(r[2]), int(r[4])) for r in rows
        if int(r[0]) >= warm_s and r[8] == "healed" and r[4].isdigit()]
if calm:
    span = lambda i: (min(c[i] for c in calm), max(c[i] for c in calm))
    (rl, rh), (fl, fh), (kl, kh) = span(0), span(1), span(2)
    print(f"after warm-up, {len(calm)} samples without a fault: RSS {rl:.1f}-{rh:.1f} MB ({100 * (rh - rl) / rl:.1f}%), "
          f"descriptors {fl}-{fh} ({100 * (fh - fl) / fl:.1f}%), tasks {kl}-{kh} ({100 * (kh - kl) / kl:.1f}%)")
print(f"picture: {out}")
PY
