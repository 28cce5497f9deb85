#!/usr/bin/env bash
# A release build of the workspace from scratch, as a new user's first
# command pays it: `cargo build --release --workspace` with an empty
# target directory, for each commit given (default: HEAD), one after the
# other (a build takes both cores: never two at once). Prints wall-clock
# and CPU seconds per commit, and where the build spent its time
# (`--timings`: the longest units and when the gateway crate started).
# With KEEP_TIMINGS=DIR, each commit's cargo-timing.html is kept there.
# Sources must be downloaded already (`cargo fetch`): network time is not
# build time. Each build uses its own git worktree under $WORK.
#
#   bash bench/build_time.sh [COMMIT...]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
cargo fetch -q
[ $# -gt 0 ] || set -- HEAD
for commit in "$@"; do
  wt=$WORK/wt-$(git rev-parse --short "$commit")
  git worktree add -f -q --detach "$wt" "$commit"
  (cd "$wt" && /usr/bin/time -f "%e %U %S" -o "$WORK/time" \
    cargo build --release --workspace --timings -q 2> "$WORK/log" > /dev/null) \
    || { cat "$WORK/log"; exit 1; }
  read -r wall user sys < "$WORK/time"
  printf '%s  %7.1f s wall  %7.1f s CPU (user %.1f, system %.1f)\n' \
    "$(git log -1 --format='%h %s' "$commit" | cut -c1-60)" "$wall" \
    "$(python3 -c "print($user + $sys)")" "$user" "$sys"
  python3 - "$wt/target/cargo-timings/cargo-timing.html" <<'PY'
import json, re, sys
units = json.loads(re.search(r"const UNIT_DATA = (\[.*?\]);\n", open(sys.argv[1]).read(), re.S).group(1))
for u in sorted(units, key=lambda u: -u["duration"])[:6]:
    print(f"    {u['duration']:6.1f} s  {u['name']} {u['target'].strip()}  (from {u['start']:.0f} s)")
PY
  if [ -n "${KEEP_TIMINGS:-}" ]; then
    mkdir -p "$KEEP_TIMINGS"
    cp "$wt/target/cargo-timings/cargo-timing.html" "$KEEP_TIMINGS/$(git rev-parse --short "$commit").html"
  fi
  git worktree remove --force "$wt"
done
