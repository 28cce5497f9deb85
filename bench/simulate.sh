#!/usr/bin/env bash
# How fast `ratewarden simulate` replays, beside the core alone on the same
# traffic in the same run (examples/core_fold.rs: Limiter::check in a loop,
# one thread, no admission path, no series).
#
#   bash bench/simulate.sh [ROUNDS]    # ROUNDS=3
#
# Two rules, each alone: `per-client` (gcra keyed by the client: simulate
# splits the clients between the machine's cores) and `everyone` (one
# global key: one thread). Traffic: 12M requests, 10,000 clients drawn at
# random (attack:rate=200000,clients=10000,duration=60s). Prints simulate's
# own replay rate (its summary line: reading the traffic and drawing are
# not counted, nor are they in the reference) and the reference's.
set -euo pipefail
ROUNDS=${1:-3}
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
cargo build --release -q -p ratewarden-gateway --bin ratewarden --example core_fold
BIN=target/release/ratewarden; REF=target/release/examples/core_fold
SPEC="attack:rate=200000,clients=10000,duration=60s"
cat > "$WORK/per-client.yaml" <<'YAML'
rules:
  - name: per-client
    algorithm: gcra
    limit: 100
    window: 1s
YAML
cat > "$WORK/everyone.yaml" <<'YAML'
rules:
  - name: everyone
    key: [global]
    algorithm: gcra
    limit: 150000
    window: 1s
YAML
for conf in per-client everyone; do
  for _ in $(seq "$ROUNDS"); do
    sim=$("$BIN" simulate -c "$WORK/$conf.yaml" --traffic "$SPEC" | head -1)
    rate=$(sed -E 's/.*\(([0-9.]+)M requests\/s\).*/\1/' <<< "$sim")
    ref=$("$REF" "$WORK/$conf.yaml" "$SPEC")
    ref_rate=$(load_field rate "$ref")
    awk -v c="$conf" -v s="$rate" -v r="$ref_rate" \
      'BEGIN { printf "%-12s simulate %6.2fM/s   core alone %6.2fM/s   ratio %.2f\n", c, s, r / 1e6, s * 1e6 / r }'
  done
done
