#!/usr/bin/env bash
# The boundary between the agent and the tool on a GPU (issue 47), in one call:
# scripts/step-cheats.sh (every cheat and every edit past the tree refused by name, nothing
# committed, a swap during `judge` never committed), then `tune` on the cheat space and the Hopper
# space with this binary (the builds record what nvcc read; the proposer runs under the sandbox
# where the kernel has Landlock). PyTorch and ncu are left out: the figures are the tool's own.
#   scripts/boundary-gpu.sh NEW_BIN      logs and reports packed into $OUT/boundary.tgz
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "$1")
out=$(mktemp -d)/boundary; mkdir -p "$out"
trap 'tar czf "${OUT:-runs}/boundary.tgz" -C "$(dirname "$out")" boundary' EXIT
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$out/nvidia-smi.txt"
uname -r | tee "$out/kernel.txt"
timed() { local name=$1 t0; shift; t0=$(date +%s.%N); "$@"; local rc=$?; echo "$name $(awk "BEGIN{print $(date +%s.%N) - $t0}") s (exit $rc)" | tee -a "$out/walls.txt"; return $rc; }
OUT=$out timed step-cheats bash scripts/step-cheats.sh "$bin" > "$out/step-cheats.txt" 2>&1
tail -60 "$out/step-cheats.txt"
tree=$(mktemp -d)/tree; mkdir -p "$tree"
# The tree as it is (a device copy's git index may be stale): everything but builds, runs and tools.
tar --exclude=./target --exclude=./runs --exclude=./.git --exclude=./.tools -cf - . | tar -xf - -C "$tree"
sed -i -e '/^\[baseline\]/,/^\[/ s/^command = .*/command = []/' -e '/^\[profile\]/,/^\[/ s/^enabled = true/enabled = false/' "$tree/policies.toml"
for space in cheats hopper; do
  (cd "$tree" && timed "tune-$space" "$bin" tune --space "variants/$space.toml" > "$out/$space.txt" 2> "$out/$space.err")
  tail -30 "$out/$space.txt"
  run=$(sed -n 's/^Run log: //p' "$out/$space.txt" | tail -1)
  case $run in /*) ;; *) run=$tree/$run ;; esac
  [ -f "$run" ] && cp "$run" "$out/$space.log.jsonl" && cp "$(dirname "$run")/report.md" "$out/$space.report.md"
done
cat "$out/walls.txt"
