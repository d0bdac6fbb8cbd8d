#!/usr/bin/env bash
# A new user's first hour on a machine without a GPU, timed: clone this checkout's HEAD, run the
# test command, install flashtune, make a first report on the test double. No CUDA on PATH and
# empty pip, npm and cargo caches, so every download a new machine makes is made (and timed).
# What a CI-like run that reuses a local nvcc or cache can hide shows here.
#   scripts/fresh-clone.sh [WORK_DIR]    (default: a new temp folder; the times go to WORK_DIR/times)
set -uo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d "${TMPDIR:-/tmp}/flashtune-fresh.XXXXXX")}"
mkdir -p "$work" && cd "$work" || exit 1
git clone -q "$src" flashtune && cd flashtune || exit 1
PATH=$(tr ':' '\n' <<<"$PATH" | grep -v cuda | paste -sd:)
unset FLASHTUNE_NVCC FLASHTUNE_GEMINI_CLI CUDA_HOME CUDA_PATH
export PATH PIP_NO_CACHE_DIR=1 npm_config_cache="$work/npm-cache" CARGO_HOME="$work/cargo-home"
step() {
  local name=$1 t0 rc; shift
  t0=$(date +%s); "$@" >"$work/$name.log" 2>&1; rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - t0 )) s (log: $work/$name.log)" | tee -a "$work/times"
}
step test bash scripts/test.sh
step install cargo install --quiet --path . --root "$work/bin"
step first-report "$work/bin/bin/flashtune" tune --fake-gpu
du -sh target .tools "$work/cargo-home" | tee -a "$work/times"
