#!/usr/bin/env bash
# A small mixture-of-experts model against the dense model of the same active size, and
# all-to-all against all-reduce, on this machine.
#  1. Training: the Llama family, d_model 256, 4 layers, 8 experts of width 512 with 2 per token
#     (MoE), against the same model with one SwiGLU of width 1024 (dense: the same FLOPs per
#     token, a quarter of the MLP parameters); seq_len 512, 8 sequences per step, fp32, on the
#     fortune files tokenized by bytes; one rank, then 2 and 4 ranks under FSDP (`shardtrain
#     launch`, one thread per rank). Per run: the median step time over the steps after the
#     first, and the peak RSS per rank (the largest rank's mem.peak_rss at the last step).
#     Then expert parallelism: the MoE model at 2 and 4 ranks under FSDP with ep = 1 (every rank
#     shards every expert) and ep = ranks (each rank holds 8 / ranks experts whole, tokens sent
#     to them by all-to-all), and under DDP with ep = ranks.
#  2. The share of a forward pass the MoE layers spend routing, gathering rows and sending them
#     to their experts' ranks ("moe dispatch"), in the experts ("moe experts") and sending the
#     outputs back and adding them ("moe combine"), from the trace of steps 2-4, against the
#     "forward" spans: one rank, and 2 ranks at ep = 2 (where dispatch and combine hold the
#     all-to-alls).
#  3. `shardtrain bench collectives` for all_reduce and all_to_all at the same sizes on 2 and 4
#     ranks: busbw in nccl-tests' units (all-reduce 2(n-1)/n, all-to-all (n-1)/n).
# Usage: bash bench/moe.sh  (from the repository root, after a build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SHARDTRAIN_BIN:-$root/build/shardtrain}"
read -r -a worlds <<<"${WORLDS:-1 2 4}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
f=/usr/share/games/fortunes
"$bin" data prepare --corpus "$f/fortunes" "$f/wisdom" "$f/literature" "$f/humorists" \
  "$f/science" "$f/people" --tokenizer byte --out "$work/corpus.tokens" >/dev/null
cat >"$work/model.toml" <<TOML
[model]
preset = "tiny-moe"
context_length = 512
d_model = 256
n_layers = 4
n_heads = 4
n_kv_heads = 2
ffn_hidden = 512
n_experts = 8
experts_per_token = 2
[data]
corpus = ["$work/corpus.tokens"]
tokenizer = "byte"
seq_len = 512
eval_sequences = 0
[train]
steps = 6
micro_batch = 8
sample_tokens = 0
final_checkpoint = false
[run]
threads = 1
log_every = 1000
overwrite = true
TOML
dense=(--set 'model.preset="tiny-llama"' --set model.n_experts=0 --set model.experts_per_token=0
  --set model.ffn_hidden=1024)

run() {  # name world [--set ...]: prints "peak_bytes step_seconds" (FSDP unless a --set says)
  local name="$1" world="$2"
  shift 2
  local dir="$work/runs/$name"
  local strategy=()
  [ "$world" -gt 1 ] && strategy=(--set 'parallel.strategy="fsdp"'
    --set "train.micro_batch=$((8 / world))")
  "$bin" launch --nproc "$world" -- "$bin" train --config "$work/model.toml" \
    --set "run.dir=\"$dir\"" "${strategy[@]}" "$@" >"$dir.log" 2>&1 ||
    { echo "run $name failed:" >&2; tail -5 "$dir.log" >&2; return 1; }
  python3 - "$dir/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
last = max(r["step"] for r in rows)
peak = max(r["mem"]["peak_rss"] for r in rows if r["step"] == last)
steps = sorted({r["step"] for r in rows if r["step"] > 1})
print(peak, statistics.median(max(r["step_time_s"] for r in rows if r["step"] == s) for s in steps))
PY
}

