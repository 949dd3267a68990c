#!/usr/bin/env bash
# Builds examples/fully_shard against the installed package (find_package from a clean prefix)
# and runs it with the installed launcher at 1 and 2 ranks: the losses must agree to 1e-5.
# Usage: example.sh BUILD_DIR EXAMPLE_DIR
set -euo pipefail
build="$1"
example="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/build_against_install.sh"
build_against_install "$build" "$example" "$work"
for n in 1 2; do
  "$work/prefix/bin/shardtrain" launch --nproc "$n" -- "$work/project/fully_shard_mlp" \
    > "$work/out.$n"
  cat "$work/out.$n"
  grep -o 'step [0-9]* loss [-0-9.]*' "$work/out.$n" > "$work/losses.$n" || true
done
for n in 1 2; do
  [ "$(wc -l < "$work/losses.$n")" = 10 ] || { echo "$n rank(s): not 10 steps printed"; exit 1; }
done
paste -d' ' "$work/losses.1" "$work/losses.2" | awk '
  { a = $4; b = $8; d = a - b; if (d < 0) d = -d; s = a < 0 ? -a : a
    if (d > 1e-5 * s + 1e-7) { print "step " $2 ": 1 rank " a ", 2 ranks " b; bad = 1 } }
  END { exit bad }'
echo "fully_shard example: 1 and 2 ranks agree"
