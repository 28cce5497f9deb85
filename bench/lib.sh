# Shared by the scripts in bench/ (sourced, not run): the packages they need,
# a work directory and the processes to stop at exit, free loopback ports,
# and the nginx configurations every comparison uses.

# install_missing CMD:PACKAGE...: apt-get installs the packages whose command
# is missing.
install_missing() {
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" > /dev/null || missing+=("${pair#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then apt-get update -qq && apt-get install -y -qq "${missing[@]}"; fi
}

# Everything started goes into PIDS and is stopped at exit; WORK is removed
# (kept, and named, with KEEP=1).
WORK=$(mktemp -d)
PIDS=()
CGROUP=""
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then echo "kept: $WORK" >&2; else rm -rf "$WORK"; fi
  if [ -n "$CGROUP" ]; then rmdir "$CGROUP" 2>/dev/null || true; fi
}
trap cleanup EXIT

# load_field NAME LINE: the number after NAME= in a line of
# examples/rls_load.rs ("calls=... ok=... rate=.../s p99_us=...").
load_field() { sed -E "s/.*(^| )$1=([0-9]+).*/\2/" <<< "$2"; }

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }

# redis_on_cpu0: a redis-server pinned to CPU 0, saving nothing, its port in
# PORT. redis_cli is redis-cli on the server at PORT, redis_cpu its CPU
# seconds so far (INFO cpu, user + system); `cli` and `cpu` are those
# until a script points them elsewhere (a cluster's nodes, say).
redis_on_cpu0() {
  PORT=$(port)
  taskset -c 0 redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$WORK" > /dev/null & PIDS+=($!)
  wait_port "$PORT"
}
redis_cli() { redis-cli -p "$PORT" "$@"; }
redis_cpu() { redis_cli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'; }
cli() { redis_cli "$@"; }
cpu() { redis_cpu; }

# nginx_conf DIR HTTP: DIR/nginx.conf for one worker in the foreground, logs
# and pid in DIR, HTTP inside its `http { }` block. Start it with
# `nginx -p DIR -c DIR/nginx.conf`.
nginx_conf() {
  mkdir -p "$1/logs"
  cat > "$1/nginx.conf" <<NGINX
worker_processes 1;
error_log $1/logs/error.log crit;
pid $1/nginx.pid;
daemon off;
events { worker_connections 4096; }
http { access_log off; $2 }
NGINX
}

# origin_conf DIR PORT: the upstream of every comparison, `return 200 "ok\n"`.
origin_conf() { nginx_conf "$1" "server { listen 127.0.0.1:$2; location / { return 200 \"ok\\n\"; } }"; }

# The limit_req zones of the nginx proxy: `open` is never reached, `shut`
# rejects nearly everything.
NGX_ZONES='limit_req_zone $binary_remote_addr zone=open:10m rate=100000000r/s;
  limit_req_zone $binary_remote_addr zone=shut:10m rate=1r/m;
  limit_req_status 429;'
NGX_OPEN='limit_req zone=open burst=100000000 nodelay;'
NGX_SHUT='limit_req zone=shut nodelay;'

# ngx_upstream PORT: the origin as nginx's kept-alive upstream `origin`.
# ngx_proxy PORT [LIMIT]: an nginx proxy `server` on PORT to `origin`, with
# LIMIT (NGX_OPEN, NGX_SHUT or nothing; with NGX_ZONES in the same `http`).
ngx_upstream() { echo "upstream origin { server 127.0.0.1:$1; keepalive 64; }"; }
ngx_proxy() {
  echo "server { listen 127.0.0.1:$1; location / { ${2:-}
    proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
}

# cpu_budget CORES: a cgroup whose processes together get at most CORES
# (e.g. 0.5) of a CPU, as CFS bandwidth control enforces it (cgroup v2
# cpu.max or v1 cpu.cfs_quota_us; needs root). Sets CGROUP; `in_budget CMD...`
# runs CMD in it. Removed at exit.
cpu_budget() {
  local quota; quota=$(python3 -c "print(int(float('$1') * 100000))")
  if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    echo +cpu > /sys/fs/cgroup/cgroup.subtree_control
    CGROUP=/sys/fs/cgroup/ratewarden-bench.$$
    mkdir "$CGROUP"
    echo "$quota 100000" > "$CGROUP/cpu.max"
  elif [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
    CGROUP=/sys/fs/cgroup/cpu/ratewarden-bench.$$
    mkdir "$CGROUP"
    echo 100000 > "$CGROUP/cpu.cfs_period_us"
    echo "$quota" > "$CGROUP/cpu.cfs_quota_us"
  else
    echo "a CPU budget needs the cgroup cpu controller (v1 or v2) and root" >&2
    exit 1
  fi
}
in_budget() { echo "$BASHPID" > "$CGROUP/cgroup.procs"; exec "$@"; }
