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

# The base's bytes per weight from the outside: the process's resident memory before and after
# the base is materialized (heap trimmed), once per storage; embeddings, norms and biases are fp32
# in all three, so the differences are the blocks' linear weights alone.
for storage in fp32 bf16 nf4; do "$root/build/bench_lora_base" "$storage"; done >"$work/base.txt"
python3 - "$work/base.txt" <<'PY'
import sys
rows = {f[0]: (int(f[1]), int(f[2]), int(f[3])) for f in (l.split() for l in open(sys.argv[1]))}
held = {k: after - before for k, (before, after, _) in rows.items()}
weights = rows["fp32"][2]
mib = 1 << 20
print(f"\nBase held in memory (VmRSS after - before materializing, GPT-2 124M, {weights / 1e6:.1f}M "
      f"linear weights in the blocks): fp32 {held['fp32'] / mib:,.1f} MiB, bf16 {held['bf16'] / mib:,.1f} MiB, "
      f"nf4 {held['nf4'] / mib:,.1f} MiB.")
for ref, width in (("fp32", 4), ("bf16", 2)):
    per = width - (held[ref] - held["nf4"]) / weights
    print(f"NF4 bytes per weight from {ref} - nf4: {per:.3f}")
print("(bf16 against fp32: %.3f bytes per weight)" % (4 - (held["fp32"] - held["bf16"]) / weights))
PY
