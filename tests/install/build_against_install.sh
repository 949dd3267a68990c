# Sourced by the install checks. build_against_install BUILD_DIR SOURCE_DIR WORK_DIR installs
# BUILD_DIR into WORK_DIR/prefix, then configures and builds the project in SOURCE_DIR into
# WORK_DIR/project with find_package(shardtrain) looking only there.
build_against_install() {
  local build="$1" source="$2" work="$3"
  cmake --install "$build" --prefix "$work/prefix" >/dev/null
  cmake -S "$source" -B "$work/project" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
  cmake --build "$work/project" >/dev/null
}
