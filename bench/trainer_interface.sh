#!/usr/bin/env bash
# Step time of two builds of the trainer side by side: DDP, FSDP full_shard, ZeRO-1, ZeRO-3 at
# 2 ranks and pp = 2 (1F1B, 4 micro-batches), on a GPT-2 shape of 4 blocks (d_model 256,
# 4 heads, FFN 1024, vocabulary 2048, sequences of 128, micro-batches of 2, fp32, one thread per
# rank). Each round runs every layout with BEFORE then AFTER (the order alternates between
# rounds, so that a machine slowing down during the run favours neither); a run's step time is
# rank 0's median over its steps after the first (metrics.jsonl step_time_s); a layout's figure
# is the median over the rounds, and the ratio AFTER / BEFORE.
# Usage: bash bench/trainer_interface.sh BEFORE_BINARY [AFTER_BINARY] [ROUNDS] [STEPS]
# (AFTER defaults to build/shardtrain; from the repository root, after a build). LAYOUTS="ddp
# pp2" runs only those layouts.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
before="${1:?usage: bench/trainer_interface.sh BEFORE_BINARY [AFTER_BINARY] [ROUNDS] [STEPS]}"
after="${2:-$root/build/shardtrain}"
rounds="${3:-5}"
steps="${4:-12}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$root/bench/corpus.py" "$work/corpus.txt"
cat >"$work/base.toml" <<TOML
[model]
preset = "tiny"
vocab_size = 2048
context_length = 128
d_model = 256
n_layers = 4
n_heads = 4
n_kv_heads = 4
ffn_hidden = 1024
[data]
corpus = "$work/corpus.txt"
seq_len = 128
eval_sequences = 8
[train]
steps = $steps
lr = 1e-4
sample_tokens = 0
micro_batch = 2
final_checkpoint = false
[run]
log_every = 1000
threads = 1
memory_check = false
TOML

read -r -a layouts <<<"${LAYOUTS:-ddp fsdp_full_shard zero1 zero3 pp2}"
flags() {
  case "$1" in
    ddp) echo "--set parallel.strategy=ddp" ;;
    fsdp_full_shard) echo "--set parallel.strategy=fsdp --set parallel.fsdp.sharding=full_shard" ;;
    zero1) echo "--set parallel.strategy=zero --set parallel.zero.stage=1" ;;
    zero3) echo "--set parallel.strategy=zero --set parallel.zero.stage=3" ;;
    pp2) echo "--set parallel.pp=2 --set parallel.pp_schedule=1f1b --set train.grad_accum=4" ;;
  esac
}

run() {  # binary layout name: appends rank 0's median step time to $work/name.times
  local bin="$1" layout="$2" name="$3"
  # shellcheck disable=SC2046
  "$bin" launch --nproc 2 -- "$bin" train --config "$work/base.toml" \
    --set "run.dir=$work/runs/$name" --set run.overwrite=true $(flags "$layout") \
    >"$work/$name.log" 2>&1 || { echo "run $name failed:"; tail -5 "$work/$name.log"; exit 1; }
  python3 - "$work/runs/$name/metrics.jsonl" >>"$work/$name.times" <<'PY'
import json, statistics, sys
times = [l["step_time_s"] for l in map(json.loads, open(sys.argv[1]))
         if l["rank"] == 0 and l["step"] > 1]
print(statistics.median(times))
PY
}

for round in $(seq 1 "$rounds"); do
  for layout in "${layouts[@]}"; do
    if [ $((round % 2)) -eq 1 ]; then
      run "$before" "$layout" "before_$layout"
      run "$after" "$layout" "after_$layout"
    else
      run "$after" "$layout" "after_$layout"
      run "$before" "$layout" "before_$layout"
    fi
  done
done

echo "| layout | before s/step | after s/step | after / before | rounds (before; after) |"
echo "|---|---|---|---|---|"
for layout in "${layouts[@]}"; do
  python3 - "$work/before_$layout.times" "$work/after_$layout.times" "$layout" <<'PY'
import statistics, sys
before = [float(x) for x in open(sys.argv[1])]
after = [float(x) for x in open(sys.argv[2])]
b, a = statistics.median(before), statistics.median(after)
fmt = lambda xs: " ".join(f"{x:.4f}" for x in xs)
print(f"| {sys.argv[3]} | {b:.4f} | {a:.4f} | {a / b:.3f} | {fmt(before)}; {fmt(after)} |")
PY
done
