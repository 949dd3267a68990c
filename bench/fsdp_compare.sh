#!/usr/bin/env bash
# Side by side at RANKS ranks on the same model and global batch: DDP, FSDP full_shard,
# shard_grad_op and no_shard, ZeRO stages 1, 2 and 3, ZeRO-2 with the optimizer offloaded to
# host memory and to files (nvme), and ZeRO-3 with optimizer and parameters offloaded to host
# memory and to files, each launched by shardtrain on configs/demo.toml's model (GPT-2
# BPE on Debian's fortunes), STEPS steps, alternating the strategies ROUNDS times. Prints each
# run's median step time (first 2 steps dropped as warm-up), its ratio to DDP's in the same
# round, and per rank: model-state bytes (params + grads + optimizer state, as metrics.jsonl
# reports them), the gathered-parameter peak, and the process's peak RSS.
# Usage: bench/fsdp_compare.sh [RANKS] [ROUNDS] [STEPS] [extra --set flags for every run]
# STRATEGIES="ddp zero3_cpu zero3_nvme" bench/fsdp_compare.sh ... runs a subset (ddp is needed
# for the ratios).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ranks="${1:-4}"
rounds="${2:-3}"
steps="${3:-12}"
shift $(( $# > 3 ? 3 : $# ))
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
micro=$(( 8 / ranks ))
for round in $(seq "$rounds"); do
  for strategy in ${STRATEGIES:-ddp full_shard shard_grad_op no_shard zero1 zero2 zero3 zero2_cpu \
                   zero2_nvme zero3_cpu zero3_nvme}; do
    case "$strategy" in
      ddp) flags=(--set parallel.strategy=ddp) ;;
      zero?) flags=(--set parallel.strategy=zero --set "parallel.zero.stage=${strategy#zero}") ;;
      zero2_*) flags=(--set parallel.strategy=zero --set parallel.zero.stage=2
                      --set "parallel.zero.offload_optimizer=${strategy#zero2_}"
                      --set "parallel.zero.nvme_path=$out") ;;
      zero3_*) flags=(--set parallel.strategy=zero --set parallel.zero.stage=3
                      --set "parallel.zero.offload_optimizer=${strategy#zero3_}"
                      --set "parallel.zero.offload_param=${strategy#zero3_}"
                      --set "parallel.zero.nvme_path=$out") ;;
      *) flags=(--set parallel.strategy=fsdp --set "parallel.fsdp.sharding=$strategy") ;;
    esac
    dir="$out/$strategy-$round"
    "$root/build/shardtrain" launch --nproc "$ranks" -- "$root/build/shardtrain" train \
      --config "$root/configs/demo.toml" --set "train.steps=$steps" --set train.eval_every=0 \
      --set train.sample_tokens=0 --set train.checkpoint_every=0 \
      --set "train.micro_batch=$micro" --set "run.dir=$dir" --set run.log_every=1000 \
      "${flags[@]}" "$@" >/dev/null
    # The corpus cache is reused; the checkpoints are not needed.
    rm -rf "$dir/checkpoints"
    echo "$strategy $round $dir/metrics.jsonl"
  done
done | python3 -c '
import json, statistics, sys
rows = [line.split() for line in sys.stdin]
runs = {}
for strategy, rnd, path in rows:
    lines = [json.loads(l) for l in open(path)]
    steps = sorted({l["step"] for l in lines})[2:]
    times = [statistics.median(l["step_time_s"] for l in lines if l["step"] == s) for s in steps]
    mem = [l["mem"] for l in lines if l["rank"] == 0][-1]
    runs.setdefault(strategy, []).append((rnd, statistics.median(times), mem))
ddp = {rnd: t for rnd, t, _ in runs["ddp"]}
print("| strategy | median step (s) | ratio to DDP (median of rounds) | model state / rank (MiB) | parameter shards on file (MiB) | gathered peak (MiB) | peak RSS rank 0 (MiB) |")
print("|---|---|---|---|---|---|---|")
for strategy, items in runs.items():
    t = statistics.median(x[1] for x in items)
    ratio = statistics.median(x[1] / ddp[x[0]] for x in items)
    mem = items[-1][2]
    state = (mem["params"] + mem["grads"] + mem["optim"]) / 2**20
    gathered = mem.get("gathered_peak", 0) / 2**20
    on_file = mem.get("params_on_file", 0) / 2**20
    rss = mem["peak_rss"] / 2**20
    print(f"| {strategy} | {t:.3f} | {ratio:.3f} | {state:.1f} | {on_file:.1f} | {gathered:.1f} | {rss:.0f} |")
'
