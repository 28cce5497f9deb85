#!/usr/bin/env bash
# The input bound of `cost: {from: llm}` (a request body's length in bytes)
# against OpenAI's tokenizers (tiktoken-rs: o200k_base, cl100k_base) on a
# corpus of chat requests made of this repository's English docs, Rust
# source, and the Korean posts it started from.
#
#   bash bench/token_bound.sh
set -euo pipefail
cd "$(dirname "$0")/.."
files=(README.md ARCHITECTURE.md SECURITY.md crates/ratewarden-gateway/src/proxy/flow/run.rs crates/ratewarden/src/limiter.rs)
for s in ../shared/seeds/*; do [ -f "$s" ] && files+=("$s"); done
cargo run --quiet --release --manifest-path bench/tokens/Cargo.toml -- "${files[@]}"
