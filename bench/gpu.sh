#!/usr/bin/env bash
# The GPU machine's measurements in one command (docs/gpu.md), from the repository root, after
# `bash scripts/gpu_build.sh` (built first with --no-test when build-gpu/shardtrain is missing):
#
#   (a) shardtrain's trainer on the GPU (run.device = "cuda"), GPT-2 124M (preset gpt2-124m) at
#       sequence 1024, one process, bf16 autocast with fp32 parameters (precision.autocast =
#       "bf16"), at each batch of GPU_BATCHES: the median step_time_s of metrics.jsonl (the
#       step's kernels synchronized before its end time).
#   (b) bench/gpu_torch.py: PyTorch eager, bf16 autocast, the same model, at the same batches:
#       step time, tokens/s and MFU against the dense bf16 peak.
#   (c) `shardtrain bench adam` over 124M parameters on every core (the optimizer a CPU offload
#       of a 124M model would run).
#
# Environment: OUT (results go there; default build-gpu/bench), BUILD_DIR (default build-gpu),
# STEPS (steps of each shardtrain run, default 10; the median of steps 3.. is reported),
# GPU_BATCHES (default "4 16").
# Writes gpu_bench.md (the table) and gpu_bench.log (every program's output) as it goes, so a
# run stopped at a time limit still returns what was measured.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build_dir="${BUILD_DIR:-build-gpu}"
out="${OUT:-$build_dir/bench}"
steps="${STEPS:-10}"
gpu_batches="${GPU_BATCHES:-4 16}"
mkdir -p "$out"
table="$out/gpu_bench.md"
log="$out/gpu_bench.log"
: >"$log"

if [ ! -x "$build_dir/shardtrain" ]; then
  BUILD_DIR="$build_dir" bash scripts/gpu_build.sh --no-test
fi
bin="$build_dir/shardtrain"
# The Debian libraries of .deps/gpu (toml++, yaml-cpp, ...) for the loader.
export LD_LIBRARY_PATH="$root/.deps/gpu/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
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

# ---- (a) the trainer, on the GPU -----------------------------------------------------------------
python3 bench/corpus.py "$work/corpus.txt"
for batch in $gpu_batches; do
  cat >"$work/gpt2.toml" <<TOML
[model]
preset = "gpt2-124m"
vocab_size = 50257  # GPT-2's; the byte tokenizer of the corpus alone would shrink it to 257
[data]
corpus = "$work/corpus.txt"
seq_len = 1024
eval_sequences = 0
[train]
steps = $steps
micro_batch = $batch
lr = 6e-4
min_lr = 6e-5
warmup = 0
weight_decay = 0.1
clip = 1.0
sample_tokens = 0
final_checkpoint = false
[precision]
autocast = "bf16"
[run]
dir = "$work/run$batch"
log_every = 1
device = "cuda"
TOML
  echo "== (a) $bin train --config gpt2.toml (CUDA, bf16 autocast, $batch x 1024)" | tee -a "$log"
  if "$bin" train --config "$work/gpt2.toml" >>"$log" 2>&1; then
    python3 - "$work/run$batch/metrics.jsonl" "$work/run$batch/run.json" "$batch" >>"$table" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip() and '"step_time_s"' in l]
timed = [l for l in lines if l["step"] >= 3] or lines
step = statistics.median(l["step_time_s"] for l in timed)
batch = int(sys.argv[3])
# bench/gpu_torch.py's FLOPs: 6 N + 12 L T d, N without the position embedding (1024 x 768).
n = json.load(open(sys.argv[2]))["model"]["num_parameters"] - 1024 * 768
flops = (6 * n + 12 * 12 * 1024 * 768) * batch * 1024 / step
print(f"| shardtrain train, run.device = \"cuda\" | GPU | bf16 autocast | {batch} | {step:.4f} | "
      f"{batch * 1024 / step:,.0f} | {100 * flops / 989e12:.1f}% of 989 TFLOP/s |")
PY
  else
    echo "| shardtrain train, run.device = \"cuda\" | GPU | bf16 autocast | $batch | failed: see gpu_bench.log | | |" >>"$table"
  fi
done

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
  echo "the position embedding), L = 12, T = 1024, d = 768 (bench/gpu_torch.py). shardtrain's rows are"
  echo "the trainer's own step_time_s (metrics.jsonl), the median of steps 3 to $steps."
} >>"$table"
cat "$table"
