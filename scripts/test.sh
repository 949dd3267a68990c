#!/usr/bin/env bash
# Sets up the machine, builds everything and runs every test.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# The tests also need headless Chromium (the report's rendering test).
bash scripts/setup.sh --test
bash scripts/build.sh
# Tests write only under the system's temporary directory: the work tree must be as it was.
tree_state() {
  if git rev-parse --git-dir >/dev/null 2>&1; then git status --porcelain --untracked-files=all; fi
}
before="$(tree_state)"
# Two test processes at a time, as many as the project's machines have cores.
ctest --test-dir build --output-on-failure --parallel 2
after="$(tree_state)"
if [ "$before" != "$after" ]; then
  echo "test.sh: the tests changed the work tree (they must write under a temporary directory):"
  diff <(echo "$before") <(echo "$after") || true
  exit 1
fi
