#!/usr/bin/env bash
# Peak resident memory per rank of full fine-tuning, LoRA with an fp32 and a bf16 base, and
# QLoRA (NF4 base) on the GPT-2 124M shape (d_model 768, 12 layers, context 128; GPT-2 BPE on
# Debian's fortunes; micro-batch 1, seq 128; adapters of rank 8 on every linear layer of the
# blocks), under DDP and FSDP full_shard, beside the planner's estimate for the same run
# (`shardtrain plan --validate`: its total per rank plus what the process held before it built
# the model). Peak RSS is VmHWM of each rank's process (metrics.jsonl's mem.peak_rss at the last
# step); the table shows the largest rank. Then the bytes per weight the NF4 base costs, from the
# outside: the DDP runs with a bf16 and an NF4 base differ only in how the blocks' linear
# weights are stored, so (peak RSS of bf16 - peak RSS of NF4) / (number of those weights) is
# 2 - (NF4 bytes per weight).
# Usage: bash bench/lora.sh [STEPS] [RANKS]   (from the repository root, after a build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
steps="${1:-4}"
ranks="${2:-2}"
bin="$root/build/shardtrain"
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
final_checkpoint = false
sample_tokens = 0
[lora]
alpha = 16
target_modules = "all-linear"
[run]
log_every = 1000
threads = 1
TOML

lora_flags() {
  case "$1" in
    full) echo "--set lora.rank=0" ;;
    lora_fp32) echo "--set lora.rank=8 --set lora.base_dtype=fp32" ;;
    lora_bf16) echo "--set lora.rank=8 --set lora.base_dtype=bf16" ;;
    qlora_nf4) echo "--set lora.rank=8 --set lora.base_dtype=nf4" ;;
  esac
}
strategy_flags() {
  case "$1" in
    ddp) echo "--set parallel.strategy=ddp" ;;
    full_shard) echo "--set parallel.strategy=fsdp --set parallel.fsdp.sharding=full_shard" ;;
  esac
}

echo "| run | strategy | ranks | peak RSS, largest rank (MiB) | model state per rank (MiB) | planner estimate (MiB) | error | median step (s) |"
echo "|---|---|---|---|---|---|---|---|"
for strategy in ddp full_shard; do
  for kind in full lora_fp32 lora_bf16 qlora_nf4; do
    dir="$work/$kind-$strategy"
    # shellcheck disable=SC2046
    "$bin" launch --nproc "$ranks" -- "$bin" train --config "$work/base.toml" --set "run.dir=\"$dir\"" \
      $(lora_flags "$kind") $(strategy_flags "$strategy") >"$dir.log" 2>&1 ||
      { echo "| $kind | $strategy | $ranks | failed: $(tail -1 "$dir.log") |"; continue; }
    estimate="$("$bin" plan --validate "$dir" | sed -n 's/^peak memory per rank: estimate \([0-9]*\) bytes.*/\1/p')"
    python3 "$root/bench/peak_row.py" "$dir/metrics.jsonl" "$estimate" "$kind" "$strategy" "$ranks"
  done
done

# The NF4 base from the outside (DDP: every rank holds the whole base).
python3 - "$work/lora_bf16-ddp/metrics.jsonl.peak" "$work/qlora_nf4-ddp/metrics.jsonl.peak" <<'PY'
import sys
bf16, nf4 = (float(open(p).read()) for p in sys.argv[1:3])
d, f, layers = 768, 3072, 12
weights = layers * (d * 3 * d + d * d + d * f + f * d)  # qkv, proj, fc, proj per block
per_weight = 2 - (bf16 - nf4) / weights
print(f"\nNF4 base, measured: peak RSS bf16 base - NF4 base = {(bf16 - nf4) / (1 << 20):,.1f} MiB over "
      f"{weights / 1e6:.1f}M quantized weights: {per_weight:.3f} bytes per weight "
      f"(bf16 is 2; the packed format is 33/64 + 4/16384 = 0.516)")
PY
