#!/usr/bin/env bash
# Per-parameter FSDP (fully_shard per block, then the root) against flat-parameter FSDP
# (FullyShardedDataParallel) on the GPT-2 124M shape, full_shard, side by side: for each rank
# count, ROUNDS rounds alternating the two layouts, each run launched by shardtrain with
# build/bench_fsdp_layout (STEPS timed steps after 2 warm-up steps). Prints per run the median
# step time (rank 0) and the largest peak RSS of any rank, then per rank count the medians
# over the rounds and the median of the per-round ratios per_param / flat.
# Usage: bench/fsdp_layout.sh [ROUNDS] [STEPS] [RANKS...]   (defaults: 3 6 2 4)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-3}"
steps="${2:-6}"
shift $(( $# > 2 ? 2 : $# ))
ranks_list=("$@")
[ ${#ranks_list[@]} -eq 0 ] && ranks_list=(2 4)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for ranks in "${ranks_list[@]}"; do
  for round in $(seq "$rounds"); do
    for layout in flat per_param; do
      "$root/build/shardtrain" launch --nproc "$ranks" -- "$root/build/bench_fsdp_layout" \
        --layout "$layout" --steps "$steps" --warmup 2 | sed 's/^\[rank [0-9]*\] //' \
        > "$out/$ranks-$round-$layout.jsonl"
    done
  done
done
python3 - "$out" "$rounds" "${ranks_list[@]}" <<'PY'
import json, statistics, sys
out, rounds, ranks_list = sys.argv[1], int(sys.argv[2]), [int(r) for r in sys.argv[3:]]
def run(ranks, rnd, layout):
    lines = [json.loads(l) for l in open(f"{out}/{ranks}-{rnd}-{layout}.jsonl") if l.startswith("{")]
    first = next(l for l in lines if l["rank"] == 0)
    return first["median_step_s"], max(l["peak_rss_mib"] for l in lines), first["losses"]
print("| ranks | round | flat step s | per-param step s | ratio | flat peak RSS MiB | per-param peak RSS MiB | ratio |")
print("|---|---|---|---|---|---|---|---|")
summary = []
for ranks in ranks_list:
    t_ratio, m_ratio, tf, tp, mf, mp = [], [], [], [], [], []
    for rnd in range(1, rounds + 1):
        f, p = run(ranks, rnd, "flat"), run(ranks, rnd, "per_param")
        if any(abs(a - b) > 1e-5 * abs(a) for a, b in zip(f[2], p[2])):
            sys.exit(f"losses differ at {ranks} ranks: flat {f[2]}, per_param {p[2]}")
        t_ratio.append(p[0] / f[0]); m_ratio.append(p[1] / f[1])
        tf.append(f[0]); tp.append(p[0]); mf.append(f[1]); mp.append(p[1])
        print(f"| {ranks} | {rnd} | {f[0]:.3f} | {p[0]:.3f} | {p[0]/f[0]:.3f} | {f[1]:,.0f} | {p[1]:,.0f} | {p[1]/f[1]:.3f} |")
    summary.append((ranks, statistics.median(tf), statistics.median(tp), statistics.median(t_ratio),
                    statistics.median(mf), statistics.median(mp), statistics.median(m_ratio)))
print()
print("| ranks | flat step s (median) | per-param step s (median) | step ratio (median) | flat peak RSS MiB | per-param peak RSS MiB | RSS ratio (median) |")
print("|---|---|---|---|---|---|---|")
for s in summary:
    print(f"| {s[0]} | {s[1]:.3f} | {s[2]:.3f} | {s[3]:.3f} | {s[4]:,.0f} | {s[5]:,.0f} | {s[6]:.3f} |")
PY
