#!/usr/bin/env bash
# What happens to freed CPU memory (run.freed_memory), side by side: "cache" (shardtrain's
# allocator keeps large blocks within the peak of live bytes, the default), "malloc" (glibc's
# heap, kept by the shardtrain executable) and "return" (large blocks unmapped when freed). Per
# run: peak RSS (the largest rank's metrics.jsonl mem.peak_rss at the last step), step time (the
# median over steps after the first of the slowest rank's step_time_s), and the system time of
# all ranks as a share of the run's wall time (/usr/bin/time of `shardtrain launch`, which waits
# for its ranks). Each figure is the median over ROUNDS rounds whose order rotates.
#   demo_ddp, demo_fsdp: configs/demo.toml's model at micro-batch 16 on 2 ranks, DDP and
#              full_shard;
#   124m_ddp, 124m_full_shard, 124m_zero3: the GPT-2 124M shape (bench/memory.sh's config:
#              micro-batch 1, seq 128) on 2 ranks.
# Usage: bash bench/freed_memory.sh [ROUNDS]  (from the repository root, after a build;
# CASES="demo_ddp 124m_zero3" runs only those cases).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/shardtrain"
rounds="${1:-2}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (Debian package: time)"; exit 1; }
common=(--set train.sample_tokens=0 --set train.final_checkpoint=false --set train.eval_every=0
  --set run.log_every=1000 --set run.threads=1 --set run.overwrite=true)
cat >"$work/124m.toml" <<TOML
[model]
preset = "gpt2-124m"
context_length = 128
[data]
corpus = ["/usr/share/games/fortunes/fortunes", "/usr/share/games/fortunes/wisdom"]
tokenizer = "gpt2"
seq_len = 128
eval_sequences = 8
[train]
steps = 6
micro_batch = 1
lr = 1e-4
TOML

run() {  # case policy: appends "peak_bytes step_seconds system_share" to $work/case_policy.rows
  local case="$1" policy="$2" dir="$work/runs/$1_$2"
  local config="$work/124m.toml" flags=(--set train.micro_batch=1)
  case "$case" in
    demo_*) config="$root/configs/demo.toml"; flags=(--set train.micro_batch=16 --set train.steps=8) ;;
  esac
  case "$case" in
    *_ddp) flags+=(--set parallel.strategy=ddp) ;;
    *_fsdp|*_full_shard) flags+=(--set parallel.strategy=fsdp --set parallel.fsdp.sharding=full_shard) ;;
    *_zero3) flags+=(--set parallel.strategy=zero --set parallel.zero.stage=3) ;;
  esac
  /usr/bin/time -f "%S %e" -o "$dir.time" "$bin" launch --nproc 2 -- "$bin" train \
    --config "$config" "${common[@]}" "${flags[@]}" --set "run.freed_memory=\"$policy\"" \
    --set "run.dir=\"$dir\"" >"$dir.log" 2>&1 ||
    { echo "run $case $policy failed:"; tail -5 "$dir.log"; exit 1; }
  python3 - "$dir/metrics.jsonl" "$dir.time" >>"$work/${case}_$policy.rows" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
last = max(r["step"] for r in rows)
peak = max(r["mem"]["peak_rss"] for r in rows if r["step"] == last)
steps = sorted({r["step"] for r in rows})[1:] or [last]
step = statistics.median(max(r["step_time_s"] for r in rows if r["step"] == s) for s in steps)
system, wall = map(float, open(sys.argv[2]).read().split()[-2:])
print(peak, step, system / wall)
PY
}

read -r -a cases <<<"${CASES:-demo_ddp demo_fsdp 124m_ddp 124m_full_shard 124m_zero3}"
policies=(cache malloc return)
mkdir -p "$work/runs"
for round in $(seq 1 "$rounds"); do
  for case in "${cases[@]}"; do
    for k in 0 1 2; do run "$case" "${policies[$(((round + k) % 3))]}"; done
  done
done

echo "| case | cache: peak RSS MiB | malloc | return | cache: s/step | malloc | return | cache: system / wall | malloc | return |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for case in "${cases[@]}"; do
  python3 - "$work" "$case" <<'PY'
import statistics, sys
work, case = sys.argv[1], sys.argv[2]
med = {}
for policy in ("cache", "malloc", "return"):
    rows = [tuple(map(float, l.split())) for l in open(f"{work}/{case}_{policy}.rows")]
    med[policy] = [statistics.median(r[i] for r in rows) for i in range(3)]
p = ("cache", "malloc", "return")
print(f"| {case} | " + " | ".join(f"{med[x][0] / (1 << 20):,.0f}" for x in p) + " | "
      + " | ".join(f"{med[x][1]:.3f}" for x in p) + " | "
      + " | ".join(f"{100 * med[x][2]:.1f}%" for x in p) + " |")
PY
done
