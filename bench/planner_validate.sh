#!/usr/bin/env bash
# Trains the tiny and the small model for a few steps on 1 process, and on 2 ranks with DDP,
# FSDP full_shard and shard_grad_op and ZeRO stages 1, 2 and 3, then compares each run with the
# planner's estimate (`shardtrain plan --validate`).
# Usage: bash bench/planner_validate.sh [steps]   (from the repository root, after a build)
set -euo pipefail
steps="${1:-30}"
bin="build/shardtrain"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
corpus='["/usr/share/games/fortunes/fortunes", "/usr/share/games/fortunes/wisdom"]'

# model name -> [model] lines. "small" has the demo's shapes and GPT-2's vocabulary size (7.2M
# parameters) over the byte tokenizer, so it needs no tokenizer files.
model_lines() {
  case "$1" in
    tiny) printf 'preset = "tiny"\n' ;;
    small) printf 'preset = "tiny"\nvocab_size = 50257\ncontext_length = 128\nd_model = 128\nn_layers = 4\nn_heads = 4\nffn_hidden = 512\n' ;;
  esac
}

# label -> [parallel] lines
parallel_lines() {
  case "$1" in
    none|ddp) printf 'strategy = "%s"\n' "$1" ;;
    full_shard|shard_grad_op) printf 'strategy = "fsdp"\nfsdp.sharding = "%s"\n' "$1" ;;
    zero*) printf 'strategy = "zero"\nzero.stage = %s\n' "${1#zero}" ;;
  esac
}

for model in tiny small; do
  for strategy in none ddp full_shard shard_grad_op zero1 zero2 zero3; do
    ranks=$([ "$strategy" = none ] && echo 1 || echo 2)
    dir="$work/$model-$strategy"
    cat >"$work/c.toml" <<TOML
[model]
$(model_lines "$model")
[data]
corpus = $corpus
tokenizer = "byte"
seq_len = 64
eval_sequences = 16
[train]
steps = $steps
micro_batch = 8
warmup = 2
sample_tokens = 0
[parallel]
$(parallel_lines "$strategy")
[run]
dir = "$dir"
log_every = 1000
threads = 1
TOML
    if [ "$ranks" = 1 ]; then
      "$bin" train --config "$work/c.toml" >/dev/null
    else
      "$bin" launch --nproc 2 -- "$bin" train --config "$work/c.toml" >/dev/null
    fi
    echo "== $model, $strategy, $ranks rank(s), $steps steps"
    "$bin" plan --validate "$dir"
    echo "-- with this host measured now:"
    "$bin" plan --validate "$dir" --measure-host | tail -1
  done
done
