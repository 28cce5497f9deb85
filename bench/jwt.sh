#!/usr/bin/env bash
# What a JWT-keyed rule costs per request beside an address-keyed one, each
# request carrying the same RS256 token (a client reusing its token: the
# verifier's cache answers after the first), in alternating rounds of
# bench/ab.sh (CPU per request).
#
#   bash bench/jwt.sh BIN [ROUNDS] [BIN_COLD]
#
# With BIN_COLD (a build without the cache), a third comparison: that build's
# JWT-keyed rule, which verifies the token on every request (the cold case:
# a client with a new token each time costs this), beside BIN's address rule.
# FORGED=1: a flood of distinct forged tokens instead (each request a new
# token, the same claims but for its `sub`, and a signature of the right
# length that verifies for none of them), all from one client: BIN's
# JWT-keyed rule beside its address rule, then (with BIN_COLD, a build
# without the per-client failure budget) that build's, which checks every
# one.
# The key is made here with openssl (RSA-2048), the JWKS and the token with
# python3's standard library; all in a temporary directory.
set -euo pipefail
BIN=$1; ROUNDS=${2:-8}; COLD=${3:-}
DIR=$(mktemp -d); trap 'rm -rf "$DIR"' EXIT
openssl genrsa -out "$DIR/key.pem" 2048 2>/dev/null
MOD=$(openssl rsa -in "$DIR/key.pem" -noout -modulus | cut -d= -f2)
python3 - "$DIR" "$MOD" <<'PY'
import base64, json, sys, subprocess, time
d, mod = sys.argv[1], sys.argv[2]
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
n = bytes.fromhex(mod)
open(f"{d}/jwks.json", "w").write(json.dumps({"keys": [{"kty": "RSA", "kid": "k1", "n": b64(n), "e": b64(b"\x01\x00\x01")}]}))
head = b64(json.dumps({"alg": "RS256", "kid": "k1"}).encode())
body = b64(json.dumps({"sub": "user-7", "exp": int(time.time()) + 86400}).encode())
signed = f"{head}.{body}".encode()
sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", f"{d}/key.pem"], input=signed, capture_output=True, check=True).stdout
open(f"{d}/token", "w").write(f"{head}.{body}.{b64(sig)}")
# 100,000 forgeries: another sub each, the real token's signature.
with open(f"{d}/forged", "w") as f:
    for i in range(100000):
        b = b64(json.dumps({"sub": f"forged-{i}", "exp": int(time.time()) + 86400}).encode())
        f.write(f"{head}.{b}.{b64(sig)}\n")
PY
cat > "$DIR/forged.lua" <<LUA
local tokens, i = {}, 0
for line in io.lines("$DIR/forged") do tokens[#tokens + 1] = line end
request = function()
  i = i % #tokens + 1
  return wrk.format(nil, nil, {["Authorization"] = "Bearer " .. tokens[i]})
end
LUA
cat > "$DIR/fwd-id.yaml" <<YAML
admin: null
rules:
  - {name: fwd, algorithm: gcra, limit: 1000000, window: 1s}
YAML
cat > "$DIR/fwd-jwt.yaml" <<YAML
admin: null
jwt: {jwks: $DIR/jwks.json}
rules:
  - {name: fwd, algorithm: gcra, limit: 1000000, window: 1s, key: ['jwt:sub']}
YAML
if [ -n "${FORGED:-}" ]; then
  export WRK_SCRIPT=$DIR/forged.lua
  echo "== forged flood: address-keyed (A) beside jwt:sub-keyed (B), $BIN"
  bash "$(dirname "$0")/ab.sh" "$DIR/fwd-id.yaml" "$BIN" "$BIN" "$ROUNDS" "$DIR/fwd-jwt.yaml"
  if [ -n "$COLD" ]; then
    echo "== forged flood: address-keyed on $BIN (A) beside jwt:sub-keyed on $COLD (B, every token checked)"
    bash "$(dirname "$0")/ab.sh" "$DIR/fwd-id.yaml" "$BIN" "$COLD" "$ROUNDS" "$DIR/fwd-jwt.yaml"
  fi
  exit 0
fi
export HEADER="Authorization: Bearer $(cat "$DIR/token")"
echo "== warm: address-keyed (A) beside jwt:sub-keyed (B), $BIN"
bash "$(dirname "$0")/ab.sh" "$DIR/fwd-id.yaml" "$BIN" "$BIN" "$ROUNDS" "$DIR/fwd-jwt.yaml"
if [ -n "$COLD" ]; then
  echo "== cold: address-keyed on $BIN (A) beside jwt:sub-keyed on $COLD (B, no cache)"
  bash "$(dirname "$0")/ab.sh" "$DIR/fwd-id.yaml" "$BIN" "$COLD" "$ROUNDS" "$DIR/fwd-jwt.yaml"
fi
