#!/usr/bin/env bash
# Builds the libFuzzer programs (clang, with AddressSanitizer and UndefinedBehaviorSanitizer)
# into build-fuzz/ and runs each for SECONDS (default 60), starting from the seed corpus in
# fuzz/corpus/TARGET. Usage: bash scripts/fuzz.sh [SECONDS] [TARGET...]
# Targets: train_config deepspeed_config accelerate_config safetensors_header checkpoint_index
# hf_config token_shard sample_shard instruction_jsonl chat_template hf_tokenizer. New inputs libFuzzer finds go to build-fuzz/corpus/TARGET; a crash is
# written to build-fuzz/crashes/ and ends the run with a non-zero status. Add a fixed crash's input
# to fuzz/corpus/TARGET/ so the test suite replays it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
if ! command -v clang++ >/dev/null 2>&1 || ! dpkg-query -W -f='${Status}' libclang-rt-dev 2>/dev/null | grep -q "ok installed"; then
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null
fi
seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(train_config deepspeed_config accelerate_config safetensors_header checkpoint_index
           hf_config token_shard sample_shard instruction_jsonl chat_template hf_tokenizer)
fi
CXX=clang++ CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=None \
  "-DCMAKE_CXX_FLAGS=-O1 -gline-tables-only" -DSHARDTRAIN_FUZZ=ON -DSHARDTRAIN_BUILD_TESTS=OFF \
  >/dev/null
cmake --build build-fuzz --parallel "$(nproc)" --target "${targets[@]/#/fuzz_}"
export ASAN_OPTIONS="detect_container_overflow=0:detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
mkdir -p build-fuzz/crashes
status=0
for target in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$target"
  echo "== $target: ${seconds} s"
  if ! build-fuzz/fuzz_"$target" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
      -rss_limit_mb=4096 -artifact_prefix="build-fuzz/crashes/${target}-" \
      "build-fuzz/corpus/$target" "fuzz/corpus/$target" 2>"build-fuzz/$target.log"; then
    status=1
    echo "   crashed: see build-fuzz/$target.log and build-fuzz/crashes/"
  fi
  # The last status line (executions, coverage, corpus) and the final statistics.
  grep -E "^#[0-9]+.*(DONE|pulse)|stat::number_of_executed_units|stat::average_exec_per_sec" \
    "build-fuzz/$target.log" | tail -4 || true
done
exit $status
