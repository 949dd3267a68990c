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
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
