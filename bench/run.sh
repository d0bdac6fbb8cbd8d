#!/usr/bin/env bash
# flashtune and Kernel Tuner on the same space, shapes and GPU model, within one device call:
#
#   bench/run.sh OUT_DIR [--budget 560] [--space variants/attention.toml] [--gpu 0] [--kt-gpu N]
#                        [--ft-time-limit S] [--kt-time-limit S] [--steps flashtune,kernel-tuner,compare]
#
# Two placements:
#   * side by side (--kt-gpu N, another GPU of the same model and host, e.g. nvidia-h200-x2 with
#     --gpu 0 --kt-gpu 1): both start at once, each bounded by the budget. Every figure the
#     comparison judges by is flashtune's (its timer, on its GPU); Kernel Tuner's GPU only sets its
#     pace. The one placement in which both can run the whole attention space within one call.
#   * one after the other on one GPU (--kt-gpu unset or equal to --gpu): flashtune with --time-limit
#     (default: all but 120 s of the budget), then Kernel Tuner until the budget's end. On an H200 the
#     attention space's flashtune run alone should take about 400 s (2084 cases; an estimate), so in
#     one 10-minute call Kernel Tuner gets about 2 minutes; split the steps over two calls instead
#     (bench/README.md, "Placement and time").
# --budget is the seconds from this script's start to the end of everything (default 560, for a
# 10-minute device call with room for the start and the transfers). Steps can be split over calls
# on one machine (--steps kernel-tuner,compare reuses OUT_DIR's flashtune.log.jsonl.gz).
#
# Needs: target/release/flashtune (or target/release/flashtune.xz, unpacked to /tmp; or FLASHTUNE_BIN),
# nvcc (/usr/local/cuda/bin or PATH), python3 with torch and cupy, the wheels of bench/wheels.txt in
# .whl/ (bench/fetch-wheels.sh). Writes into OUT_DIR, each file under 16 MiB (the device tool's limit):
#   run.out                      this script's progress lines, with times (also on stdout)
#   flashtune.out  flashtune.log.jsonl.gz  flashtune.report.md      its output, run log (gzip), report
#   kernel_tuner.out  kernel_tuner.json.gz                          its output and results (gzip)
#   comparison.md                                                   bench/compare.py's tables
# Both tools start cold: flashtune's build cache and CuPy's kernel cache are fresh empty folders, and
# flashtune times PyTorch again (--fresh-baselines); a results store in runs/ is reported if present.
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: bench/run.sh OUT_DIR [--budget S] [--space F] [--gpu N] [--kt-gpu N] [--ft-time-limit S] [--kt-time-limit S] [--steps a,b,c]}
shift
space=variants/attention.toml
gpu=0
kt_gpu=
budget=560
kt_limit=
ft_limit=
steps=flashtune,kernel-tuner,compare
while [ $# -gt 0 ]; do
  case $1 in
    --space) space=$2; shift 2 ;;
    --gpu) gpu=$2; shift 2 ;;
    --kt-gpu) kt_gpu=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --kt-time-limit) kt_limit=$2; shift 2 ;;
    --ft-time-limit) ft_limit=${2%s}; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "bench/run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
kt_gpu=${kt_gpu:-$gpu}
side_by_side=0
[ "$kt_gpu" != "$gpu" ] && side_by_side=1
mkdir -p "$out"
out=$(cd "$out" && pwd)
t_start=$(date +%s.%N)
has() { case ",$steps," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
left() { awk -v s="$t_start" -v b="$budget" -v n="$(now)" 'BEGIN { printf "%d", s + b - n }'; }
say() { echo "[$(date -u +%T) +$(since "$t_start")s] $*" | tee -a "$out/run.out"; }
touch "$out/run.out"  # appended to: steps split over calls keep one record
status=0
# Seconds kept at the end for the grid check, compare.py and compressing the log.
tail_s=25

export PATH=/usr/local/cuda/bin:$PATH
export PYTHONUNBUFFERED=1
bin=${FLASHTUNE_BIN:-target/release/flashtune}
if [ ! -x "$bin" ] && [ -f "$bin.xz" ]; then
  xz -dc "$bin.xz" >/tmp/flashtune-bench && chmod +x /tmp/flashtune-bench && bin=/tmp/flashtune-bench
fi
cold=$(mktemp -d /tmp/bench-cold.XXXXXX)
export FLASHTUNE_CACHE_DIR=$cold/flashtune-build-cache
export CUPY_CACHE_DIR=$cold/cupy-kernel-cache
placement="one after the other on GPU $gpu"
[ $side_by_side = 1 ] && placement="side by side: flashtune on GPU $gpu, Kernel Tuner on GPU $kt_gpu, started together"
say "bench/run.sh: space $space, $placement, budget ${budget}s, steps $steps, out $out"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1 | tee -a "$out/run.out"
[ -f runs/results.sqlite ] && say "NOTE: runs/results.sqlite exists: flashtune's dispatch order may use its earlier champions (not a cold start)"
ls kernels/*/tuned.toml >/dev/null 2>&1 && say "NOTE: a committed champion table (kernels/*/tuned.toml) orders flashtune's dispatch"

