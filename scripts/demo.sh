#!/usr/bin/env bash
# Sets up the machine, builds shardtrain and runs the demo: a small GPT-2-family model trained on
# the fortune cookie files of Debian's `fortunes` package with GPT-2's tokenizer, data parallel
# over 2 ranks started by `shardtrain launch`; it prints a progress line every 25 steps, the
# evaluation loss, and a sample at the end.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/build.sh
rm -rf runs/demo
build/shardtrain launch --nproc 2 -- build/shardtrain train --config configs/demo.toml "$@"
