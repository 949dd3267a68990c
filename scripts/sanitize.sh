#!/usr/bin/env bash
# Builds everything with AddressSanitizer + UndefinedBehaviorSanitizer into build-sanitize/ and
# runs the tests there: all of them, or those whose gtest names match the regular expression
# given as the first argument (e.g. 'CliArguments' for the command-line tests).
# Not part of scripts/test.sh: the instrumented build and run take several times longer.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDTRAIN_SANITIZE=ON \
  >/dev/null
cmake --build build-sanitize --parallel "$(nproc)"
# LibTorch itself is not instrumented: its containers cannot be checked for overflow, and its
# process-lifetime allocations are not leaks of ours.
export ASAN_OPTIONS="detect_container_overflow=0:detect_leaks=0:abort_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
if [ $# -gt 0 ]; then
  ctest --test-dir build-sanitize --output-on-failure -R "$1"
else
  ctest --test-dir build-sanitize --output-on-failure
fi
