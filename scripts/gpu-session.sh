#!/usr/bin/env bash
# One batched GPU session: doctor, the smoke tune, and the GPU tests, with logs under $OUT.
# Usage on a GPU machine: scripts/gpu-session.sh [BIN_DIR]   (BIN_DIR holds flashtune and flashtune-tests)
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release}
out=${OUT:-runs/gpu-session}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv | tee "$out/nvidia-smi.txt"
echo "== doctor"; "$bin/flashtune" doctor 2>&1 | tee "$out/doctor.txt"
echo "== tune smoke"; "$bin/flashtune" tune --space variants/smoke.toml 2>"$out/tune-stderr.txt" | tee "$out/tune.txt"
run=$(sed -n 's/^Run log: //p' "$out/tune.txt"); [ -n "$run" ] && cp "$run" "$out/log.jsonl"
if [ -x "$bin/flashtune-tests" ]; then
  echo "== GPU tests"
  FLASHTUNE_GPU_TESTS=1 FLASHTUNE_BIN="$PWD/$bin/flashtune" FLASHTUNE_REPO="$PWD" "$bin/flashtune-tests" --include-ignored gpu:: 2>&1 | tee "$out/gpu-tests.txt"
fi
