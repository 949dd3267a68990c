#!/usr/bin/env bash
# Configures, builds and tests shardtrain against the LibTorch of the machine's PyTorch (on a
# GPU machine: the CUDA one), with the Debian dependencies from .deps/gpu/root that
# scripts/gpu_deps.sh gathered. Run from anywhere; it works in the repository root.
#
#   bash scripts/gpu_build.sh [--configure-only] [--no-test] [--compile FILE]
#
#   --configure-only  stop after cmake's configure and the check of where each dependency came
#                     from (with --compile, after compiling that one source file)
#   --no-test         build, but run no test
#   --compile FILE    compile only FILE (a path under the repository, e.g.
#                     src/config/accelerate_config.cpp, which includes yaml-cpp) with its command
#                     from compile_commands.json, then a probe that includes every dependency's
#                     headers with the same flags, links their libraries and runs; implies
#                     --configure-only. Checks the include paths without building everything
#
# Environment:
#   TORCH_PREFIX    a LibTorch install prefix to use instead of asking python3's torch (to check
#                   this script on a Debian machine: TORCH_PREFIX=/usr)
#   BUILD_DIR       the build folder (default build-gpu)
#   OUT             when set, the logs and a summary are written there (gpu_build.log,
#                   gpu_test.log, gpu_summary.txt)
#   CTEST_ARGS      arguments for ctest instead of none (all tests), e.g.
#                   "-E ^(ChatTemplate|ChatSamples)\." (they need node and .deps/npm-ref)
#   CTEST_PARALLEL  test processes at a time (default: half the cores)
#   DEADLINE_S      seconds this script may run in all; the build and then the tests are
#                   stopped in time to write the summary (where commands are killed at a time
#                   limit, set this 30 s below it). A stopped build continues when run again
#   USE_SHIPPED_PKG_CONFIG=1  use .deps/gpu's pkgconf even when the machine has pkg-config
#
# Every dependency but LibTorch, gloo (inside LibTorch) and the compiler must resolve under
# .deps/gpu/root; configure fails naming the one that did not. Exits non-zero naming the step
# that failed.
set -euo pipefail

started=$SECONDS
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

configure_only=0
run_tests=1
compile_file=""
while [ $# -gt 0 ]; do
  case "$1" in
    --configure-only) configure_only=1 ;;
    --no-test) run_tests=0 ;;
    --compile)
      [ $# -ge 2 ] || { echo "gpu_build: --compile needs a file" >&2; exit 2; }
      compile_file="$2"
      configure_only=1
      shift
      ;;
    *) echo "gpu_build: unknown argument '$1' (known: --configure-only, --no-test, --compile FILE)" >&2; exit 2 ;;
  esac
  shift
done

build_dir="${BUILD_DIR:-build-gpu}"
case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac
deps="$root/.deps/gpu/root"
logs="${OUT:-$build_dir}"
mkdir -p "$build_dir" "$logs"
build_log="$logs/gpu_build.log"
test_log="$logs/gpu_test.log"
summary="$logs/gpu_summary.txt"
: >"$build_log"
: >"$summary"
# A copy of the summary stays in the build folder: $OUT may be emptied before the next run,
# and bench/gpu.sh reads which LibTorch and backends the build has from it.
if [ "$logs" != "$build_dir" ]; then
  trap 'cp "$summary" "$build_dir/gpu_summary.txt" 2>/dev/null || true' EXIT
fi

note() {  # a line for the summary and for the console
  echo "$*" | tee -a "$summary"
}
fail() {  # STEP MESSAGE: the step that failed, named last in the summary and on the console
  note "FAILED at step '$1': $2"
  note "elapsed $((SECONDS - started)) s; full log: $build_log"
  exit 1
}
run_step() {  # STEP COMMAND...: output to the build log; on failure, its tail to the console
  local step="$1"
  shift
  echo "== $step: $*" >>"$build_log"
  echo "gpu_build: $step"
  if ! "$@" >>"$build_log" 2>&1; then
    echo "---- last lines of $build_log ----"
    tail -n 60 "$build_log"
    fail "$step" "'$*' exited non-zero"
  fi
}

