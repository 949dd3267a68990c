#!/usr/bin/env bash
# bf16 on a CPU without a fast bf16 GEMM (no AVX-512: LibTorch 1.13 runs scalar loops that also
# accumulate in bf16), side by side in one run: fp32; bf16 autocast with shardtrain's products
# (fp32 GEMMs of the bf16 operands, rounded once: shardtrain/threads.h); bf16 autocast with
# LibTorch's own kernels (SHARDTRAIN_CPU_BF16_GEMM=libtorch). One process, one thread, STEPS
# steps of each TOML; per variant the median over ROUNDS rounds (orders alternating) of the
# median step time after the first step, and the last step's loss.
#   tiny: configs/zero_tiny.toml (the config corpus's TOML), micro-batch 16, accumulation 4;
#   demo: configs/demo.toml's model (GPT-2's 50,257-token vocabulary), micro-batch 8.
# Usage: bash bench/cpu_bf16.sh [ROUNDS] [STEPS]  (from the repository root, after a build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/shardtrain"
rounds="${1:-3}"
steps="${2:-6}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(--set "train.steps=$steps" --set train.sample_tokens=0 --set train.final_checkpoint=false
  --set train.eval_every=0 --set run.log_every=1000 --set run.threads=1 --set run.overwrite=true)

run() {  # case variant: appends "step_seconds last_loss" to $work/case_variant.rows
  local case="$1" variant="$2" dir="$work/runs/$1_$2" autocast=bf16 kernels=shardtrain
  [ "$variant" = fp32 ] && autocast=none
  [ "$variant" = bf16_libtorch ] && kernels=libtorch
  local toml=(--config "$root/configs/zero_tiny.toml" --set train.micro_batch=16
    --set train.grad_accum=4)
  [ "$case" = demo ] && toml=(--config "$root/configs/demo.toml" --set train.micro_batch=8)
  SHARDTRAIN_CPU_BF16_GEMM="$kernels" "$bin" train "${toml[@]}" "${common[@]}" \
    --set "precision.autocast=\"$autocast\"" --set "run.dir=\"$dir\"" >"$dir.log" 2>&1 ||
    { echo "run $case $variant failed:"; tail -5 "$dir.log"; exit 1; }
  python3 - "$dir/metrics.jsonl" >>"$work/${case}_$variant.rows" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if '"loss"' in line]
times = [r["step_time_s"] for r in rows[1:]] or [rows[-1]["step_time_s"]]
print(statistics.median(times), rows[-1]["loss"])
PY
}

mkdir -p "$work/runs"
variants=(fp32 bf16_shardtrain bf16_libtorch)
for round in $(seq 1 "$rounds"); do
  for case in tiny demo; do
    order=("${variants[@]}")
    [ $((round % 2)) -eq 0 ] && order=(bf16_libtorch bf16_shardtrain fp32)
    for variant in "${order[@]}"; do run "$case" "$variant"; done
  done
done

echo "| case | fp32 s/step | bf16, shardtrain's products | bf16, LibTorch's kernels | LibTorch's / shardtrain's | last loss: fp32 / shardtrain's / LibTorch's |"
echo "|---|---:|---:|---:|---:|---|"
for case in tiny demo; do
  python3 - "$work/$case" "$case" <<'PY'
import statistics, sys
prefix, case = sys.argv[1:]
rows = {v: [tuple(map(float, l.split())) for l in open(f"{prefix}_{v}.rows")]
        for v in ("fp32", "bf16_shardtrain", "bf16_libtorch")}
t = {v: statistics.median(r[0] for r in rs) for v, rs in rows.items()}
loss = {v: rs[-1][1] for v, rs in rows.items()}
print(f"| {case} | {t['fp32']:.3f} | {t['bf16_shardtrain']:.3f} | {t['bf16_libtorch']:.3f} | "
      f"{t['bf16_libtorch'] / t['bf16_shardtrain']:.1f}x | {loss['fp32']:.4f} / "
      f"{loss['bf16_shardtrain']:.4f} / {loss['bf16_libtorch']:.4f} |")
PY
done
