#!/usr/bin/env bash
# From exec to the first answered request: ratewarden on its built-in
# defaults (no config file, the echo upstream), ratewarden on a Redis
# config (a redis-server started here, up before the gateway: the first
# request is decided on Redis), and nginx (one worker, `return 200`),
# alternating, ROUNDS times each; COLD=1 drops the page cache before each
# start (root), as a first start after a deploy would find it. Prints each
# start's milliseconds and the medians (issue 38).
#
#   bash bench/first_answer.sh [BIN]      # ROUNDS=5
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
if [ $# -gt 0 ]; then BIN=$1; else
  cargo build --release --bin ratewarden -q
  BIN=$PWD/target/release/ratewarden
fi
. bench/lib.sh
install_missing nginx:nginx-light redis-server:redis-server
redis_on_cpu0
REDIS_PORT=$PORT
python3 - "$BIN" "$ROUNDS" "${COLD:-0}" "$WORK" "$REDIS_PORT" <<'PY'
import os, socket, statistics, subprocess, sys, time, urllib.request

binary, rounds, cold, work = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
redis_port = sys.argv[5]
redis_conf = os.path.join(work, "redis.yaml")
with open(redis_conf, "w") as f:
    f.write(f"upstream: echo\nstore: {{type: redis, url: \"redis://127.0.0.1:{redis_port}\"}}\n"
            "rules:\n  - {name: per-client, limit: 1000000, window: 1m}\n")

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def first_answer(argv, port):
    if cold:
        subprocess.run(["sync"]); open("/proc/sys/vm/drop_caches", "w").write("3\n")
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.monotonic() - t0 < 10:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
                return (time.monotonic() - t0) * 1000
            except Exception:
                time.sleep(0.001)
        return float("nan")
    finally:
        p.kill(); p.wait()

def nginx_argv(port):
    d = os.path.join(work, f"n{port}"); os.makedirs(os.path.join(d, "logs"), exist_ok=True)
    with open(os.path.join(d, "nginx.conf"), "w") as f:
        f.write(f"worker_processes 1; error_log {d}/logs/e.log crit; pid {d}/n.pid; daemon off;\n"
                f"events {{}} http {{ access_log off; server {{ listen 127.0.0.1:{port}; "
                f"location / {{ return 200 \"ok\"; }} }} }}\n")
    return ["nginx", "-p", d, "-c", os.path.join(d, "nginx.conf")]

times = {"ratewarden": [], "rw-redis": [], "nginx": []}
for _ in range(rounds):
    p = free_port()
    times["ratewarden"].append(first_answer(
        [binary, "serve", "--listen", f"127.0.0.1:{p}", "--admin-listen", "127.0.0.1:0"], p))
    p = free_port()
    times["rw-redis"].append(first_answer(
        [binary, "serve", "--config", redis_conf, "--listen", f"127.0.0.1:{p}",
         "--admin-listen", "127.0.0.1:0"], p))
    p = free_port()
    times["nginx"].append(first_answer(nginx_argv(p), p))
for name, t in times.items():
    print(f"{name:<11} " + " ".join(f"{x:7.1f}" for x in t) + f"   median {statistics.median(t):7.1f} ms")
for name in ("ratewarden", "rw-redis"):
    print(f"{name} / nginx (medians): {statistics.median(times[name]) / statistics.median(times['nginx']):.2f}")
PY
