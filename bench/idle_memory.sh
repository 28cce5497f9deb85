#!/usr/bin/env bash
# Memory the gateway keeps for idle kept-alive client connections.
#
#   bash bench/idle_memory.sh [BIN]     # BIN: a ratewarden build (default: release)
#
# Starts an nginx origin serving a 1 MiB file and a ratewarden (--workers 1,
# one gcra rule never reached) in front of it, opens CONNS (500) client
# connections that each download the file once and then stay open, and prints
# the gateway's resident memory before and 2 s after (the allocator returns
# freed memory with a delay): what each idle connection costs once it has
# relayed a large body. Everything on 127.0.0.1, stopped at
# the end. Needs nginx (see gateway.sh) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=${CONNS:-500}
if [ -n "${1:-}" ]; then BIN=$1; else cargo build --release --bin ratewarden -q; BIN=target/release/ratewarden; fi
. bench/lib.sh
install_missing nginx:nginx-light
UP=$(port); RW=$(port); NG=$(port)
mkdir -p "$WORK/origin/html"
head -c 1048576 /dev/zero > "$WORK/origin/html/big"
nginx_conf "$WORK/origin" "server { listen 127.0.0.1:$UP; root $WORK/origin/html; }"
nginx_conf "$WORK/nginx" "$NGX_ZONES
  $(ngx_upstream "$UP")
  $(ngx_proxy "$NG" "$NGX_OPEN")"
chmod -R a+rX "$WORK"
printf 'admin: null\nrules:\n  - name: open\n    algorithm: gcra\n    limit: 1000000\n    window: 1s\n' > "$WORK/rw.yaml"
nginx -p "$WORK/origin" -c "$WORK/origin/nginx.conf" & PIDS+=($!)
nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" & PIDS+=($!)
NGINX_MASTER=$!
RUST_LOG=off "$BIN" serve -c "$WORK/rw.yaml" --listen 127.0.0.1:$RW --upstream http://127.0.0.1:$UP --workers 1 > /dev/null & PIDS+=($!)
GW=$!
wait_port "$UP"; wait_port "$RW"; wait_port "$NG"
NGINX_WORKER=$(pgrep -P "$NGINX_MASTER")
measure() { python3 - "$@" <<'PY'
import socket, sys, time
name, pid, port, conns = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def rss():
    return int([l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0].split()[1])
def recv(s):
    d = s.recv(1 << 20)
    if not d:
        raise SystemExit("the gateway closed a connection early")
    return d
before = rss()
socks = []
for _ in range(conns):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    while b"\r\n\r\n" not in got:
        got += recv(s)
    head, body = got.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    n = len(body)
    while n < 1048576:
        n += len(recv(s))
    socks.append(s)
# Freed memory goes back to the OS after the allocator's purge delay.
time.sleep(2)
after = rss()
per = (after - before) / conns
print(f"{name:<10} RSS {before} kB before, {after} kB with {conns} idle kept-alive connections "
      f"that each relayed 1 MiB: {per:.1f} kB per connection")
open(sys.argv[5], "w").write(str(per))
PY
}
measure nginx "$NGINX_WORKER" "$NG" "$CONNS" "$WORK/nginx.per"
measure ratewarden "$GW" "$RW" "$CONNS" "$WORK/rw.per"
awk -v a="$(cat "$WORK/rw.per")" -v b="$(cat "$WORK/nginx.per")" \
  'BEGIN { if (b > 0) printf "ratewarden / nginx memory per idle connection: %.2f\n", a / b }'