[ -d "$deps/usr/include" ] ||
  fail deps "$deps is missing: run \`bash scripts/gpu_deps.sh\` on the Debian machine and copy .deps/gpu/root and .deps/gpu/npm here"
note "gpu_build: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(nproc) cores"

# ---- LibTorch: where, which version, which C++ ABI, CUDA or not --------------------------------
torch_cmake=""
torch_version=""
abi=""
torch_cuda=""
torch_lib=""
torch_inc=""
torch_nccl=0
site=""
if [ -n "${TORCH_PREFIX:-}" ]; then
  torch_cmake="$TORCH_PREFIX"
  config="$(find "$TORCH_PREFIX"/lib* "$TORCH_PREFIX"/share -maxdepth 5 \
    -path '*/cmake/Torch/TorchConfig.cmake' -print -quit 2>/dev/null || true)"
  [ -n "$config" ] || fail torch "no cmake/Torch/TorchConfig.cmake under TORCH_PREFIX=$TORCH_PREFIX"
  torch_version="$(sed -n 's/.*PACKAGE_VERSION "\([^"]*\)".*/\1/p' "$(dirname "$config")/TorchConfigVersion.cmake" | head -n 1)"
  abi="$(sed -n 's/.*_GLIBCXX_USE_CXX11_ABI=\([01]\).*/\1/p' "$config" | head -n 1)"
  torch_inc="$TORCH_PREFIX/include"
  torch_lib="$TORCH_PREFIX/lib"
  [ -f "$torch_lib/libtorch_cpu.so" ] || torch_lib="$TORCH_PREFIX/lib/x86_64-linux-gnu"
  if compgen -G "$torch_lib/libtorch_cuda.so*" >/dev/null; then torch_cuda="yes (libtorch_cuda.so)"; fi
else
  python="${PYTHON:-python3}"
  info="$("$python" - <<'PY' 2>>"$build_log"
import os, torch, torch.distributed, torch.utils
print(torch.utils.cmake_prefix_path)
print(torch.__version__)
print(int(torch.compiled_with_cxx11_abi()))
print(torch.version.cuda or "")
print(os.path.join(os.path.dirname(torch.__file__), "lib"))
print(os.path.join(os.path.dirname(torch.__file__), "include"))
print(os.path.dirname(os.path.dirname(torch.__file__)))
print(int(torch.distributed.is_available() and torch.distributed.is_nccl_available()))
PY
  )" || fail torch "python3 could not import torch (see $build_log); set TORCH_PREFIX to a LibTorch instead"
  {
    read -r torch_cmake
    read -r torch_version
    read -r abi
    read -r torch_cuda
    read -r torch_lib
    read -r torch_inc
    read -r site
    read -r torch_nccl
  } <<<"$info"
fi
[ -n "$abi" ] || fail torch "could not tell which C++ ABI LibTorch $torch_version was built with"
note "LibTorch $torch_version at $torch_cmake; _GLIBCXX_USE_CXX11_ABI=$abi; CUDA ${torch_cuda:-no}"

# yaml-cpp, toml++ and GoogleTest in .deps/gpu are Debian builds, with the C++11 ABI: a LibTorch
# of the old ABI could not link with them (undefined std::__cxx11 symbols one way or the other).
if [ "$abi" != 1 ]; then
  fail abi "LibTorch $torch_version uses the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0) but the Debian \
yaml-cpp, toml++ and GoogleTest in .deps/gpu use the C++11 ABI; use a PyTorch built with the C++11 \
ABI (recent wheels are: torch.compiled_with_cxx11_abi() must say True) or build those three \
from source with -D_GLIBCXX_USE_CXX11_ABI=0"
fi

# PyTorch 2.12 and later refuse to compile under C++17 (#error in ATen.h); the project says C++17
# (CMakeLists.txt). Then every C++17 target is compiled as C++20 through the flag CMake uses for
# C++17, without touching CMakeLists.txt; the summary says so, since it is the project's decision.
cmake_extra=()
if grep -qsE 'C\+\+20 or later|__cplusplus < 202002L' "$torch_inc/ATen/ATen.h" \
  "$torch_inc/c10/macros/Macros.h" "$torch_inc/torch/csrc/api/include/torch/all.h"; then
  printf '%s\n' 'set(CMAKE_CXX17_STANDARD_COMPILE_OPTION -std=c++20)' \
    'set(CMAKE_CXX17_EXTENSION_COMPILE_OPTION -std=gnu++20)' >"$build_dir/cxx20.cmake"
  cmake_extra+=("-DCMAKE_PROJECT_INCLUDE=$build_dir/cxx20.cmake")
  note "LibTorch $torch_version requires C++20: compiling the C++17 targets as C++20 (CMakeLists.txt still says 17)"
else
  cmake_extra+=("-UCMAKE_PROJECT_INCLUDE")  # a build folder configured before with the above
fi

# ---- CUDA: nvcc for LibTorch's CMake files, nccl.h for the NCCL process group ------------------
cxx_flags="-D_GLIBCXX_USE_CXX11_ABI=$abi"
if [ -n "$torch_cuda" ]; then
  nvcc="${CUDACXX:-$(command -v nvcc || true)}"
  [ -n "$nvcc" ] || nvcc="$(ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)"
  [ -n "$nvcc" ] || nvcc="$(find "${site:-/nonexistent}/nvidia" -path '*/bin/nvcc' -print -quit 2>/dev/null || true)"
  [ -n "$nvcc" ] || fail cuda "LibTorch has CUDA but no nvcc was found (PATH, /usr/local/cuda/bin, site-packages/nvidia); set CUDACXX"
  cuda_root="$(cd "$(dirname "$nvcc")/.." && pwd)"
  # Exported too for the projects the install tests configure (find_dependency(Torch) there).
  export CUDACXX="$nvcc" CUDAToolkit_ROOT="$cuda_root"
  cmake_extra+=("-DCMAKE_CUDA_COMPILER=$nvcc" "-DCUDAToolkit_ROOT=$cuda_root" "-DCUDA_TOOLKIT_ROOT_DIR=$cuda_root")
  # LibTorch's CMake files ask for the GPU architectures; the H100 and H200 are 9.0.
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
  note "nvcc: $nvcc ($("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
  # c10d's NCCL header is empty unless USE_C10D_NCCL is defined, as it was for the build of
  # libtorch_cuda.so when torch.distributed.is_nccl_available(); LibTorch's CMake files may not
  # pass it on to its users.
  if [ "$torch_nccl" = 1 ]; then cxx_flags="$cxx_flags -DUSE_C10D_NCCL"; fi
  nccl_h="$(find "${site:-/nonexistent}/nvidia" "$cuda_root/include" -name nccl.h -print -quit 2>/dev/null || true)"
  if [ -n "$nccl_h" ]; then
    cxx_flags="$cxx_flags -isystem $(dirname "$nccl_h")"
    note "nccl.h: $nccl_h"
  else
    note "warning: no nccl.h found: src/comm/nccl_group.cpp (through ProcessGroupNCCL.hpp) will not compile"
  fi
fi
# The wheel links gloo into libtorch_cpu.so and ships no libgloo: src/comm/gloo_*.cpp call gloo
# directly, so they link only if libtorch_cpu.so exports gloo's symbols. Said before the build.
if command -v nm >/dev/null 2>&1 && [ -f "$torch_lib/libtorch_cpu.so" ]; then
  n="$(nm -D --defined-only -C "$torch_lib/libtorch_cpu.so" 2>/dev/null | grep -c ' gloo::' || true)"
  note "gloo symbols defined in libtorch_cpu.so: $n (with 0 and no libgloo, src/comm/gloo_*.cpp cannot link)"
fi

# Gloo's headers: the wheel's own if it has them, else those scripts/gpu_deps.sh took from
# pytorch/gloo, at the revision whose gloo::Context matches libtorch_cpu.so's (gloo's
# shared-memory change of 2026-01 added members to it and gloo::Context::isIntraNode).
gloo_cmake=()
if [ ! -f "$torch_inc/gloo/allgatherv.h" ] && [ -d "$root/.deps/gpu/gloo" ]; then
  gloo_rev=bcd1672
  if nm -D --defined-only -C "$torch_lib/libtorch_cpu.so" 2>/dev/null | grep -q 'gloo::Context::isIntraNode'; then
    gloo_rev=5994546
  fi
  gloo_cmake=("-DGLOO_INCLUDE_DIR=$root/.deps/gpu/gloo/$gloo_rev")
  note "gloo headers: .deps/gpu/gloo/$gloo_rev (pytorch/gloo at $gloo_rev; the wheel ships none)"
fi

# ---- the npm files the build embeds: .deps/npm, or the subset carried in .deps/gpu/npm ---------
npm_dir="$root/.deps/npm/node_modules"
if [ ! -f "$npm_dir/uplot/dist/uPlot.iife.min.js" ]; then
  [ -d "$root/.deps/gpu/npm/node_modules" ] ||
    fail npm "neither .deps/npm nor .deps/gpu/npm is here: copy .deps/gpu/npm here"
  mkdir -p "$npm_dir"
  cp -r "$root/.deps/gpu/npm/node_modules/." "$npm_dir/"
  note "npm files: copied .deps/gpu/npm into .deps/npm"
fi

# ---- pkg-config over .deps/gpu's .pc files only, their prefix=/usr pointed at the tree ---------
lib="$deps/usr/lib/x86_64-linux-gnu"
pc_dir="$build_dir/deps-pkgconfig"
rm -rf "$pc_dir"
mkdir -p "$pc_dir"
for pc in "$lib"/pkgconfig/*.pc "$deps"/usr/share/pkgconfig/*.pc; do
  sed "s|^prefix=/usr\$|prefix=$deps/usr|" "$pc" >"$pc_dir/$(basename "$pc")"
done
export PKG_CONFIG_LIBDIR="$pc_dir"  # replaces the default search path: nothing of the system's
export PKG_CONFIG_PATH="$pc_dir"
pkg_config="$(command -v pkg-config || true)"
if [ -z "$pkg_config" ] || [ "${USE_SHIPPED_PKG_CONFIG:-0}" = 1 ]; then
  pkg_config="$build_dir/bin/pkg-config"
  mkdir -p "$build_dir/bin"
  # shellcheck disable=SC2016  # $LD_LIBRARY_PATH and $@ are for the wrapper to expand
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
    "$lib" "$deps/usr/bin/pkgconf" >"$pkg_config"
  chmod +x "$pkg_config"
fi
"$pkg_config" --modversion libpcre2-8 >/dev/null 2>>"$build_log" ||
  fail pkg-config "$pkg_config cannot read $pc_dir/libpcre2-8.pc"
note "pkg-config: $pkg_config over $pc_dir"

# For the tests that configure, link and run programs themselves (tests/install/*.sh): CMake
# reads CMAKE_PREFIX_PATH from the environment, gcc LIBRARY_PATH, the loader LD_LIBRARY_PATH.
prefix_path="$deps/usr;$torch_cmake"
export CMAKE_PREFIX_PATH="$deps/usr:$torch_cmake${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$lib:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- configure ---------------------------------------------------------------------------------
command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || fail compiler "no c++ or g++ on PATH"
note "compiler: $(c++ --version 2>/dev/null | head -n 1 || g++ --version | head -n 1); $(cmake --version | head -n 1); ninja $(ninja --version)"
# Each package's CMake folder by name, and zlib by file, so that neither a compiler without a
# multiarch folder nor a copy on the machine itself changes what is found.
torch_dir=()
[ -f "$torch_cmake/Torch/TorchConfig.cmake" ] && torch_dir=("-DTorch_DIR=$torch_cmake/Torch")
run_step configure cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$prefix_path" "${torch_dir[@]}" \
  "-Dnlohmann_json_DIR=$deps/usr/share/cmake/nlohmann_json" \
  "-DCLI11_DIR=$deps/usr/share/cmake/CLI11" \
  "-Dtomlplusplus_DIR=$lib/cmake/tomlplusplus" \
  "-Dyaml-cpp_DIR=$lib/cmake/yaml-cpp" \
  "-DGTest_DIR=$lib/cmake/GTest" \
  "-DZLIB_INCLUDE_DIR=$deps/usr/include" "-DZLIB_LIBRARY=$lib/libz.so" \
  "-DPKG_CONFIG_EXECUTABLE=$pkg_config" \
  "-DCMAKE_CXX_FLAGS=$cxx_flags" "${cmake_extra[@]}" "${gloo_cmake[@]}"
note "$(grep -m 1 -o 'shardtrain: LibTorch.*' "$build_log" || echo 'configure printed no NCCL line')"
gloo_lib="$(grep -m 1 '^GLOO_LIBRARY:' "$build_dir/CMakeCache.txt" | cut -d= -f2-)"
case "$gloo_lib" in *NOTFOUND | "") gloo_lib="none: the gloo inside libtorch_cpu.so" ;; esac
note "gloo: headers $(grep -m 1 '^GLOO_INCLUDE_DIR:' "$build_dir/CMakeCache.txt" | cut -d= -f2-), library $gloo_lib"

# Where each dependency came from: all of them must lie in .deps/gpu/root.
cache="$build_dir/CMakeCache.txt"
outside=0
for var in nlohmann_json_DIR CLI11_DIR tomlplusplus_DIR yaml-cpp_DIR GTest_DIR ZLIB_INCLUDE_DIR \
  ZLIB_LIBRARY pkgcfg_lib_PCRE2_pcre2-8 pkgcfg_lib_UTF8PROC_utf8proc PCRE2_INCLUDEDIR \
  UTF8PROC_INCLUDEDIR; do
  value="$(grep -m 1 "^$var:" "$cache" | cut -d= -f2- || true)"
  where="in .deps/gpu"
  case "$value" in "$deps"/*) ;; *) where="OUTSIDE .deps/gpu"; outside=1 ;; esac
  note "  $var = ${value:-(not set)}  [$where]"
done
[ "$outside" -eq 0 ] || fail configure "a dependency was found outside $deps (listed above)"

if [ -n "$compile_file" ]; then
  # FILE with the command CMake generated for it, then a probe that includes every dependency's
  # header with the same flags: -H lists each header the compiler opened, and those of the
  # dependencies must come from the tree. Proves the include paths without building everything.
  file="$root/${compile_file#"$root"/}"
  probe="$build_dir/gpu_probe.cpp"
  cat >"$probe" <<'CPP'
#define PCRE2_CODE_UNIT_WIDTH 8
#include <gtest/gtest.h>
#include <pcre2.h>
#include <utf8proc.h>
#include <yaml-cpp/yaml.h>
#include <zlib.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>("a+"), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF, &error, &offset, nullptr);
  const bool ok = re && YAML::Load("a: 1")["a"].as<int>() == 1 &&
                  toml::parse("a = 1")["a"].value<int64_t>() == 1 &&
                  nlohmann::json::parse(R"({"a": 1})")["a"] == 1 &&
                  CLI::App("a probe", "probe").get_name() == "probe" && utf8proc_version()[0] == '2' &&
                  zlibVersion()[0] == '1';
  pcre2_code_free(re);
  std::puts(ok ? "gpu_probe: every dependency links and answers" : "gpu_probe: a wrong answer");
  return ok ? 0 : 1;
}
CPP
  commands="$(python3 - "$build_dir/compile_commands.json" "$file" "$probe" <<'PY'
import json, shlex, sys
db, source, probe = sys.argv[1:]
for entry in json.load(open(db)):
    if entry["file"] == source:
        args = shlex.split(entry["command"])
        print(shlex.join(args + ["-H"]))
        out, skip = [], False
        for a in args:
            if skip:
                skip = False
            elif a in ("-o", "-MF", "-MT"):
                skip = True
            elif a != "-MD":
                out.append(probe if a == source else a)
        print(shlex.join(out + ["-o", probe + ".o", "-H"]))
        break
PY
  )"
  [ -n "$commands" ] || fail compile "$compile_file is not in $build_dir/compile_commands.json"
  headers="$build_dir/compile_headers.txt"
  : >"$headers"
  while IFS= read -r cmd; do
    echo "== compile: $cmd" >>"$build_log"
    echo "gpu_build: compile ${cmd##* -c }"
    (cd "$build_dir" && eval "$cmd") >>"$headers" 2>&1 ||
      { tail -n 40 "$headers"; fail compile "'$cmd' failed"; }
  done <<<"$commands"
  for header in yaml-cpp/yaml.h toml++/toml.h CLI/CLI.hpp nlohmann/json.hpp pcre2.h utf8proc.h zlib.h; do
    got="$(awk -v h="/include/$header" '/^\.+ / && substr($2, length($2) - length(h) + 1) == h { print $2; exit }' "$headers")"
    [ -n "$got" ] || fail compile "no compile opened $header"
    case "$(realpath "$got")" in
      "$deps"/*) note "  $header: $(realpath "$got")  [in .deps/gpu]" ;;
      *) note "  $header: $(realpath "$got")  [OUTSIDE .deps/gpu]"; outside=1 ;;
    esac
  done
  [ "$outside" -eq 0 ] || fail compile "a header came from outside $deps (listed above)"
  # Link the probe with the tree's libraries alone and run it: their .so links, the static
  # GoogleTest and the C++ ABI all agree on this machine.
  run_step link-probe c++ "$probe.o" -o "$build_dir/gpu_probe" -L"$lib" -Wl,-rpath,"$lib" \
    -Wl,--no-undefined -lgtest -lyaml-cpp -ltomlplusplus -lpcre2-8 -lutf8proc -lz -pthread
  probe_said="$("$build_dir/gpu_probe" 2>&1)" || fail link-probe "the probe linked but failed: $probe_said"
  note "$probe_said"
  note "compiled $compile_file, and the probe of every dependency, which links and runs"
fi
if [ "$configure_only" -eq 1 ]; then
  note "configure only: done in $((SECONDS - started)) s"
  exit 0
fi

# ---- build and test ----------------------------------------------------------------------------
deadline_left() {  # seconds left of DEADLINE_S, keeping MARGIN for the summary; empty if none
  [ -n "${DEADLINE_S:-}" ] && echo $((DEADLINE_S - (SECONDS - started) - $1))
  return 0
}
# -k 0: a failed file does not stop the others, so that one run lists every compile error.
build_cmd=(cmake --build "$build_dir" --parallel "$(nproc)" -- -k 0)
left="$(deadline_left 30)"
if [ -n "$left" ]; then
  [ "$left" -gt 0 ] || fail build "no time left of DEADLINE_S=$DEADLINE_S"
  build_cmd=(timeout --signal=TERM --kill-after=10 "$left" "${build_cmd[@]}")
fi
echo "== build: ${build_cmd[*]}" >>"$build_log"
echo "gpu_build: build"
set +e
"${build_cmd[@]}" >>"$build_log" 2>&1
rc=$?
set -e
if [ "$rc" -eq 124 ]; then
  fail build "stopped at the deadline after ninja's $(grep -o '^\[[0-9]*/[0-9]*\]' "$build_log" | tail -n 1); \
the same command again continues it, while the machine is warm and keeps $build_dir"
elif [ "$rc" -ne 0 ]; then
  echo "---- errors in $build_log ----"
  grep -E -A3 'error:|FAILED:|undefined reference' "$build_log" | head -n 80
  fail build "the build failed (errors above)"
