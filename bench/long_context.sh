#!/usr/bin/env bash
# Memory and time of attention against the sequence length, side by side: the blockwise kernel
# (train.attention = "blockwise", no [seq x seq] tensor) and the reference (the scores and
# weights written out and kept for backward), one process. Per run: peak RSS (metrics.jsonl's
# mem.peak_rss at the last step), its increase over the shortest length's run of the same kernel
# (what the longer sequence costs: activations, with the parameters and optimizer state equal),
# and the step time (median of the steps after the first).
# The model: the Llama family (RoPE, grouped-query attention: 4 query heads over 2 key/value
# heads of 64), d_model 256, 2 layers, micro-batch 1, fp32, on the fortune files tokenized by
# bytes: a vocabulary of 257 keeps the embedding's and the logits' memory small, so that the
# peak follows the activations even at the shortest length.
# Then context parallelism at CP_LENGTH (default 8192) for cp = 1, 2, 4 (`shardtrain launch`,
# DDP over the cp ranks, one thread per rank): per rank, the peak RSS and its increase over the
# same cp's run at 1024 tokens (the activations the longer sequence costs), that increase against
# cp = 1's, the step time, and the share of the ring's communication that was not waited for:
# 1 - (time blocked in "ring hop" waits) / (time "ring hop" transfers were in flight, from their
# post to their completion), summed over every rank's trace.
# Usage: bash bench/long_context.sh  (from the repository root, after a build; LENGTHS="1024
# 4096" and REFERENCE_MAX=8192, the longest length the reference runs at, CP_LENGTH and
# CP_SIZES="1 2 4" choose the runs; CP_ONLY=1 skips the first table).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SHARDTRAIN_BIN:-$root/build/shardtrain}"
read -r -a lengths <<<"${LENGTHS:-1024 2048 4096 8192 16384}"
read -r -a cp_sizes <<<"${CP_SIZES:-1 2 4}"
cp_length="${CP_LENGTH:-8192}"
reference_max="${REFERENCE_MAX:-8192}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
longest="${lengths[-1]}"
[ "$longest" -ge "$cp_length" ] || longest="$cp_length"
# Tokenized once, so that no run's peak is its own tokenization.
f=/usr/share/games/fortunes
"$bin" data prepare --corpus "$f/fortunes" "$f/wisdom" "$f/literature" "$f/humorists" \
  "$f/science" "$f/people" --tokenizer byte --out "$work/corpus.tokens" >/dev/null
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
corpus = ["$work/corpus.tokens"]
tokenizer = "byte"
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

cp_run() {  # cp length: prints "peak_bytes step_seconds ring_hidden_share"
  local dir="$work/runs/cp$1_$2"
  "$bin" launch --nproc "$1" -- "$bin" train --config "$work/model.toml" \
    --set "parallel.cp=$1" --set 'parallel.strategy="ddp"' --set run.threads=1 \
    --set run.trace=true --set "data.seq_len=$2" --set "run.dir=\"$dir\"" >"$dir.log" 2>&1 ||
    { echo "run cp $1 at $2 failed:" >&2; tail -5 "$dir.log" >&2; return 1; }
  python3 - "$dir" <<'PY'
import glob, json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1] + "/metrics.jsonl")]
last = max(r["step"] for r in rows)
peak = max(r["mem"]["peak_rss"] for r in rows if r["step"] == last)
steps = sorted({r["step"] for r in rows if r["step"] > 1})
step = statistics.median(max(r["step_time_s"] for r in rows if r["step"] == s) for s in steps)
busy = waited = 0.0
for path in glob.glob(sys.argv[1] + "/trace/rank_*.json"):
    events = json.load(open(path))
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("name") != "ring hop":
            continue
        if e.get("cat") == "comm":
            busy += e["dur"]
        elif e.get("cat") == "wait":
            waited += e["dur"]
hidden = f"{1 - waited / busy:.0%}" if busy else "-"
print(peak, step, hidden)
PY
}

mkdir -p "$work/runs"
if [ -z "${CP_ONLY:-}" ]; then
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
fi

echo
echo "context parallelism at seq_len $cp_length:"
echo "| cp | peak RSS per rank MiB | over 1024 tokens | against cp = 1 | s/step | ring communication hidden |"
echo "|---|---|---|---|---|---|"
for cp in "${cp_sizes[@]}"; do
  read -r base _ _ < <(cp_run "$cp" 1024)
  read -r peak step hidden < <(cp_run "$cp" "$cp_length")
  added=$((peak - base))
  [ -n "${cp1_added:-}" ] || cp1_added="$added"
  python3 -c "import sys; c,p,a,a1,s,h=sys.argv[1:]; print(f'| {c} | {int(p)/2**20:,.0f} | {int(a)/2**20:,.0f} | {int(a)/int(a1):.2f} | {float(s):.2f} | {h} |')" "$cp" "$peak" "$added" "$cp1_added" "$step" "$hidden"
done
