#!/usr/bin/env bash
# Installs the built tree into a temporary prefix, then configures, builds and runs a consumer
# project that uses find_package(shardtrain). Usage: check.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
here="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/build_against_install.sh"
build_against_install "$build" "$here" "$work"
"$work/project/consumer"
