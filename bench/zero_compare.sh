#!/usr/bin/env bash
# Side by side: shardtrain's ZeRO stage 1 (bench/zero_bench.cpp) and PyTorch's
# ZeroRedundancyOptimizer over DistributedDataParallel (bench/zero_torch.py, Debian's
# python3-torch, gloo) on the same GPT-2-family model, batch, optimizer and rank count, both
# started by shardtrain launch, alternating ROUNDS times (which one goes first swaps each round).
# Prints each run, then the median step times, their ratio (shardtrain / pytorch) and the median
# of each phase on both sides.
# Usage: bench/zero_compare.sh [RANKS] [ROUNDS] [extra flags for both, e.g. --batch 2 --stage 0]
set -euo pipefail
source "$(dirname "$0")/side_by_side.sh"
ours=("${launch[@]}" "$root/build/bench_zero" "$@")
theirs=("${launch[@]}" /usr/bin/python3 "$root/bench/zero_torch.py" "$@")
# Which program runs first swaps every round, so that neither always follows the other.
for i in $(seq "$rounds"); do
  if (( i % 2 )); then "${ours[@]}"; "${theirs[@]}"; else "${theirs[@]}"; "${ours[@]}"; fi
done | tee /dev/stderr | python3 -c '
import json, statistics, sys
runs = [json.loads(line) for line in sys.stdin if line.startswith("{")]
ours = [r for r in runs if r["impl"] == "shardtrain"]
theirs = [r for r in runs if r["impl"] == "pytorch"]
params = {r["params"] for r in runs}
if len(params) != 1:
    sys.exit(f"the two sides trained different models: parameter counts {sorted(params)}")
step_ours = statistics.median(r["median_step_s"] for r in ours)
step_theirs = statistics.median(r["median_step_s"] for r in theirs)
stage = runs[0]["stage"]
print(f"median step time over {len(ours)} runs each ({params.pop():,} parameters, stage {stage}): "
      f"shardtrain {step_ours*1e3:.1f} ms, pytorch {step_theirs*1e3:.1f} ms, "
      f"ratio {step_ours/step_theirs:.3f}")
for impl, rs in (("shardtrain", ours), ("pytorch", theirs)):
    names = rs[0]["median_phase_s"]
    phases = {n: statistics.median(r["median_phase_s"][n] for r in rs) for n in names}
    listed = ", ".join(f"{n} {v*1e3:.1f}" for n, v in phases.items())
    print(f"  {impl} phase medians (ms): {listed}")'
