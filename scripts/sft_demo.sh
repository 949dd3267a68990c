#!/usr/bin/env bash
# Sets up the machine, builds shardtrain and runs the fine-tuning demo (docs/finetune.md): chat
# data built from Debian's `fortunes` package, a small Qwen3-family model pre-trained briefly with
# Qwen3's own tokenizer and exported as a Hugging Face folder, then fine-tuning from that folder
# under FSDP over 2 ranks with the loss on the assistant's replies; it prints the loss, the
# evaluation loss and a reply rendered through Qwen3's chat template, exports the fine-tuned
# model as a Hugging Face folder with its tokenizer, and answers one more request from the
# checkpoint with `shardtrain generate`. About 8 minutes on 2 CPU cores.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/build.sh
rm -rf runs/sft_data runs/sft_pretrain runs/sft_base runs/sft_demo runs/sft_hf
node scripts/sft_data.js runs/sft_data
build/shardtrain launch --nproc 2 -- build/shardtrain train --config configs/sft_pretrain.toml
# A Hugging Face folder: config.json, model.safetensors, and the run's tokenizer files.
build/shardtrain ckpt export runs/sft_pretrain/checkpoints --format hf runs/sft_base
build/shardtrain launch --nproc 2 -- build/shardtrain train --config configs/sft_demo.toml "$@"
build/shardtrain ckpt export runs/sft_demo/checkpoints --format hf runs/sft_hf
build/shardtrain generate runs/sft_demo/checkpoints --prompt "Give me a saying about food."
