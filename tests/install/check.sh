#!/usr/bin/env bash
# Installs the built tree into a temporary prefix, then configures, builds and runs a consumer
# project that uses find_package(shardtrain). Usage: check.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
here="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$here" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer"
