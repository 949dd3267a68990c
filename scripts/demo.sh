#!/usr/bin/env bash
# Sets up the machine, builds shardtrain and runs the demo: the collectives benchmark
# on 4 local ranks started by `shardtrain launch`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/build.sh
build/shardtrain launch --nproc 4 -- build/shardtrain bench collectives --op all --max-bytes 16M
