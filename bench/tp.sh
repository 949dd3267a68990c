#!/usr/bin/env bash
# Tensor parallelism at 1, 2 and 4 ranks per group against DDP at the same rank count, on a
# GPT-2 shape big enough for the split to show (d_model 512, 4 blocks, 8 heads, FFN 2048,
# vocabulary 8192 padded from the byte tokenizer's 257, sequences of 256, fp32, one thread per
# rank). Every run has the same global batch (8 sequences).
# Per rank, from metrics.jsonl of the last step: mem.params (bytes of the parameters this rank
# holds), mem.activations_peak (what forward and backward added above parameters and optimizer
# state at their peak: activations, gradients, temporaries; the allocator's counter), peak RSS,
# and comm.tp_seconds (time in tensor-parallel collectives, all exposed). Step time is the
# median of steps 2..STEPS of rank 0.
# Usage: bash bench/tp.sh [STEPS]   (from the repository root, after a build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
steps="${1:-6}"
bin="$root/build/shardtrain"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$root/bench/corpus.py" "$work/corpus.txt"
cat >"$work/base.toml" <<TOML
[model]
preset = "tiny"
vocab_size = 8192
context_length = 256
d_model = 512
n_layers = 4
n_heads = 8
n_kv_heads = 8
ffn_hidden = 2048
[data]
corpus = "$work/corpus.txt"
seq_len = 256
eval_sequences = 8
[train]
steps = $steps
lr = 1e-4
sample_tokens = 0
[run]
log_every = 1000
threads = 1
memory_check = false
TOML

row() {  # name ranks tp extra-flags...
  local name="$1" ranks="$2" tp="$3"
  shift 3
  local dp=$((ranks / tp)) dir="$work/$name"
  "$bin" launch --nproc "$ranks" -- "$bin" train --config "$work/base.toml" \
    --set "parallel.tp=$tp" --set "train.micro_batch=$((8 / dp))" --set "run.dir=$dir" "$@" \
    >"$dir.log" 2>&1 || { echo "run $name failed:"; tail -5 "$dir.log"; exit 1; }
  python3 - "$dir/metrics.jsonl" "$name" "$ranks" "$tp" "$steps" <<'PY'
import json, statistics, sys
path, name, ranks, tp, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
lines = [json.loads(l) for l in open(path)]
last = {l["rank"]: l for l in lines if l["step"] == steps}
r0 = last[0]
times = [l["step_time_s"] for l in lines if l["rank"] == 0 and l["step"] >= 2]
mib = lambda b: b / 2**20
# The formula: blocks' matrices and the vocabulary split by tp; norms, biases of row-parallel
# layers and the position embedding whole on every rank.
d, L, f, V, T = 512, 4, 2048, 8192, 256
split = L * (4 * d * d + 3 * d + 2 * d * f + f) + V * d
whole = L * 6 * d + 2 * d + T * d
formula = (split / tp + whole) * 4
# Korthikanti et al. 2022, bytes per layer with 2-byte activations, doubled for fp32:
# sbh(10 + 24/t + 5as/(ht)) with tensor parallelism t, sbh(34 + 5as/h)/t with sequence
# parallelism too. Counts the blocks' saved activations only (no logits, no gradients).
sp = name.endswith("_sp")
a, b = 8, 8 // (ranks // tp)
per = (34 + 5 * a * T / d) / tp if sp else 10 + 24 / tp + 5 * a * T / (d * tp)
act_formula = L * T * b * d * per * 2
tp_s = statistics.median([l.get("comm", {}).get("tp_seconds", 0.0) for l in lines if l["rank"] == 0 and l["step"] >= 2])
print(f"| {name} | {ranks} | {tp} | {mib(r0['mem']['params']):.1f} | {mib(formula):.1f} | "
      f"{mib(max(l['mem']['activations_peak'] for l in last.values())):.1f} | {mib(act_formula):.1f} | "
      f"{mib(max(l['mem']['peak_rss'] for l in last.values())):.0f} | "
      f"{statistics.median(times):.3f} | {tp_s:.3f} |")
PY
}

echo "| run | ranks | tp | params per rank (MiB) | formula (MiB) | activations peak, largest rank (MiB) | blocks' activations, formula (MiB) | peak RSS, largest rank (MiB) | median step (s) | median TP collectives (s) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
row "none" 1 1 --set parallel.strategy=none
row "ddp2" 2 1 --set parallel.strategy=ddp
row "tp2" 2 2 --set parallel.strategy=none
row "tp2_sp" 2 2 --set parallel.strategy=none --set parallel.sequence_parallel=true
row "ddp4" 4 1 --set parallel.strategy=ddp
row "tp2_ddp2" 4 2 --set parallel.strategy=ddp
row "tp4" 4 4 --set parallel.strategy=none
row "tp4_sp" 4 4 --set parallel.strategy=none --set parallel.sequence_parallel=true