# Kernel Tuner's wheels first (seconds), so that neither tool's clock holds them.
if has kernel-tuner || has compare; then
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  if ! python3 -c "import kernel_tuner" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >>"$out/run.out" 2>&1 \
      || { say "cannot install .whl/*.whl (run bench/fetch-wheels.sh and carry .whl)"; exit 4; }
    say "wheels installed"
  fi
fi

ft_pid= kt_pid= ft_t0= kt_t0=
start_flashtune() {  # $1: --time-limit seconds
  [ -x "$bin" ] || { say "$bin not found (carry target/release/flashtune or its .xz)"; exit 4; }
  say "flashtune tune --space $space --gpus $gpu --fresh-baselines --time-limit ${1}s (cold build cache)"
  ft_t0=$(now)
  "$bin" tune --space "$space" --gpus "$gpu" --fresh-baselines --time-limit "${1}s" >"$out/flashtune.out" 2>&1 &
  ft_pid=$!
  echo "$ft_pid" >"$cold/flashtune.pid"
}
finish_flashtune() {
  wait "$ft_pid"; local rc=$?
  say "wall flashtune_s=$(since "$ft_t0")"
  say "flashtune exited $rc after $(since "$ft_t0") s"
  tail -n 25 "$out/flashtune.out" | sed 's/\r/\n/g' | tail -n 25 | tee -a "$out/run.out"
  local run
  run=$(sed -n 's/^Run log: //p' "$out/flashtune.out" | tail -1)
  if [ -n "$run" ] && [ -f "$run" ]; then
    # Compressed at once (about 40 MB as text; the device tool returns files of at most 16 MiB).
    gzip -n -6 -c "$run" >"$out/flashtune.log.jsonl.gz"
    cp "$(dirname "$run")/report.md" "$out/flashtune.report.md" 2>/dev/null
  else
    say "flashtune printed no run log"; status=1
  fi
  [ $rc -eq 0 ] || status=1
}
start_kernel_tuner() {  # $1: --time-limit seconds
  say "Kernel Tuner on GPU $kt_gpu, --time-limit ${1}s (cold CuPy cache)"
  kt_t0=$(now)
  # Side by side, Kernel Tuner sees its own GPU alone: CuPy or PyTorch would otherwise open a
  # context on GPU 0 too, and flashtune's worker rightly times every case there again as taken
  # "under another process on the GPU" (2026-11-29, the first side-by-side run: 641 of 1166 cases).
  CUDA_VISIBLE_DEVICES=$kt_gpu python3 bench/kernel_tuner_attention.py --space "$space" --device 0 \
    --out "$out/kernel_tuner.json" --time-limit "$1" >"$out/kernel_tuner.out" 2>&1 &
  kt_pid=$!
  echo "$kt_pid" >"$cold/kernel_tuner.pid"
}
finish_kernel_tuner() {
  wait "$kt_pid"; local rc=$?
  say "wall kernel_tuner_s=$(since "$kt_t0")"
  say "Kernel Tuner exited $rc after $(since "$kt_t0") s (3: it did not try every configuration)"
  tail -n 8 "$out/kernel_tuner.out" | tee -a "$out/run.out"
  [ $rc -eq 0 ] || [ $rc -eq 3 ] || status=1
}
alive() { [ -f "$cold/$1.pid" ] && kill -0 "$(cat "$cold/$1.pid")" 2>/dev/null; }
# One line a minute while a tool runs: flashtune's last progress line, Kernel Tuner's last case.
ticker() {
  while sleep 60 </dev/null >/dev/null 2>&1; do
    local ft="" kt=""
    alive flashtune && ft="flashtune: $(tr '\r' '\n' <"$out/flashtune.out" | grep -v '^\s*$' | tail -1 | cut -c1-110)"
    alive kernel_tuner && kt="Kernel Tuner: $(grep -E '^  .* (tried|stopped)' "$out/kernel_tuner.out" 2>/dev/null | tail -1 | cut -c1-110)"
    [ -n "$ft$kt" ] && say "… $ft${ft:+${kt:+ | }}$kt"
  done
}
# Past the budget (less the time kept for the end) a tool still running is stopped: flashtune by
# SIGTERM (it ends the case in flight and writes its reports), Kernel Tuner by SIGTERM (its JSON holds
# every case it finished), each killed 20 s later if still there. Both should have ended by their limits.
watchdog() {
  sleep "$(( $(left) - tail_s + 10 ))" </dev/null >/dev/null 2>&1
  for t in flashtune kernel_tuner; do alive $t && say "watchdog: $t still running past the budget: SIGTERM" && kill -TERM "$(cat "$cold/$t.pid")"; done
  sleep 20 </dev/null >/dev/null 2>&1
  for t in flashtune kernel_tuner; do alive $t && say "watchdog: $t still running: SIGKILL" && kill -KILL "$(cat "$cold/$t.pid")"; done
}
ticker & ticker_pid=$!
watchdog & watchdog_pid=$!

