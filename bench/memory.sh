#!/usr/bin/env bash
# Peak resident memory per rank of each strategy on the GPT-2 124M shape (d_model 768, 12
# layers, context 128; GPT-2 BPE on Debian's fortunes; micro-batch 1, seq 128), at 1, 2 and 4
# ranks, beside the planner's estimate for the same run (`shardtrain plan --validate`: its
# total per rank plus what the process held before it built the model, recorded in run.json).
# Each run trains STEPS steps; peak RSS is VmHWM of each rank's process (metrics.jsonl's
# mem.peak_rss at the last step), the table shows the largest rank.
# Usage: bash bench/memory.sh [STEPS] [RANKS...]   (from the repository root, after a build)
# STRATEGIES="ddp full_shard zero3" bash bench/memory.sh ... runs a subset.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
steps="${1:-4}"
shift $(( $# > 0 ? 1 : 0 ))
ranks_list="${*:-1 2 4}"
bin="${SHARDTRAIN_BIN:-$root/build/shardtrain}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/base.toml" <<TOML
[model]
preset = "gpt2-124m"
context_length = 128
[data]
corpus = ["/usr/share/games/fortunes/fortunes", "/usr/share/games/fortunes/wisdom"]
tokenizer = "gpt2"
seq_len = 128
eval_sequences = 8
[train]
steps = $steps
micro_batch = 1
lr = 1e-4
eval_every = 0
checkpoint_every = 0
sample_tokens = 0
[run]
log_every = 1000
threads = 1
TOML

flags_of() {
  case "$1" in
    none) echo "--set parallel.strategy=none" ;;
    ddp) echo "--set parallel.strategy=ddp" ;;
    full_shard|shard_grad_op|no_shard) echo "--set parallel.strategy=fsdp --set parallel.fsdp.sharding=$1" ;;
    hybrid_shard) echo "--set parallel.strategy=fsdp --set parallel.fsdp.sharding=hybrid_shard --set parallel.fsdp.replicate=2" ;;
    zero1|zero2|zero3) echo "--set parallel.strategy=zero --set parallel.zero.stage=${1#zero}" ;;
    zero2_cpu) echo "--set parallel.strategy=zero --set parallel.zero.stage=2 --set parallel.zero.offload_optimizer=cpu" ;;
    zero3_nvme) echo "--set parallel.strategy=zero --set parallel.zero.stage=3 --set parallel.zero.offload_optimizer=nvme --set parallel.zero.offload_param=nvme --set parallel.zero.nvme_path=\"$work/swap\"" ;;
  esac
}

mkdir -p "$work/swap"
echo "| strategy | ranks | peak RSS, largest rank (MiB) | model state per rank (MiB) | planner estimate (MiB) | error | median step (s) |"
echo "|---|---|---|---|---|---|---|"
for ranks in $ranks_list; do
  for strategy in ${STRATEGIES:-none ddp full_shard shard_grad_op no_shard hybrid_shard zero1 zero2 zero3 zero2_cpu zero3_nvme}; do
    [ "$strategy" = none ] && [ "$ranks" != 1 ] && continue
    [ "$strategy" = hybrid_shard ] && [ "$ranks" != 4 ] && continue
    dir="$work/$strategy-$ranks"
    # shellcheck disable=SC2046
    if [ "$ranks" = 1 ] && [ "$strategy" = none ]; then
      "$bin" train --config "$work/base.toml" --set "run.dir=\"$dir\"" $(flags_of "$strategy") >"$dir.log" 2>&1 || { echo "| $strategy | $ranks | failed: $(tail -1 "$dir.log") |"; continue; }
    else
      "$bin" launch --nproc "$ranks" -- "$bin" train --config "$work/base.toml" --set "run.dir=\"$dir\"" \
        $(flags_of "$strategy") >"$dir.log" 2>&1 || { echo "| $strategy | $ranks | failed: $(tail -1 "$dir.log") |"; continue; }
    fi
    estimate="$("$bin" plan --validate "$dir" | sed -n 's/^peak memory per rank: estimate \([0-9]*\) bytes.*/\1/p')"
    python3 "$root/bench/peak_row.py" "$dir/metrics.jsonl" "$estimate" "$strategy" "$ranks"
    rm -rf "$dir/checkpoints" "$work/swap"/*
  done
done
