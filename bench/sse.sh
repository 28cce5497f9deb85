#!/usr/bin/env bash
# CPU per MB of server-sent events relayed: nginx (`proxy_buffering off`)
# against ratewarden with a rule that reads each stream's LLM usage as it
# goes by (`cost: {from: llm}`), and ratewarden with a plain rule (the
# tap's own cost is the difference).
#
#   bash bench/sse.sh [BIN]      # ROUNDS=3 SECONDS_SAMPLED=4 MB=1 CONNS=8
#
# An nginx origin serves an OpenAI Chat Completions stream of MB MiB
# (chunks of about 200 bytes, each a `data:` event saying `"usage":null`,
# as OpenAI's do under `stream_options.include_usage`, the usage in the
# last one before `data: [DONE]`) as `text/event-stream`. Each proxy (one worker:
# `worker_processes 1`, `--workers 1`) relays it to `wrk -t2 -cCONNS`, one
# proxy at a time, alternating, ROUNDS times; /proc/PID/stat of the proxy is
# sampled over SECONDS_SAMPLED and divided by the MiB relayed (requests x
# the stream's size). Prints per run the µs of CPU (user + system) per MiB
# and, per round, each ratewarden's ratio to nginx. Loopback only, bounded,
# everything stopped at the end. Needs nginx and wrk.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; SECONDS_SAMPLED=${SECONDS_SAMPLED:-4}; MB=${MB:-1}; CONNS=${CONNS:-8}
. bench/lib.sh
install_missing nginx:nginx wrk:wrk
if [ -n "${1:-}" ]; then BIN=$1; else cargo build --release --bin ratewarden -q; BIN=$PWD/target/release/ratewarden; fi
UP=$(port); NG=$(port); LLM=$(port); PLAIN=$(port)
python3 - "$WORK/stream" "$MB" <<'PY'
import json, sys
path, mb = sys.argv[1], float(sys.argv[2])
out, n = [], 0
size = int(mb * 1024 * 1024)
total = 0
while total < size - 400:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini",
             "choices": [{"index": 0, "delta": {"content": "word%05d " % n + "x" * 60}, "finish_reason": None}],
             "usage": None}
    line = "data: " + json.dumps(chunk, separators=(",", ":")) + "\n\n"
    out.append(line); total += len(line); n += 1
usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini", "choices": [],
         "usage": {"prompt_tokens": 20, "completion_tokens": n, "total_tokens": 20 + n}}
out.append("data: " + json.dumps(usage, separators=(",", ":")) + "\n\ndata: [DONE]\n\n")
open(path, "w").write("".join(out))
PY
chmod 755 "$WORK"; chmod 644 "$WORK/stream"  # read by nginx's worker (nobody)
SIZE=$(stat -c %s "$WORK/stream")
nginx_conf "$WORK/o" "server { listen 127.0.0.1:$UP; location / { default_type text/event-stream; root $WORK; rewrite ^ /stream break; } }"
nginx_conf "$WORK/n" "$(ngx_upstream "$UP")
  server { listen 127.0.0.1:$NG; location / { proxy_buffering off;
    proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
printf 'admin: null\nrules:\n  - {name: tokens, algorithm: fixed_window, limit: 4000000000, window: 1h, cost: {from: llm, default_max_output: 1}}\n' > "$WORK/llm.yaml"
printf 'admin: null\nrules:\n  - {name: plain, algorithm: fixed_window, limit: 4000000000, window: 1h}\n' > "$WORK/plain.yaml"
nginx -p "$WORK/o" -c "$WORK/o/nginx.conf" & PIDS+=($!)
nginx -p "$WORK/n" -c "$WORK/n/nginx.conf" & PIDS+=($!); NGINX_MASTER=$!
for x in llm:$LLM plain:$PLAIN; do
  RUST_LOG=off "$BIN" serve -c "$WORK/${x%%:*}.yaml" --listen "127.0.0.1:${x#*:}" \
    --upstream "http://127.0.0.1:$UP" --workers 1 > /dev/null & PIDS+=($!)
  eval "PID_${x%%:*}=$!"
done
wait_port "$UP"; wait_port "$NG"; wait_port "$LLM"; wait_port "$PLAIN"
NGINX_WORKER=$(pgrep -P "$NGINX_MASTER")
# Every proxy relays the whole stream (a wrong setup would measure errors).
for p in "$NG" "$LLM" "$PLAIN"; do
  got=$(curl -s -o /dev/null -w '%{http_code} %{size_download}' "http://127.0.0.1:$p/v1/chat/completions")
  [ "$got" = "200 $SIZE" ] || { echo "port $p answered $got, not 200 $SIZE" >&2; exit 1; }
done
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # NAME PORT PID: prints µs of CPU per MiB relayed
  wrk -t2 -c"$CONNS" -d$((SECONDS_SAMPLED + 2))s "http://127.0.0.1:$2/v1/chat/completions" > "$WORK/wrk.out" & local w=$!
  sleep 1
  local a; a=$(ticks "$3")
  sleep "$SECONDS_SAMPLED"
  local b; b=$(ticks "$3")
  wait "$w"
  python3 - "$a" "$b" "$(awk '/Requests\/sec/ {print $2}' "$WORK/wrk.out")" "$SECONDS_SAMPLED" "$(getconf CLK_TCK)" "$SIZE" <<'PY'
import sys
a, b, rps, secs, hz, size = (float(x) for x in sys.argv[1:])
print(f"{(b - a) / hz * 1e6 / (rps * secs * size / 1048576):.1f}")
PY
}
echo "stream of $SIZE bytes, wrk -t2 -c$CONNS; µs CPU per MiB relayed (user + system)"
for r in $(seq "$ROUNDS"); do
  n=$(run nginx "$NG" "$NGINX_WORKER")
  l=$(run tokens "$LLM" "$PID_llm")
  p=$(run plain "$PLAIN" "$PID_plain")
  python3 -c "print(f'round $r: nginx $n  ratewarden tokens rule $l ({$l/$n:.3f}x)  plain rule $p ({$p/$n:.3f}x)  tokens/plain {$l/$p:.3f}')"
done
