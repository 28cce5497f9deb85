#!/usr/bin/env bash
# The README's pictures: one per seed scenario, each `ratewarden simulate`
# of the seed's example config (examples/seed-*.yaml) under a traffic that
# shows what the seed is about. Writes docs/src/img/seed-NNN.svg (the SVG:
# a tenth of the PNG's size, and drawn sharp at any width).
#
#   bash bench/pictures.sh
#
# Deterministic: the generators are seeded, so an unchanged core redraws
# the same pictures.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p ratewarden-gateway --bin ratewarden
BIN=target/release/ratewarden
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
draw() { # draw SEED STEP TRAFFIC
  local seed=$1 step=$2 traffic=$3
  "$BIN" simulate -c examples/seed-$seed-*.yaml --traffic "$traffic" --step "$step" --out "$WORK/$seed" > "$WORK/$seed.txt"
  cp "$WORK/$seed/admitted.svg" "docs/src/img/seed-$seed.svg"
  echo "docs/src/img/seed-$seed.svg"; sed -n '1p' "$WORK/$seed.txt"
}
# 000: a user keeps trying wrong coupon codes, one every 10 s: ten failures
# in five minutes freeze them for ten.
draw 000 10s "steady:rate=0.1,duration=30m,method=POST,path=/api/coupons,status=400"
# 001: double (and triple) clicks on "generate": three POSTs at once every
# 5 s; at most 10 a minute get through.
draw 001 5s "burst:size=3,every=5s,duration=5m,method=POST,path=/api/interview-questions"
# 002: the Go gateway's file: a client browsing at 2/s (50/min allowed) while
# posting comments at 1/s (5/min allowed).
draw 002 5s "steady:rate=2,duration=5m+steady:rate=1,duration=5m,method=POST,path=/api/item/7/comment,start=60s"
# 003: a user sending messages at random, one every 5 s on average: 10 a
# minute, never two within 3 s, and refused attempts count too
# (count_rejected), so retrying too soon keeps the door shut.
draw 003 10s "poisson:rate=0.2,duration=5m,method=POST,path=/api/messages"
# 004: one bot at 3 requests/s among 200 people browsing (1/s between
# them): the bot is banned for 5 min, then 10, then 20, then 40; the people
# are never limited.
draw 004 1m "steady:rate=3,duration=90m+poisson:rate=1,clients=200,duration=90m,seed=4"
