#!/usr/bin/env bash
# flashtune and Kernel Tuner on the same space, shapes and GPU, one after the other, in one call:
#
#   bench/run.sh OUT_DIR [--space variants/attention.toml] [--gpu 0] [--kt-time-limit SECONDS]
#                        [--ft-time-limit DURATION] [--steps flashtune,kernel-tuner,compare]
#
# Needs: target/release/flashtune (built elsewhere and carried), nvcc on PATH or in /usr/local/cuda,
# python3 with torch and cupy, and the wheels of bench/wheels.txt in .whl/ (bench/fetch-wheels.sh).
# Writes six files into OUT_DIR (the device tool returns at most eight):
#   flashtune.out  flashtune.log.jsonl  flashtune.report.md    (stdout+stderr, run log, its report)
#   kernel_tuner.out  kernel_tuner.json                        (stdout+stderr, results)
#   comparison.md                                              (bench/compare.py's table)
# Both tools start cold: flashtune's build cache and CuPy's kernel cache are fresh empty folders.
# Steps can be split over calls on the same machine (--steps kernel-tuner,compare reuses OUT_DIR's
# flashtune.log.jsonl); each step's wall time is measured here and kept in OUT_DIR/.walls.
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: bench/run.sh OUT_DIR [--space F] [--gpu N] [--kt-time-limit S] [--ft-time-limit D] [--steps a,b,c]}
shift
space=variants/attention.toml
gpu=0
kt_limit=
ft_limit=
steps=flashtune,kernel-tuner,compare
while [ $# -gt 0 ]; do
  case $1 in
    --space) space=$2; shift 2 ;;
    --gpu) gpu=$2; shift 2 ;;
    --kt-time-limit) kt_limit=$2; shift 2 ;;
    --ft-time-limit) ft_limit=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "bench/run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
has() { case ",$steps," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
now() { date +%s.%N; }
status=0

export PATH=/usr/local/cuda/bin:$PATH
export PYTHONUNBUFFERED=1
bin=${FLASHTUNE_BIN:-target/release/flashtune}
cold=$(mktemp -d /tmp/bench-cold.XXXXXX)
export FLASHTUNE_CACHE_DIR=$cold/flashtune-build-cache
export CUPY_CACHE_DIR=$cold/cupy-kernel-cache
echo "== bench/run.sh $(date -u +%FT%TZ): space $space, GPU $gpu, steps $steps, out $out"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>/dev/null

if has flashtune; then
  [ -x "$bin" ] || { echo "bench/run.sh: $bin not found (build it with cargo build --release and carry it)" >&2; exit 4; }
  echo "== flashtune tune --space $space --gpus $gpu ${ft_limit:+--time-limit $ft_limit} ($(date +%T))"
  t0=$(now)
  "$bin" tune --space "$space" --gpus "$gpu" ${ft_limit:+--time-limit "$ft_limit"} >"$out/flashtune.out" 2>&1
  rc=$?
  t1=$(now)
  echo "flashtune_s=$(awk "BEGIN { print $t1 - $t0 }")" >"$out/.walls"
  tail -n 40 "$out/flashtune.out"
  run=$(sed -n 's/^Run log: //p' "$out/flashtune.out" | tail -1)
  if [ -n "$run" ] && [ -f "$run" ]; then
    cp "$run" "$out/flashtune.log.jsonl"
    cp "$(dirname "$run")/report.md" "$out/flashtune.report.md" 2>/dev/null
  else
    echo "bench/run.sh: flashtune printed no run log (exit $rc)" >&2; status=1
  fi
  [ $rc -eq 0 ] || { echo "bench/run.sh: flashtune exited $rc" >&2; status=1; }
fi

if has kernel-tuner; then
  echo "== Kernel Tuner ($(date +%T))"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
    || { echo "bench/run.sh: cannot install .whl/*.whl (run bench/fetch-wheels.sh and carry .whl)" >&2; exit 4; }
  {
    # The translation of the space first: the same valid points, with flashtune's reasons for the others.
    if [ -f "$out/flashtune.log.jsonl" ]; then
      python3 bench/kernel_tuner_attention.py --space "$space" --dry-run --flashtune-log "$out/flashtune.log.jsonl" \
        || echo "WARNING: the Kernel Tuner grid differs from flashtune's planner: the comparison is not like for like"
    fi
    t0=$(now)
    python3 bench/kernel_tuner_attention.py --space "$space" --device "$gpu" --out "$out/kernel_tuner.json" \
      ${kt_limit:+--time-limit "$kt_limit"}
    rc=$?
    t1=$(now)
    echo "kernel_tuner_s=$(awk "BEGIN { print $t1 - $t0 }")" >>"$out/.walls"
    echo "kernel_tuner_attention.py exited $rc"
  } >"$out/kernel_tuner.out" 2>&1
  tail -n 30 "$out/kernel_tuner.out"
  grep -q "exited 0$" "$out/kernel_tuner.out" || status=1
fi

if has compare; then
  walls=()
  if [ -f "$out/.walls" ]; then
    ft_s=$(sed -n 's/^flashtune_s=//p' "$out/.walls" | tail -1)
    kt_s=$(sed -n 's/^kernel_tuner_s=//p' "$out/.walls" | tail -1)
    [ -n "$ft_s" ] && [ -n "$kt_s" ] && walls=(--wall-flashtune "$ft_s" --wall-kernel-tuner "$kt_s")
  fi
  if [ -f "$out/flashtune.log.jsonl" ] && [ -f "$out/kernel_tuner.json" ]; then
    python3 bench/compare.py "$out/flashtune.log.jsonl" "$out/kernel_tuner.json" "${walls[@]}" --out "$out/comparison.md" || status=1
    grep -q "^WARNING: the Kernel Tuner grid differs" "$out/kernel_tuner.out" 2>/dev/null \
      && printf '\n**WARNING: the Kernel Tuner grid differed from flashtune'"'"'s planner (see kernel_tuner.out).**\n' >>"$out/comparison.md"
  else
    echo "bench/run.sh: compare needs $out/flashtune.log.jsonl and $out/kernel_tuner.json" >&2; status=1
  fi
fi
rm -rf "$cold"
exit $status
