#!/usr/bin/env bash
# Rewrites the pinned losses in tests/assets/losses/ (and the kernel fingerprint of this machine)
# from the code as it is now. Run it only for a change meant to alter the numerics, and say so in
# that change's commit. `--checkpoint` also rewrites the earlier version's checkpoint in
# tests/assets/checkpoints/: only for a change after which old checkpoints no longer load.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ "${1:-}" = "--checkpoint" ]; then export SHARDTRAIN_PIN_CHECKPOINT=1; shift; fi
if [ $# -gt 0 ]; then
  echo "usage: bash scripts/pin_losses.sh [--checkpoint]" >&2
  exit 2
fi
bash scripts/build.sh
SHARDTRAIN_PIN_LOSSES=1 build/tests/shardtrain_tests --gtest_brief=1 \
  --gtest_filter='Layouts/PinnedLosses.*:PinnedCheckpoint.*'
git status --short tests/assets
