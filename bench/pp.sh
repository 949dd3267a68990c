#!/usr/bin/env bash
# Pipeline parallelism: each schedule at pp = 2 and 4 with m = 4, 8 and 16 micro-batches, on a
# GPT-2 shape of 8 blocks (d_model 256, 4 heads, FFN 1024, vocabulary 2048 from the byte
# tokenizer's 257, sequences of 128, fp32, one thread per rank, micro-batches of 2 sequences),
# against DDP at the same rank count and global batch (m x 2 sequences).
# From metrics.jsonl, per step after the first, medians over steps:
# - bubble: 1 - (time every rank spent in its forwards and backwards) / (ranks x the longest
#   rank's span from its first action's start to its last action's end), against the formula
#   (P-1)/(m+P-1) (divided by V = 2 for interleaved 1F1B) and the schedule run with unit costs;
# - activations: the largest mem.activations_peak of the first stage's rank (what forward and
#   backward added above parameters and optimizer state: the micro-batches it holds), and the
#   last stage's; the allocator's counter;
# - peak RSS of the largest rank; step time of rank 0, and DDP's at the same rank count.
# Then pp = 2 x dp = 2 with each data-parallel strategy (ddp, zero stage 1, fsdp full_shard) on
# a wider model (d_model 512, 8 heads, FFN 2048), 1F1B with 4 micro-batches: peak RSS of the
# largest and smallest rank and rank 0's step time, medians as above.
# Usage: bash bench/pp.sh [STEPS] [schedules|data-parallel|all]   (from the repository root,
# after a build; default all)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
steps="${1:-5}"
part="${2:-all}"
bin="$root/build/shardtrain"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$root/bench/corpus.py" "$work/corpus.txt"
cat >"$work/base.toml" <<TOML
[model]
preset = "tiny"
vocab_size = 2048
context_length = 128
d_model = 256
n_layers = 8
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
[run]
log_every = 1000
threads = 1
memory_check = false
TOML

run() {  # name ranks flags... ; leaves $work/name/metrics.jsonl
  local name="$1" ranks="$2"
  shift 2
  "$bin" launch --nproc "$ranks" -- "$bin" train --config "$work/base.toml" \
    --set "run.dir=$work/$name" "$@" >"$work/$name.log" 2>&1 ||
    { echo "run $name failed:"; tail -5 "$work/$name.log"; exit 1; }
}

if [ "$part" != data-parallel ]; then
echo "| schedule | pp | m | bubble measured | formula | unit-cost schedule | first stage activations MiB | last stage activations MiB | peak RSS MiB | step s | DDP step s | step / DDP |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for pp in 2 4; do
  for m in 4 8 16; do
    run "ddp_${pp}_$m" "$pp" --set parallel.strategy=ddp --set "train.grad_accum=$((m / pp))" \
      --set train.micro_batch=2
    for schedule in gpipe 1f1b interleaved_1f1b zero_bubble; do
      v=1
      [ "$schedule" = interleaved_1f1b ] && v=2
      name="${schedule}_${pp}_$m"
      run "$name" "$pp" --set "parallel.pp=$pp" --set "parallel.pp_schedule=$schedule" \
        --set "parallel.pp_virtual_stages=$v" --set "train.grad_accum=$m"
      python3 - "$work/$name/metrics.jsonl" "$work/ddp_${pp}_$m/metrics.jsonl" "$schedule" \
        "$pp" "$m" "$v" "$steps" "$bin" <<'PY'
import json, statistics, subprocess, sys
path, ddp_path, schedule, pp, m, v, steps, binary = sys.argv[1:]
pp, m, v, steps = int(pp), int(m), int(v), int(steps)
lines = [json.loads(l) for l in open(path)]
ddp = [json.loads(l) for l in open(ddp_path)]
def per_step(step):
    rows = [l for l in lines if l["step"] == step]
    busy = sum(l["pipeline"]["busy_s"] for l in rows)
    span = max(l["pipeline"]["span_s"] for l in rows)
    return 1 - busy / (len(rows) * span)
later = range(2, steps + 1)
bubble = statistics.median(per_step(s) for s in later)
formula = (pp - 1) / (m + pp - 1) / (v if schedule == "interleaved_1f1b" else 1)
printed = subprocess.run([binary, "bench", "pipeline", "--schedule", schedule, "--pp", str(pp),
                          "--virtual-stages", str(v), "--microbatches", str(m)],
                         capture_output=True, text=True, check=True).stdout
unit = float(printed.split("bubble with unit costs ")[1].split(",")[0])
mib = lambda b: b / 2**20
stage = lambda r: max(l["mem"]["activations_peak"] for l in lines if l["rank"] == r and l["step"] >= 2)
rss = max(l["mem"]["peak_rss"] for l in lines)
step = statistics.median(l["step_time_s"] for l in lines if l["rank"] == 0 and l["step"] >= 2)
ddp_step = statistics.median(l["step_time_s"] for l in ddp if l["rank"] == 0 and l["step"] >= 2)
print(f"| {schedule} | {pp} | {m} | {bubble:.3f} | {formula:.3f} | {unit:.3f} | {mib(stage(0)):.1f} | "
      f"{mib(stage(pp - 1)):.1f} | {mib(rss):.0f} | {step:.3f} | {ddp_step:.3f} | {step / ddp_step:.2f} |")
PY
    done
  done
done
fi

if [ "$part" != schedules ]; then
  echo
  echo "| pp x dp | strategy | peak RSS MiB, largest rank | smallest rank | step s | step / ddp |"
  echo "|---|---|---|---|---|---|"
  wide=(--set model.d_model=512 --set model.n_heads=8 --set model.n_kv_heads=8
        --set model.ffn_hidden=2048 --set parallel.pp=2 --set train.grad_accum=4)
  run dp_ddp 4 "${wide[@]}" --set parallel.strategy=ddp
  run dp_zero1 4 "${wide[@]}" --set parallel.strategy=zero --set parallel.zero.stage=1
  run dp_fsdp 4 "${wide[@]}" --set parallel.strategy=fsdp
  for name in ddp zero1 fsdp; do
    python3 - "$work/dp_$name/metrics.jsonl" "$work/dp_ddp/metrics.jsonl" "$name" <<'PY'
import json, statistics, sys
path, ddp_path, name = sys.argv[1:]
lines = [json.loads(l) for l in open(path)]
ddp = [json.loads(l) for l in open(ddp_path)]
mib = lambda b: b / 2**20
final = max(l["step"] for l in lines)
rss = [l["mem"]["peak_rss"] for l in lines if l["step"] == final]
step = lambda rows: statistics.median(l["step_time_s"] for l in rows if l["rank"] == 0 and l["step"] >= 2)
print(f"| 2 x 2 | {name} | {mib(max(rss)):.0f} | {mib(min(rss)):.0f} | {step(lines):.3f} | "
      f"{step(lines) / step(ddp):.2f} |")
PY
  done
fi