if [ $side_by_side = 1 ]; then
  lim=$(( $(left) - tail_s ))
  has flashtune && start_flashtune "${ft_limit:-$((lim - 15))}"
  has kernel-tuner && start_kernel_tuner "${kt_limit:-$lim}"
  [ -n "$ft_pid" ] && finish_flashtune
  [ -n "$kt_pid" ] && finish_kernel_tuner
else
  if has flashtune; then
    reserve=0; has kernel-tuner && reserve=120  # Kernel Tuner's minimum, when it follows in this call
    start_flashtune "${ft_limit:-$(( $(left) - tail_s - reserve ))}"
    finish_flashtune
  fi
  if has kernel-tuner; then
    lim=${kt_limit:-$(( $(left) - tail_s ))}
    if [ "$lim" -lt 30 ]; then say "only ${lim}s left for Kernel Tuner: not started"; status=1
    else start_kernel_tuner "$lim"; finish_kernel_tuner; fi
  fi
fi
kill "$ticker_pid" "$watchdog_pid" 2>/dev/null; wait "$ticker_pid" "$watchdog_pid" 2>/dev/null

if has compare; then
  log=$out/flashtune.log.jsonl; [ -f "$log" ] || log=$log.gz
  kt=$out/kernel_tuner.json; [ -f "$kt" ] || kt=$kt.gz
  if [ -f "$log" ] && [ -f "$kt" ]; then
    say "the translated grid against flashtune's planned records"
    python3 bench/kernel_tuner_attention.py --space "$space" --dry-run --flashtune-log "$log" >>"$out/kernel_tuner.out" 2>&1
    grid_rc=$?
    tail -n 4 "$out/kernel_tuner.out" | tee -a "$out/run.out"
    walls=()
    ft_s=$(sed -n 's/.* wall flashtune_s=//p' "$out/run.out" | tail -1)
    kt_s=$(sed -n 's/.* wall kernel_tuner_s=//p' "$out/run.out" | tail -1)
    [ -n "$ft_s" ] && [ -n "$kt_s" ] && walls=(--wall-flashtune "$ft_s" --wall-kernel-tuner "$kt_s")
    if [ $side_by_side = 1 ]; then
      clocks="Placement: side by side, flashtune on GPU $gpu and Kernel Tuner on GPU $kt_gpu of one host, started together by bench/run.sh (the wheels installed before)."
    else
      clocks="Placement: one after the other on GPU $gpu, flashtune first; each clock starts with its own tool."
    fi
    python3 bench/compare.py "$log" "$kt" "${walls[@]}" --clocks "$clocks" --out "$out/comparison.md" >/dev/null || status=1
    [ $grid_rc -eq 0 ] || printf '\n**WARNING: the Kernel Tuner grid differed from flashtune'"'"'s planner (see kernel_tuner.out).**\n' >>"$out/comparison.md"
    grep -E '^\*\*' "$out/comparison.md" | tee -a "$out/run.out"
  else
    say "compare needs $log and $kt"; status=1
  fi
fi
# Kernel Tuner's JSON goes back compressed too (about 2 MB as text).
[ -f "$out/kernel_tuner.json" ] && gzip -n -6 -f "$out/kernel_tuner.json"
rm -rf "$cold"
say "done (exit $status); files: $(cd "$out" && ls | tr '\n' ' ')"
exit $status
