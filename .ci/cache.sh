# Sourced by .ci/real-engine.sh, .ci/dynamo.sh and .ci/llamacpp.sh: the one way a real-engine build is
# cached. A build lives in $ROOFLIGHT_CACHE_DIR (default /var/cache/rooflight; ~/.cache/rooflight where that
# is not writable) as <kind>-<key>, is complete only once its marker file exists (a half-built one is
# rebuilt), is built by one job at a time on a shared machine (the others wait on its lock, then reuse it),
# and replaces every older <kind>-* build. Needs `say` (each script's own log line).

# The cache directory, created.
cache_dir() {
  local dir=${ROOFLIGHT_CACHE_DIR:-/var/cache/rooflight}
  if ! mkdir -p "$dir" 2>/dev/null || [ ! -w "$dir" ]; then
    dir=${XDG_CACHE_HOME:-$HOME/.cache}/rooflight
    mkdir -p "$dir"
  fi
  echo "$dir"
}

# cached KIND DIR BUILD [FINISH]: run BUILD (a function that makes DIR from nothing) unless DIR is marked
# complete, then FINISH (idempotent steps, also for a cache an older script made) under the same lock,
# then mark DIR complete and remove the other KIND-* builds beside it.
cached() {
  local kind=$1 dir=$2 build=$3 finish=${4:-}
  local cache mark old
  cache=$(dirname "$dir")
  mark=$dir/.rooflight-complete
  exec 9>"$cache/.$kind.lock"
  flock 9
  if [ ! -f "$mark" ]; then
    "$build"
    [ -z "$finish" ] || "$finish"
    date -u +%FT%TZ > "$mark"
  else
    say "reusing cached $kind build $dir (built $(cat "$mark"))"
    [ -z "$finish" ] || "$finish"
  fi
  for old in "$cache/$kind"-*; do
    [ "$old" = "$dir" ] || [ ! -d "$old" ] || { say "removing stale build $old"; rm -rf "$old"; }
  done
  flock -u 9
}
