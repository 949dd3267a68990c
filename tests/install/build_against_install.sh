# Sourced by the install checks. build_against_install BUILD_DIR SOURCE_DIR WORK_DIR installs
# BUILD_DIR into WORK_DIR/prefix, then configures and builds the project in SOURCE_DIR into
# WORK_DIR/project with find_package(shardtrain) finding the installed package. LibTorch and the
# libraries the package names without a path are taken from where BUILD_DIR found them (a
# LibTorch inside a PyTorch install, libraries in a folder of their own: scripts/gpu_build.sh).
build_against_install() {
  local build="$1" source="$2" work="$3"
  cmake --install "$build" --prefix "$work/prefix" >/dev/null
  local cache="$build/CMakeCache.txt" value var
  cached() { sed -n "s/^$1:[A-Z]*=//p" "$cache" | head -n 1; }
  value="$(cached CMAKE_PREFIX_PATH)"
  local args=("-DCMAKE_PREFIX_PATH=$work/prefix${value:+;$value}")
  for var in Torch_DIR CMAKE_CXX_FLAGS CMAKE_PROJECT_INCLUDE CMAKE_CUDA_COMPILER CUDAToolkit_ROOT \
    CUDA_TOOLKIT_ROOT_DIR; do
    value="$(cached "$var")"
    [ -z "$value" ] || [[ "$value" == *-NOTFOUND ]] || args+=("-D$var=$value")
  done
  value="$(cached yaml-cpp_DIR)"
  if [ -n "$value" ] && [ -d "$value/../.." ]; then
    LIBRARY_PATH="$(cd "$value/../.." && pwd)${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LIBRARY_PATH
  fi
  cmake -S "$source" -B "$work/project" -G Ninja -DCMAKE_BUILD_TYPE=Release "${args[@]}" >/dev/null
  cmake --build "$work/project" >/dev/null
}