mkdir -p "$work/runs"
echo "| ranks | MoE s/step | dense s/step | MoE / dense | MoE peak RSS per rank MiB | dense peak RSS per rank MiB |"
echo "|---|---|---|---|---|---|"
for world in "${worlds[@]}"; do
  read -r moe_peak moe_step < <(run "moe$world" "$world")
  read -r dense_peak dense_step < <(run "dense$world" "$world" "${dense[@]}")
  python3 -c "import sys; w,mp,ms,dp,ds=sys.argv[1:]; print(f'| {w} | {float(ms):.3f} | {float(ds):.3f} | {float(ms)/float(ds):.2f} | {int(mp)/2**20:,.0f} | {int(dp)/2**20:,.0f} |')" \
    "$world" "$moe_peak" "$moe_step" "$dense_peak" "$dense_step"
done

echo
echo "expert parallelism (the MoE model):"
echo "| ranks | strategy | ep | s/step | peak RSS per rank MiB |"
echo "|---|---|---|---|---|"
for world in "${worlds[@]}"; do
  [ "$world" -gt 1 ] || continue
  for setting in "fsdp 1" "fsdp $world" "ddp $world"; do
    read -r strategy ep <<<"$setting"
    read -r peak step < <(run "ep_${strategy}_${ep}_$world" "$world" \
      --set "parallel.strategy=\"$strategy\"" --set "parallel.ep=$ep")
    python3 -c "import sys; w,s,e,p,t=sys.argv[1:]; print(f'| {w} | {s} | {e} | {float(t):.3f} | {int(p)/2**20:,.0f} |')" \
      "$world" "$strategy" "$ep" "$peak" "$step"
  done
done

share() {  # traced run directory: the MoE phases against the forward spans, every rank
  python3 - "$1" <<'PY'
import glob, json, sys
total = {}
for path in glob.glob(sys.argv[1] + "/trace/rank_*.json"):
    events = json.load(open(path))
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    for e in events:
        if e.get("ph") == "X" and (e.get("cat") == "moe" or e.get("name") == "forward"):
            total[e["name"]] = total.get(e["name"], 0.0) + e["dur"]
forward = total.get("forward", 0.0)
print("| phase | ms over the traced steps | share of forward |")
print("|---|---|---|")
for name in ("moe dispatch", "moe experts", "moe combine"):
    print(f"| {name} | {total.get(name, 0.0) / 1e3:,.1f} | {total.get(name, 0.0) / forward:.1%} |")
print(f"| forward | {forward / 1e3:,.1f} | 100% |")
PY
}

echo
echo "share of the forward pass in the MoE layers (one rank, traced steps 2-4):"
run moe_traced 1 --set run.trace=true --set 'run.trace_steps=[2, 4]' >/dev/null
share "$work/runs/moe_traced"
echo
echo "the same at 2 ranks, FSDP, ep = 2 (both ranks' spans):"
run moe_traced_ep 2 --set run.trace=true --set 'run.trace_steps=[2, 4]' --set parallel.ep=2 \
  >/dev/null
share "$work/runs/moe_traced_ep"

echo
echo "all_to_all against all_reduce (busbw GB/s, nccl-tests' units):"
echo "| ranks | bytes | all_reduce busbw | all_to_all busbw | all_to_all / all_reduce |"
echo "|---|---|---|---|---|"
for world in 2 4; do
  out="$("$bin" launch --nproc "$world" -- "$bin" bench collectives --op all_reduce \
    --min-bytes 64K --max-bytes 16M --step-factor 4 --iters 20 --warmup 3 2>&1)
$("$bin" launch --nproc "$world" -- "$bin" bench collectives --op all_to_all \
    --min-bytes 64K --max-bytes 16M --step-factor 4 --iters 20 --warmup 3 2>&1)"
  python3 - "$world" <<PY
import sys
rows = {}
for line in """$out""".splitlines():
    parts = line.split()
    if len(parts) >= 8 and parts[2] in ("all_reduce", "all_to_all"):
        rows.setdefault(int(parts[3]), {})[parts[2]] = float(parts[7])
for size in sorted(rows):
    r = rows[size]
    if "all_reduce" in r and "all_to_all" in r:
        print(f"| {sys.argv[1]} | {size:,} | {r['all_reduce']:.3f} | {r['all_to_all']:.3f} | {r['all_to_all'] / r['all_reduce']:.2f} |")
PY
done
