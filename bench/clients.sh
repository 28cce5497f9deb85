#!/usr/bin/env bash
# The clients' overhead per decision (issue 53): CPU of the client process
# per `/v1/check`, through the package against a bare HTTP call on a kept
# connection, same process, alternating, ROUNDS rounds of N calls.
#
#   bash bench/clients.sh [BIN]      # N=3000 ROUNDS=4; needs ./test's venv and Express installs
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-3000}; ROUNDS=${ROUNDS:-4}
if [ $# -gt 0 ]; then BIN=$1; else cargo build --release --bin ratewarden -q; BIN=$PWD/target/release/ratewarden; fi
. bench/lib.sh
PY=${RATEWARDEN_SDK_PYTHON:-$PWD/target/sdk-venv/bin/python}
ADMIN=$(port)
cat > "$WORK/rw.yaml" <<YAML
upstream: echo
listen: 127.0.0.1:$(port)
admin: {listen: 127.0.0.1:$ADMIN}
rules:
  - {name: api, key: [identity], algorithm: gcra, limit: 1000000, window: 1s}
YAML
RUST_LOG=warn taskset -c 0 "$BIN" serve -c "$WORK/rw.yaml" > "$WORK/rw.log" 2>&1 & PIDS+=($!)
wait_port "$ADMIN"
"$PY" -m pip install -q --no-deps --no-build-isolation --force-reinstall clients/python > /dev/null
echo "Python ($("$PY" --version)): CPU µs per decision, package / bare http.client"
taskset -c 1 "$PY" - "$ADMIN" "$N" "$ROUNDS" <<'PY'
import http.client, json, sys, time
from ratewarden import Client
port, n, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
c = Client(f"http://127.0.0.1:{port}", timeout=2)
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
body = json.dumps({"rule": "api", "key": "k", "cost": 1}).encode()
def bare():
    conn.request("POST", "/v1/check", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse(); json.loads(r.read())
def package():
    assert c.check("api", "k").allowed
for f in (bare, package):
    for _ in range(200): f()
for r in range(rounds):
    out = []
    for name, f in (("bare", bare), ("package", package)):
        t = time.process_time()
        for _ in range(n): f()
        out.append((time.process_time() - t) / n * 1e6)
    print(f"round {r + 1}: bare {out[0]:.1f} µs, package {out[1]:.1f} µs, package / bare {out[1] / out[0]:.2f}")
PY
NODE_DIR=${RATEWARDEN_NODE_CLIENTS:-$PWD/target/node-clients}/express5
echo "Node ($(node --version)): CPU µs per decision, package / bare fetch"
cat > "$NODE_DIR/bench.mjs" <<'JS'
import { createClient } from 'ratewarden';
const [port, n, rounds] = process.argv.slice(2).map(Number);
const url = `http://127.0.0.1:${port}`;
const client = createClient({ url, timeout: 2000 });
const body = JSON.stringify({ rule: 'api', key: 'k', cost: 1 });
const bare = async () => {
  const r = await fetch(url + '/v1/check', { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  await r.json();
};
const pkg = async () => { if (!(await client.check('api', 'k')).allowed) throw new Error('refused'); };
for (const f of [bare, pkg]) for (let i = 0; i < 200; i++) await f();
for (let r = 0; r < rounds; r++) {
  const out = [];
  for (const f of [bare, pkg]) {
    const t = process.cpuUsage();
    for (let i = 0; i < n; i++) await f();
    const d = process.cpuUsage(t);
    out.push((d.user + d.system) / n);
  }
  console.log(`round ${r + 1}: bare ${out[0].toFixed(1)} µs, package ${out[1].toFixed(1)} µs, package / bare ${(out[1] / out[0]).toFixed(2)}`);
}
JS
(cd "$NODE_DIR" && taskset -c 1 node bench.mjs "$ADMIN" "$N" "$ROUNDS")
rm -f "$NODE_DIR/bench.mjs"
