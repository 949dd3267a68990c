#!/usr/bin/env bash
# The loss over chunks of the head's logits (train.chunked_loss) against the loss over the whole
# logits, side by side: peak RSS per rank (the largest rank's metrics.jsonl mem.peak_rss at the
# last step) and step time (the median over steps after the first of the slowest rank's
# step_time_s), each the median over ROUNDS rounds whose order alternates.
#   demo_mb16: configs/demo.toml's model (GPT-2's vocabulary of 50,257) at micro-batch 16 on 2
#              DDP ranks (16 x 128 tokens per rank);
#   llama3_vocab: a tiny Llama (4 blocks, d_model 128) with Llama 3's vocabulary size (128,256)
#              on one process at sequences of 2,048 tokens, micro-batch 1.
# Usage: bash bench/chunked_loss.sh [ROUNDS] [STEPS]  (from the repository root, after a build;
# CASES="demo_mb16" runs only those cases).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/shardtrain"
rounds="${1:-3}"
steps="${2:-6}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$root/bench/corpus.py" "$work/corpus.txt"
common=(--set "train.steps=$steps" --set train.sample_tokens=0 --set train.final_checkpoint=false
  --set train.eval_every=0 --set run.log_every=1000 --set run.threads=1 --set run.overwrite=true)

run() {  # case variant: appends "peak_bytes step_seconds" to $work/case_variant.rows
  local case="$1" variant="$2" dir="$work/runs/$1_$2"
  local chunked=false
  [ "$variant" = chunked ] && chunked=true
  case "$case" in
    demo_mb16)
      "$bin" launch --nproc 2 -- "$bin" train --config "$root/configs/demo.toml" "${common[@]}" \
        --set train.micro_batch=16 --set "train.chunked_loss=$chunked" --set "run.dir=$dir" \
        >"$dir.log" 2>&1 ;;
    llama3_vocab)
      cat >"$work/llama.toml" <<TOML
[model]
preset = "tiny-llama"
vocab_size = 128256
context_length = 2048
d_model = 128
n_layers = 4
n_heads = 4
n_kv_heads = 2
ffn_hidden = 352
[data]
corpus = "$work/corpus.txt"
tokenizer = "byte"
seq_len = 2048
eval_sequences = 0
[train]
micro_batch = 1
lr = 1e-4
[run]
memory_check = false
TOML
      "$bin" train --config "$work/llama.toml" "${common[@]}" \
        --set "train.chunked_loss=$chunked" --set "run.dir=$dir" >"$dir.log" 2>&1 ;;
  esac || { echo "run $case $variant failed:"; tail -5 "$dir.log"; exit 1; }
  python3 - "$dir/metrics.jsonl" >>"$work/${case}_$variant.rows" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
last = max(r["step"] for r in rows)
peak = max(r["mem"]["peak_rss"] for r in rows if r["step"] == last)
steps = sorted({r["step"] for r in rows})[1:] or [last]
print(peak, statistics.median(max(r["step_time_s"] for r in rows if r["step"] == s) for s in steps))
PY
}

read -r -a cases <<<"${CASES:-demo_mb16 llama3_vocab}"
mkdir -p "$work/runs"
for round in $(seq 1 "$rounds"); do
  for case in "${cases[@]}"; do
    if [ $((round % 2)) -eq 1 ]; then order="whole chunked"; else order="chunked whole"; fi
    for variant in $order; do run "$case" "$variant"; done
  done
done

echo "| case | whole: peak RSS MiB | chunked: peak RSS MiB | chunked / whole | whole s/step | chunked s/step | chunked / whole |"
echo "|---|---|---|---|---|---|---|"
for case in "${cases[@]}"; do
  python3 - "$work/${case}_whole.rows" "$work/${case}_chunked.rows" "$case" <<'PY'
import statistics, sys
read = lambda p: [tuple(map(float, l.split())) for l in open(p)]
w, c = read(sys.argv[1]), read(sys.argv[2])
wp, cp = statistics.median(r[0] for r in w), statistics.median(r[0] for r in c)
wt, ct = statistics.median(r[1] for r in w), statistics.median(r[1] for r in c)
mib = 1 << 20
print(f"| {sys.argv[3]} | {wp / mib:,.0f} | {cp / mib:,.0f} | {cp / wp:.2f} | {wt:.3f} | {ct:.3f} | {ct / wt:.3f} |")
PY
done
