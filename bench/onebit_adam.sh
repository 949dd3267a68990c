#!/usr/bin/env bash
# 1-bit Adam against AdamW under DDP, side by side, on 2 ranks for STEPS steps, 1-bit Adam with
# train.freeze_step = STEPS/2 (that many warmup steps, then the momentum compressed), both
# without bias correction, two models:
#   gpt2_vocab: configs/demo.toml's (GPT-2's vocabulary, about 7.2M parameters, 6.4M of them the
#               embedding, whose rows for tokens rare in the corpus get tiny gradients);
#   byte_vocab: the same blocks widened to d_model 256 over the byte vocabulary (257 tokens,
#               about 3.3M parameters). Per run: the bytes the loopback interface carried
# (/proc/net/dev "lo" transmit counter, both ranks' Gloo traffic, measured outside shardtrain),
# the median step time of the steps after the warmup (the slowest rank's step_time_s), the
# per-step comm_bytes shardtrain counts after the warmup, and the last loss. ROUNDS rounds, the
# order alternating; medians reported.
# Usage: bash bench/onebit_adam.sh [ROUNDS] [STEPS]  (from the repository root, after a build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/shardtrain"
rounds="${1:-3}"
steps="${2:-20}"
freeze=$((steps / 2))
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(--set "train.steps=$steps" --set train.sample_tokens=0 --set train.final_checkpoint=false
  --set train.eval_every=0 --set run.log_every=1000 --set run.threads=1 --set run.overwrite=true
  --set train.warmup=0 --set 'train.schedule="constant"' --set train.bias_correction=false)
lo_tx() { awk '$1 == "lo:" { print $10 }' /proc/net/dev; }

run() {  # case variant: appends "lo_bytes step_seconds comm_bytes last_loss" to $work/case_variant.rows
  local case="$1" variant="$2" dir="$work/runs/$1_$2"
  local extra=()
  [ "$case" = byte_vocab ] && extra=(--set 'data.tokenizer="byte"' --set model.vocab_size=257
    --set model.d_model=256 --set model.ffn_hidden=1024)
  [ "$variant" = onebit_adam ] &&
    extra+=(--set 'train.optimizer="onebit_adam"' --set "train.freeze_step=$freeze")
  mkdir -p "$work/runs"
  local before after
  before="$(lo_tx)"
  "$bin" launch --nproc 2 -- "$bin" train --config "$root/configs/demo.toml" "${common[@]}" \
    "${extra[@]}" --set "run.dir=\"$dir\"" >"$dir.log" 2>&1 ||
    { echo "run $case $variant failed:"; tail -5 "$dir.log"; exit 1; }
  after="$(lo_tx)"
  python3 - "$dir/metrics.jsonl" "$((after - before))" "$freeze" >>"$work/${case}_$variant.rows" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if '"step"' in line]
late = [r for r in rows if r["step"] > int(sys.argv[3])]
times = {}
for r in late:
    times[r["step"]] = max(times.get(r["step"], 0), r["step_time_s"])
comm = statistics.median(r["comm"]["bytes"] for r in late if r.get("rank", 0) == 0)
last = max(r["step"] for r in rows)
loss = [r["loss"] for r in rows if r["step"] == last][0]
print(sys.argv[2], statistics.median(times.values()), comm, loss)
PY
}

for round in $(seq 1 "$rounds"); do
  if (( round % 2 )); then order=(adamw onebit_adam); else order=(onebit_adam adamw); fi
  for case in ${CASES:-gpt2_vocab byte_vocab}; do
    for variant in "${order[@]}"; do run "$case" "$variant"; done
  done
done
python3 - "$work" ${CASES:-gpt2_vocab byte_vocab} <<'PY'
import statistics, sys
for case in sys.argv[2:]:
    med = {}
    for variant in ("adamw", "onebit_adam"):
        rows = [list(map(float, l.split())) for l in open(f"{sys.argv[1]}/{case}_{variant}.rows")]
        med[variant] = [statistics.median(c) for c in zip(*rows)]
        lo, t, comm, loss = med[variant]
        print(f"{case:10s} {variant:12s} loopback {lo / 2**20:8.1f} MiB  step after warmup "
              f"{t:.3f} s  comm_bytes/step {comm / 2**20:7.2f} MiB  last loss {loss:.4f}")
    a, o = med["adamw"], med["onebit_adam"]
    print(f"{case:10s} onebit/adamw: loopback {o[0] / a[0]:.3f}x, step time {o[1] / a[1]:.3f}x, "
          f"comm_bytes/step {o[2] / a[2]:.3f}x")
PY