fi
note "built in $((SECONDS - started)) s"

# A wheel's libtorch exports its own std::filesystem; a program whose libraries list libtorch
# before libstdc++ calls that copy, and its remove_all crashes (CMakeLists.txt). Say where
# libstdc++ stands among each program's libraries, and which linker made them.
cxx_used="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt" | head -n 1)"
note "linker: $("${cxx_used:-c++}" -Wl,--version 2>/dev/null | head -n 1 || echo unknown) (through ${cxx_used:-c++})"
grep -m 1 -o 'shardtrain: /.* first among each program.s libraries' "$build_log" | tee -a "$summary" || true
libstdcxx_order_ok=1
for program in "$build_dir/shardtrain" "$build_dir/tests/shardtrain_tests"; do
  [ -x "$program" ] || continue
  needed="$(readelf -d "$program" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
  stdcxx="$(grep -n '^libstdc++' <<<"$needed" | head -n 1 | cut -d: -f1 || true)"
  torch="$(grep -n '^libtorch' <<<"$needed" | head -n 1 | cut -d: -f1 || true)"
  order="libstdc++ at ${stdcxx:-none}, libtorch at ${torch:-none} of $(wc -l <<<"$needed") libraries"
  if [ -n "$torch" ] && { [ -z "$stdcxx" ] || [ "$stdcxx" -gt "$torch" ]; }; then
    note "${program#"$root"/}: $order: LIBTORCH BEFORE LIBSTDC++ (with a wheel's LibTorch, std::filesystem::remove_all then crashes)"
    libstdcxx_order_ok=0
  else
    note "${program#"$root"/}: $order"
  fi
