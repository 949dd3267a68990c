#!/usr/bin/env bash
# The GPU machine's measurements in one command (docs/gpu.md), from the repository root, after
# `bash scripts/gpu_build.sh` (built first with --no-test when build-gpu/shardtrain is missing):
#
#   (a) shardtrain's trainer on GPT-2 124M (preset gpt2-124m) at sequence 1024, one rank.
#       The trainer cannot run on CUDA yet: there is no device key in include/shardtrain/config.h
#       and nothing in src/train moves the model or the batches to a GPU, so this is its CPU
#       step time on the GPU machine's cores (fp32, the trainer's default precision) -- the
#       baseline a CUDA trainer must beat, not a GPU number. `shardtrain bench collectives` is
#       not run either: it always makes a Gloo group (CPU tensors); the CLI cannot select NCCL.
#   (b) bench/gpu_torch.py: PyTorch eager, bf16 autocast, the same model, at (a)'s batch and at
#       larger ones: step time, tokens/s and MFU against the dense bf16 peak.
#   (c) `shardtrain bench adam` over 124M parameters on every core (the optimizer a CPU offload
#       of a 124M model would run).
#
# Environment: OUT (results go there; default build-gpu/bench), BUILD_DIR (default build-gpu),
# CPU_BATCH (sequences per step for (a), default 4), CPU_STEPS (default 4; the median of steps
# 2.. is reported), GPU_BATCHES (default "4 16": (a)'s batch and one that fills the GPU).
# Writes gpu_bench.md (the table) and gpu_bench.log (every program's output) as it goes, so a
# run stopped at a time limit still returns what was measured.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build_dir="${BUILD_DIR:-build-gpu}"
out="${OUT:-$build_dir/bench}"
cpu_batch="${CPU_BATCH:-4}"
cpu_steps="${CPU_STEPS:-4}"
gpu_batches="${GPU_BATCHES:-$cpu_batch 16}"
mkdir -p "$out"
table="$out/gpu_bench.md"
log="$out/gpu_bench.log"
: >"$log"

if [ ! -x "$build_dir/shardtrain" ]; then
  BUILD_DIR="$build_dir" bash scripts/gpu_build.sh --no-test
fi
bin="$build_dir/shardtrain"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

{
  echo "# GPU machine measurements ($(date -u +%Y-%m-%d))"
  echo
  echo "Machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi'), $(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 2^20 }' /proc/meminfo);" \
    "PyTorch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?');" \
    "$(grep -m 1 -o 'shardtrain: LibTorch.*' "$build_dir/gpu_summary.txt" 2>/dev/null || echo 'shardtrain: build summary missing')"
  echo
  echo "GPT-2 124M (vocabulary 50257, 12 x 768, tied embeddings), sequence 1024."
  echo
  echo "| what | device | precision | batch | median step (s) | tokens/s | MFU |"
  echo "|---|---|---|---|---|---|---|"
} >"$table"

# ---- (a) the trainer, on the CPU ---------------------------------------------------------------
python3 bench/corpus.py "$work/corpus.txt"
cat >"$work/gpt2.toml" <<TOML
[model]
preset = "gpt2-124m"
vocab_size = 50257  # GPT-2's; the byte tokenizer of the corpus alone would shrink it to 257
[data]
corpus = "$work/corpus.txt"
seq_len = 1024
eval_sequences = 0
[train]
steps = $cpu_steps
micro_batch = $cpu_batch
lr = 6e-4
min_lr = 6e-5
warmup = 0
weight_decay = 0.1
clip = 1.0
sample_tokens = 0
final_checkpoint = false
[run]
dir = "$work/run"
log_every = 1
threads = $(nproc)
TOML
echo "== (a) $bin train --config gpt2.toml (CPU, $cpu_batch x 1024)" | tee -a "$log"
if "$bin" train --config "$work/gpt2.toml" >>"$log" 2>&1; then
  python3 - "$work/run/metrics.jsonl" "$cpu_batch" >>"$table" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
timed = [l for l in lines if l.get("rank", 0) == 0 and l["step"] >= 2] or lines
step = statistics.median(l["step_time_s"] for l in timed)
print(f"| shardtrain train (the trainer has no CUDA path) | CPU | fp32 | {sys.argv[2]} | "
      f"{step:.3f} | {int(sys.argv[2]) * 1024 / step:,.0f} | - |")
PY
else
  echo "| shardtrain train | CPU | fp32 | $cpu_batch | failed: see gpu_bench.log | | |" >>"$table"
fi

# ---- (b) PyTorch eager on the GPU --------------------------------------------------------------
torch_row='
import json, sys
r = json.loads(sys.stdin.read())
print("| PyTorch %s eager (bench/gpu_torch.py) | %s | bf16 autocast | %d | %.4f | %s | %.1f%% of %.0f"
      " TFLOP/s (%.1f%% of a measured %.0f) |" % (r["torch"], r["device"], r["batch"],
      r["median_step_s"], format(round(r["tokens_per_s"]), ","), 100 * r["mfu"], r["peak_tflops"],
      100 * r["mfu_of_matmul"], r["matmul_tflops"]))'
for batch in $gpu_batches; do
  echo "== (b) python3 bench/gpu_torch.py --batch $batch" | tee -a "$log"
  if PYTHONUNBUFFERED=1 python3 bench/gpu_torch.py --batch "$batch" >"$work/torch.out" 2>&1; then
    cat "$work/torch.out" >>"$log"
    grep '^{' "$work/torch.out" | python3 -c "$torch_row" >>"$table"
  else
    cat "$work/torch.out" >>"$log"
    echo "| PyTorch eager | GPU | bf16 autocast | $batch | failed: see gpu_bench.log | | |" >>"$table"
  fi
done

# ---- (c) the CPU AdamW -------------------------------------------------------------------------
echo "== (c) $bin bench adam --params 124M --threads $(nproc)" | tee -a "$log"
{
  echo
  echo "\`shardtrain bench adam --params 124M --threads $(nproc) --nvme-dir \"\"\`:"
  echo
  echo '```'
  "$bin" bench adam --params 124M --threads "$(nproc)" --nvme-dir "" 2>&1 | tee -a "$log" ||
    echo "bench adam failed"
  echo '```'
  echo
  echo "MFU = (6 N + 12 L T d) x tokens/s / peak, N = 123.7M parameters in matrix products (all but"
  echo "the position embedding), L = 12, T = 1024, d = 768 (bench/gpu_torch.py). The CPU row is the"
  echo "trainer's own step_time_s (metrics.jsonl), the median of steps 2 to $cpu_steps."
} >>"$table"
cat "$table"
