#!/usr/bin/env bash
# Builds the Dockerfile and checks the image it makes: the gateway starts on
# its container config, runs as uid 10001, passes its HEALTHCHECK, answers
# through its echo upstream and limits (100 a minute per client: the 101st
# request is a 429), and stops on SIGTERM. Prints the image's size.
#
#   bash deploy/container-check.sh            # docker, or podman if no docker
#   ENGINE=podman bash deploy/container-check.sh
#
# Needs a container engine and the base images the Dockerfile names
# (rust:1-slim-bookworm, debian:bookworm-slim) from a registry or built
# locally. Publishes on 127.0.0.1 only; removes its container at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${ENGINE:-$(command -v docker || command -v podman || true)}
[ -n "$ENGINE" ] || { echo "no docker or podman here" >&2; exit 2; }
IMAGE=${IMAGE:-localhost/ratewarden:check}
fmt=()
# podman keeps HEALTHCHECK only in the Docker image format.
[ "$(basename "$ENGINE")" = podman ] && fmt=(--format docker)
"$ENGINE" build "${fmt[@]}" -q -t "$IMAGE" . > /dev/null

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cid=$("$ENGINE" run -d -p "127.0.0.1:$port:8080" "$IMAGE")
trap '"$ENGINE" rm -f "$cid" > /dev/null 2>&1 || true' EXIT
fail() { echo "FAIL: $*" >&2; "$ENGINE" logs "$cid" 2>&1 | tail -20 >&2; exit 1; }

# Ready when it says so (a probe request would spend one of the 100).
for _ in $(seq 100); do
  "$ENGINE" logs "$cid" 2>&1 | grep -q 'ratewarden serving' && break
  sleep 0.1
done

uid=$("$ENGINE" exec "$cid" id -u)
[ "$uid" = 10001 ] || fail "runs as uid $uid, not 10001"
echo "user: uid $uid"

if [ "$(basename "$ENGINE")" = podman ]; then
  # Without systemd podman does not schedule the check (it says so on
  # stderr at `run`): run it once.
  "$ENGINE" healthcheck run "$cid" > /dev/null || fail "HEALTHCHECK failed"
  echo "healthcheck: healthy (podman healthcheck run)"
else
  for _ in $(seq 60); do
    health=$("$ENGINE" inspect -f '{{.State.Health.Status}}' "$cid")
    [ "$health" = healthy ] && break
    sleep 1
  done
  [ "$health" = healthy ] || fail "health: $health"
  echo "healthcheck: $health"
fi

codes=$(for _ in $(seq 101); do curl -s -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$port/"; done | sort | uniq -c | tr -s ' ' | tr '\n' ',')
echo "101 requests: $codes"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")" = 429 ] || fail "no 429 after 101 requests"
case "$codes" in *"100 200"*"1 429"*|*"1 429"*"100 200"*) ;; *) fail "expected 100 x 200 and 1 x 429, got $codes" ;; esac

"$ENGINE" logs "$cid" 2>&1 | grep -q '"level":"INFO"' || fail "no JSON log line"
echo "logs: JSON"

start=$(date +%s.%N)
"$ENGINE" stop -t 10 "$cid" > /dev/null
took=$(echo "$(date +%s.%N) - $start" | bc)
code=$("$ENGINE" inspect -f '{{.State.ExitCode}}' "$cid")
echo "stop: exit $code after ${took%????????}s"
[ "$code" = 0 ] || fail "exit code $code on SIGTERM"

size=$("$ENGINE" image inspect -f '{{.Size}}' "$IMAGE")
echo "image: $IMAGE, $((size / 1024 / 1024)) MiB"
echo "container check: ok"
