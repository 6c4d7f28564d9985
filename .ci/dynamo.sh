#!/usr/bin/env bash
# Build (once) and cache the NVIDIA Dynamo venv of the real-engine stage's Dynamo checks
# (tests/real_engine/dynamo/): the OpenAI frontend (`python -m dynamo.frontend`) and the GPU-free
# mocker worker (`python -m dynamo.mocker`), with file discovery and the TCP request plane, so
# neither etcd nor NATS is needed.
#
# The venv is cached under $ROOFLIGHT_CACHE_DIR (default /var/cache/rooflight) as
# dynamo-<sha256 of tests/real_engine/dynamo/dynamo-lock.txt, 16 hex>, installed with pip --no-deps
# from that lock file: a changed lock file builds a new venv and older dynamo-* venvs are deleted.
# A half-built venv (no marker file) is rebuilt. --no-deps because ai-dynamo requires `aisimulate`,
# a stub whose install fetches its real wheel from a host outside the package index; only
# dynamo.planner imports it (the lock file says so and lists everything else).
# Measured on the project's 2-core machine (shared with other jobs): cold build ~1 min (see
# docs/engines.md "Dynamo in CI"), a cached run well under a second.
#
# Output: the last line on stdout is `DYNAMO_PYTHON=<venv python>`; the tests read
# ROOFLIGHT_DYNAMO_PYTHON and make their tiny tokenizer with it (make_tiny_llama.py --no-weights).
#
# usage: .ci/dynamo.sh                build if needed, print the venv's python
#        .ci/dynamo.sh --test [args]  build if needed, then run tests/real_engine/dynamo
# env:   ROOFLIGHT_CACHE_DIR, PYTHON (system python with rooflight installed, default python3),
#        DYNAMO_BASE_PYTHON (python >= 3.10 that creates the venv, default python3)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCK=$REPO/tests/real_engine/dynamo/dynamo-lock.txt
PYTHON=${PYTHON:-python3}
DYNAMO_BASE_PYTHON=${DYNAMO_BASE_PYTHON:-python3}

t0=$(date +%s)
say() { echo "[dynamo $(date +%T) +$(( $(date +%s) - t0 ))s] $*" >&2; }

source "$REPO/.ci/cache.sh"
cache=$(cache_dir)
VENV=$cache/dynamo-$(sha256sum "$LOCK" | cut -c1-16)

build_venv() {
  say "building the Dynamo venv $VENV from $(basename "$LOCK") (cold: ~1-2 min)"
  rm -rf "$VENV"
  "$DYNAMO_BASE_PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --no-cache-dir --no-deps -r "$LOCK" >"$cache/dynamo-pip-install.log" 2>&1 \
    || { tail -40 "$cache/dynamo-pip-install.log" >&2; exit 1; }
  "$VENV/bin/python" -c "import dynamo.frontend, dynamo.mocker, dynamo.llm, transformers, tokenizers; \
from importlib.metadata import version; print('ai-dynamo', version('ai-dynamo'), 'runtime', version('ai-dynamo-runtime'))" >&2
}

cached dynamo "$VENV" build_venv

if [ "${1:-}" = "--test" ]; then
  shift
  cd "$REPO"
  ROOFLIGHT_DYNAMO_PYTHON=$VENV/bin/python "$PYTHON" -m pytest tests/real_engine/dynamo -m real_engine -q \
    -p no:cacheprovider --timeout 900 -o faulthandler_timeout=1000 "$@"
fi
echo "DYNAMO_PYTHON=$VENV/bin/python"
