#!/usr/bin/env bash
# Memory and time of attention against the sequence length, side by side: the blockwise kernel
# (train.attention = "blockwise", no [seq x seq] tensor) and the reference (the scores and
# weights written out and kept for backward), one process. Per run: peak RSS (metrics.jsonl's
# mem.peak_rss at the last step), its increase over the shortest length's run of the same kernel
# (what the longer sequence costs: activations, with the parameters and optimizer state equal),
# and the step time (median of the steps after the first).
# The model: the Llama family (RoPE, grouped-query attention: 4 query heads over 2 key/value
# heads of 64), d_model 256, 2 layers, micro-batch 1, fp32, on the fortune files tokenized with
# GPT-2's BPE.
# Usage: bash bench/long_context.sh  (from the repository root, after a build; LENGTHS="1024
# 4096" and REFERENCE_MAX=8192, the longest length the reference runs at, choose the runs).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SHARDTRAIN_BIN:-$root/build/shardtrain}"
read -r -a lengths <<<"${LENGTHS:-1024 2048 4096 8192 16384}"
reference_max="${REFERENCE_MAX:-8192}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
longest="${lengths[-1]}"
cat >"$work/model.toml" <<TOML
[model]
preset = "tiny-llama"
context_length = $longest
d_model = 256
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_hidden = 688
[data]
corpus = [
  "/usr/share/games/fortunes/fortunes", "/usr/share/games/fortunes/wisdom",
  "/usr/share/games/fortunes/literature", "/usr/share/games/fortunes/humorists",
  "/usr/share/games/fortunes/science", "/usr/share/games/fortunes/people",
]
tokenizer = "gpt2"
eval_sequences = 0
[train]
steps = 3
micro_batch = 1
sample_tokens = 0
final_checkpoint = false
[run]
threads = 2
log_every = 1000
overwrite = true
TOML

run() {  # kernel length: prints "peak_bytes step_seconds"
  local dir="$work/runs/$1_$2"
  "$bin" train --config "$work/model.toml" --set "train.attention=\"$1\"" \
    --set "data.seq_len=$2" --set "run.dir=\"$dir\"" >"$dir.log" 2>&1 ||
    { echo "run $1 $2 failed:" >&2; tail -5 "$dir.log" >&2; return 1; }
  python3 - "$dir/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
last = max(r["step"] for r in rows)
peak = max(r["mem"]["peak_rss"] for r in rows if r["step"] == last)
print(peak, statistics.median(r["step_time_s"] for r in rows if r["step"] > 1))
PY
}

mkdir -p "$work/runs"
echo "| seq_len | blockwise: peak RSS MiB | over the shortest | s/step | reference: peak RSS MiB | over the shortest | s/step |"
echo "|---|---|---|---|---|---|---|"
declare -A base
for length in "${lengths[@]}"; do
  line="| $length"
  for kernel in blockwise reference; do
    if [ "$kernel" = reference ] && [ "$length" -gt "$reference_max" ]; then
      line+=" | not run | | "
      continue
    fi
    read -r peak step < <(run "$kernel" "$length")
    [ -n "${base[$kernel]:-}" ] || base[$kernel]="$peak"
    line+="$(python3 -c "import sys; p,b,s=map(float,sys.argv[1:]); print(f' | {p/2**20:,.0f} | {(p-b)/2**20:,.0f} | {s:.2f}')" "$peak" "${base[$kernel]}" "$step")"
  done
  echo "$line |"
done
