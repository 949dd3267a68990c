#!/usr/bin/env bash
# Side by side: shardtrain's DDP (bench/ddp_bench.cpp) and PyTorch's (bench/ddp_torch.py, Debian's
# python3-torch, gloo) on the same MLP, batch and rank count, both started by shardtrain launch,
# alternating ROUNDS times. Prints each run and the median step times and their ratio.
# Usage: bench/ddp_compare.sh [RANKS] [ROUNDS] [extra flags for both, e.g. --width 2048]
set -euo pipefail
source "$(dirname "$0")/side_by_side.sh"
for i in $(seq "$rounds"); do
  "${launch[@]}" "$root/build/bench_ddp" "$@"
  "${launch[@]}" /usr/bin/python3 "$root/bench/ddp_torch.py" "$@"
done | tee /dev/stderr | python3 -c '
import json, statistics, sys
runs = [json.loads(line) for line in sys.stdin if line.startswith("{")]
ours = [r["median_step_s"] for r in runs if r["impl"] == "shardtrain"]
theirs = [r["median_step_s"] for r in runs if r["impl"] == "pytorch"]
hidden = [r["median_hidden_fraction"] for r in runs if r["impl"] == "shardtrain"]
print(f"median step time over {len(ours)} runs each: shardtrain {statistics.median(ours)*1e3:.1f} ms, "
      f"pytorch {statistics.median(theirs)*1e3:.1f} ms, ratio {statistics.median(ours)/statistics.median(theirs):.3f}; "
      f"all-reduce hidden behind backward (median) {statistics.median(hidden)*100:.0f}%")'
