#!/usr/bin/env bash
# Runs the 4-rank collectives benchmark at one size several times and reports, per run and as
# medians, the busbw of all_gather and reduce_scatter relative to all_reduce measured in the
# same run. Usage: bench/collectives_ratio.sh [RUNS] [SIZE]   (defaults: 7 runs, 64M)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
runs="${1:-7}"
size="${2:-64M}"
bin="$root/build/shardtrain"
for i in $(seq "$runs"); do
  "$bin" launch --nproc 4 --no-prefix -- "$bin" bench collectives --op all \
    --min-bytes "$size" --max-bytes "$size" --iters 10 --warmup 2 | grep -v '^#'
done | awk '
  { busbw[$1] = $6 }
  $1 == "broadcast" {
    n++; ag[n] = busbw["all_gather"] / busbw["all_reduce"]; rs[n] = busbw["reduce_scatter"] / busbw["all_reduce"]
    printf "run %d: busbw GB/s all_reduce %.3f all_gather %.3f reduce_scatter %.3f | ratio all_gather %.2f reduce_scatter %.2f\n", n, busbw["all_reduce"], busbw["all_gather"], busbw["reduce_scatter"], ag[n], rs[n]
  }
  function median(a, k,   i, j, t) {
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
  }
  END { printf "median ratio over %d runs: all_gather/all_reduce %.2f, reduce_scatter/all_reduce %.2f\n", n, median(ag, n), median(rs, n) }'