done
[ "$run_tests" -eq 1 ] || exit 0

if [ "$libstdcxx_order_ok" -eq 0 ]; then
  # The tests would crash at their first folder removal; with libstdc++ loaded first they show
  # everything else. The summary says so: the programs themselves still need the fix.
  LD_PRELOAD="$("${cxx_used:-c++}" -print-file-name=libstdc++.so.6)"
  export LD_PRELOAD
  note "tests run with LD_PRELOAD=$LD_PRELOAD (libtorch before libstdc++ above)"
fi
ctest_cmd=(ctest --test-dir "$build_dir" --output-on-failure
  --parallel "${CTEST_PARALLEL:-$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))}")
# shellcheck disable=SC2206  # CTEST_ARGS is a list of words on purpose
[ -n "${CTEST_ARGS:-}" ] && ctest_cmd+=(${CTEST_ARGS})
limit=()
left="$(deadline_left 20)"
if [ -n "$left" ]; then
  [ "$left" -gt 30 ] || fail test "only ${left} s left of DEADLINE_S=$DEADLINE_S for the tests"
  limit=(timeout --signal=TERM --kill-after=10 "$left")
  note "tests: at most $left s (DEADLINE_S=$DEADLINE_S)"
fi
echo "gpu_build: test (${ctest_cmd[*]})"
set +e
"${limit[@]}" "${ctest_cmd[@]}" >"$test_log" 2>&1
rc=$?
set -e
# Logs are kept to 15 MiB each, so that they can be copied back whole.
if [ "$(stat -c %s "$test_log")" -gt $((15 * 1024 * 1024)) ]; then
  tail -c $((15 * 1024 * 1024)) "$test_log" >"$test_log.tail" && mv "$test_log.tail" "$test_log"
fi
grep -E '^[0-9]+% tests passed|tests failed out of|^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception|Not Run|Child aborted)' \
  "$test_log" | tee -a "$summary" || true
if [ "$rc" -eq 124 ]; then
  fail test "ctest was stopped at the deadline; $(grep -c ' Passed ' "$test_log" || true) tests had passed"
fi
[ "$rc" -eq 0 ] || fail test "ctest exited $rc (failures above; full output: $test_log)"
note "all tests passed in $((SECONDS - started)) s"
