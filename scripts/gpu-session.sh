#!/usr/bin/env bash
# One batched GPU session; logs packed into $OUT/session.tgz (or runs/session.tgz) after every stage. Stages run in the order given:
#   scripts/gpu-session.sh BIN_DIR doctor smoke tests faults cheats quick resume resume-mid hopper attention ablation ablate profile guided step-demo gpus gpus-cold stored-baselines space:variants/NAME.toml
#                          ncu-extra profile:NAME:VARIANT:SHAPES[:DTYPES] fa4-ncu:SHAPE:DTYPE fa4-sass:SHAPE:DTYPE
# BIN_DIR holds `flashtune` (and `flashtune-tests`, the integration-test binary tests/it, for the `tests` stage).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$1; shift
# Logs gather in one folder, packed into $OUT/session.tgz at the end (the device returns few files).
out=$(mktemp -d)/session
mkdir -p "$out"
pack() { tar czf "${OUT:-runs}/session.tgz.part" -C "$(dirname "$out")" session && mv "${OUT:-runs}/session.tgz.part" "${OUT:-runs}/session.tgz"; }
trap pack EXIT
export PATH=/usr/local/cuda/bin:$PATH
ft() { "$bin/flashtune" "$@"; }
# Keep a run's log and report under $OUT (two folders deep at most).
keep() { local name=$1 run; run=$(sed -n 's/^Run log: //p' "$out/$name.txt" | tail -1); [ -n "$run" ] && cp "$run" "$out/$name.log.jsonl" && cp "$(dirname "$run")/report.md" "$out/$name.report.md" && { cp "$(dirname "$run")/report.html" "$out/$name.report.html" 2>/dev/null; true; }; }
# Wall seconds of a command, appended to $out/walls.txt.
timed() { local name=$1 t0; shift; t0=$(date +%s.%N); "$@"; local rc=$?; echo "$name $(awk "BEGIN{print $(date +%s.%N) - $t0}") s (exit $rc)" | tee -a "$out/walls.txt"; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv | tee "$out/nvidia-smi.txt"
for stage in "$@"; do
  echo "== $stage $(date +%T)"
  case $stage in
    doctor) ft doctor 2>&1 | tee "$out/doctor.txt" ;;
    smoke) ft tune --space variants/smoke.toml 2>"$out/smoke.err" | tee "$out/smoke.txt"; keep smoke ;;
    tests)
      FLASHTUNE_BIN="$PWD/$bin/flashtune" FLASHTUNE_REPO="$PWD" "$bin/flashtune-tests" --include-ignored gpu:: step::gpu_ 2>&1 | tee "$out/gpu-tests.txt" ;;
    faults) ft tune --space variants/faults.toml 2>"$out/faults.err" | tee "$out/faults.txt"; keep faults ;;
    cheats) ft tune --space variants/cheats.toml 2>"$out/cheats.err" | tee "$out/cheats.txt"; keep cheats ;;
    quick) ft tune 2>"$out/quick.err" | tee "$out/quick.txt"; keep quick ;;
    resume)
      # SIGKILL the orchestrator once two variants of a new run are done, then resume it.
      before=$(ls -d runs/2*/ 2>/dev/null)
      "$bin/flashtune" tune --space variants/smoke.toml >"$out/killed.txt" 2>&1 & pid=$!
      log=
      for _ in $(seq 600); do
        sleep 0.1
        new=$(comm -13 <(echo "$before") <(ls -d runs/2*/ 2>/dev/null) | head -1)
        [ -n "$new" ] && [ "$(grep -c '"event":"variant_done"' "${new}log.jsonl" 2>/dev/null)" -ge 2 ] && { log=${new}log.jsonl; break; }
      done
      kill -9 $pid; wait $pid 2>/dev/null
      echo "killed after $(grep -c '"event":"variant_done"' "$log") finished variants ($log)"
      cp "$log" "$out/killed.log.jsonl"
      ft resume "$(dirname "$log")" 2>"$out/resume.err" | tee "$out/resume.txt"; keep resume ;;
    resume-mid)
      # SIGKILL the orchestrator in the middle of its third variant (three of its cases answered),
      # then resume it: the answered cases are kept, only the rest of that variant is measured.
      before=$(ls -d runs/2*/ 2>/dev/null)
      "$bin/flashtune" tune --space variants/smoke.toml >"$out/killed-mid.txt" 2>&1 & pid=$!
      log=
      for _ in $(seq 1200); do
        sleep 0.05
        new=$(comm -13 <(echo "$before") <(ls -d runs/2*/ 2>/dev/null) | head -1)
        [ -n "$new" ] || continue
        done_n=$(grep -c '"event":"variant_done"' "${new}log.jsonl" 2>/dev/null)
        answered=$(grep -cE '"event":"(timed|check_failed|implausible)"' "${new}log.jsonl" 2>/dev/null)
        [ "$done_n" -ge 2 ] && [ $((answered - 14 * done_n)) -ge 3 ] && { log=${new}log.jsonl; break; }
      done
      kill -9 $pid; wait $pid 2>/dev/null
      echo "killed after $(grep -c '"event":"variant_done"' "$log") finished variants and $(grep -cE '"event":"(timed|check_failed|implausible)"' "$log") answered cases ($log)"
      cp "$log" "$out/killed-mid.log.jsonl"
      ft resume "$(dirname "$log")" 2>"$out/resume-mid.err" | tee "$out/resume-mid.txt"; keep resume-mid ;;
    # The Hopper path (wgmma, sm_90a) beside the mma.sync champions, PyTorch's backends beside both.
    hopper) timed hopper ft tune --space variants/hopper.toml ${HOPPER_TIME_LIMIT:+--time-limit $HOPPER_TIME_LIMIT} 2>"$out/hopper.err" | tee "$out/hopper.txt"; keep hopper ;;
    attention) timed attention ft tune --space variants/attention.toml ${ATTN_TIME_LIMIT:+--time-limit $ATTN_TIME_LIMIT} 2>"$out/attention.err" | tee "$out/attention.txt"; keep attention ;;
    attention-resume) ft resume "$(ls -td runs/2*/ | head -1)" 2>"$out/attention-resume.err" | tee "$out/attention.txt"; keep attention ;;
    guided) ft tune --space variants/guided.toml --strategy guided ${GUIDED_TIME_LIMIT:+--time-limit $GUIDED_TIME_LIMIT} 2>"$out/guided.err" | tee "$out/guided.txt"; keep guided ;;
    guided-resume) ft resume "$(sed -n 's/^Run log: //p' "$out/guided.txt" | tail -1 | xargs dirname)" 2>"$out/guided-resume.err" | tee "$out/guided-resume.txt"; keep guided-resume ;;
    ablate)
      # Report the ablation run again (as a person would next morning), then ablate around its champion.
      run=$(dirname "$(sed -n 's/^Run log: //p' "$out/ablation.txt" | tail -1)")
      ft report "$run" > "$out/ablation-report.txt" 2>&1; cp "$run"/report.* "$out/" 2>/dev/null
      ft ablate "$run" 2>"$out/ablate.err" | tee "$out/ablate.txt"; keep ablate ;;
    profile)
      # On demand: the ablation run's last step on two shapes.
      run=$(dirname "$(sed -n 's/^Run log: //p' "$out/ablation.txt" | tail -1)")
      ft profile "$run" mma-bm64-bn64-w4-auto-s1 --shape seed,decode-128 2>&1 | tee "$out/profile.txt" ;;
    # Best of 3 scripted proposers (faster, slower, cheat) in an agent session; its own tarball under $OUT.
    agent-demo) timed agent-demo bash scripts/agent-gpu-demo.sh "$PWD/$bin/flashtune" 2>&1 | tee "$out/agent-demo.txt" ;;
    step-demo) bash scripts/step-demo.sh "$PWD/$bin/flashtune" 2>&1 | tee "$out/step-demo.txt" ;;
    fresh)
      # The README's first run, from a fresh clone of the committed tree (no cargo here: the binary built from it).
      # (The device's copy of the tree carries a .git of its own that may lag behind: copy the files instead.)
      rm -rf /tmp/fresh && mkdir -p /tmp/fresh/target/release && tar -c --exclude=./.git --exclude=./target --exclude=./runs --exclude=./.tools --exclude=./.whl --exclude=./.device . | tar -x -C /tmp/fresh && cp "$bin/flashtune" /tmp/fresh/target/release/ && (cd /tmp/fresh && git init -q && git add -A && git -c user.name=fresh -c user.email=fresh@example.com commit -qm fresh)
      (cd /tmp/fresh && timed fresh-tune target/release/flashtune tune 2>"$out/fresh.err" | tee "$out/fresh.txt")
      run=$(sed -n 's/^Run log: //p' "$out/fresh.txt" | tail -1); [ -n "$run" ] && cp "/tmp/fresh/$run" "$out/fresh.log.jsonl" && cp "/tmp/fresh/$(dirname "$run")"/report.{md,html} "$out/" ;;
    sigterm)
      # SIGTERM the quick space mid-run (as systemd, Slurm or timeout would), then resume it.
      before=$(ls -d runs/2*/ 2>/dev/null)
      "$bin/flashtune" tune >"$out/sigterm.txt" 2>"$out/sigterm.err" & pid=$!
      log=
      for _ in $(seq 1200); do
        sleep 0.1
        new=$(comm -13 <(echo "$before") <(ls -d runs/2*/ 2>/dev/null) | head -1)
        [ -n "$new" ] && [ "$(grep -c '"event":"variant_done"' "${new}log.jsonl" 2>/dev/null)" -ge 2 ] && { log=${new}log.jsonl; break; }
      done
      kill -TERM $pid; wait $pid; echo "tune exited $? after SIGTERM" | tee -a "$out/sigterm.txt"
      cp "$log" "$out/sigterm.log.jsonl"
      ps -eo pid,ppid,cmd | grep -E "flashtune|nvcc|ptxas|ncu" | grep -v grep | tee "$out/sigterm-leftovers.txt"
      timed sigterm-resume ft resume "$(dirname "$log")" 2>"$out/sigterm-resume.err" | tee "$out/sigterm-resume.txt"; keep sigterm-resume ;;
    step-cheats) bash scripts/step-cheats.sh "$PWD/$bin/flashtune" 2>&1 | tee "$out/step-cheats.txt" ;;
    budget) timed budget ft tune --space variants/attention.toml --time-limit "${BUDGET:-3m}" 2>"$out/budget.err" | tee "$out/budget.txt"; keep budget ;;
    reuse) timed reuse ft tune --space variants/attention.toml --reuse 2>"$out/reuse.err" | tee "$out/reuse.txt"; keep reuse ;;
    gpus-cold)
      # Each GPU set of GPU_SETS from a build cache of its own, empty (cold), one after another in one
      # call; GPUS_FLAGS is added to each (e.g. --fresh-baselines, so no run takes PyTorch from another).
      for set in ${GPU_SETS:-0 0,1}; do
        FLASHTUNE_CACHE_DIR=$(mktemp -d) timed "gpus-$set" ft tune --space "${GPUS_SPACE:-variants/hopper.toml}" --gpus "$set" ${GPUS_FLAGS:-} 2>"$out/gpus-$set.err" | tee "$out/gpus-$set.txt"; keep "gpus-$set"
      done ;;
    stored-baselines)
      # The reference library from the results store (issue 50): the quick space from a fresh store
      # (PyTorch timed), again (taken from the store), again with --fresh-baselines (timed: the warm
      # "before"); then the Hopper space twice (its shapes that quick has taken, the rest timed; then all taken).
      for run in quick-first:"" quick-stored:"" quick-fresh:--fresh-baselines; do
        name=${run%%:*}; flags=${run#*:}
        timed "$name" ft tune $flags 2>"$out/$name.err" | tee "$out/$name.txt"; keep "$name"
      done
      for name in hopper-first hopper-stored; do
        timed "$name" ft tune --space variants/hopper.toml 2>"$out/$name.err" | tee "$out/$name.txt"; keep "$name"
      done ;;
    gpus) timed "gpus-$GPUS" ft tune --space "${GPUS_SPACE:-variants/quick.toml}" --gpus "$GPUS" 2>"$out/gpus-$GPUS.err" | tee "$out/gpus-$GPUS.txt"; keep "gpus-$GPUS" ;;
    alignment) python3 scripts/causal-alignment.py 2>&1 | tee "$out/alignment.txt" ;;
    # More ncu metrics for every later profile of this session: the pipes (MUFU is "xu"), issue
    # slots, the SM clock and the stall reasons, those this GPU's ncu knows, appended to this copy's
    # policies.toml (the list it reads; never committed from here).
    ncu-extra)
      known=$(ncu --query-metrics --chip gh100 2>/dev/null | awk '{print $1}')
      extra=()
      for m in smsp__inst_executed.sum sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active \
               sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active \
               smsp__issue_active.avg.pct_of_peak_sustained_active sm__cycles_elapsed.avg.per_second \
               smsp__warps_issue_stalled_math_pipe_throttle.avg.per_cycle_active smsp__warps_issue_stalled_wait.avg.per_cycle_active \
               smsp__warps_issue_stalled_barrier.avg.per_cycle_active smsp__warps_issue_stalled_long_scoreboard.avg.per_cycle_active \
               smsp__warps_issue_stalled_short_scoreboard.avg.per_cycle_active smsp__warps_issue_stalled_dispatch_stall.avg.per_cycle_active \
               smsp__warps_issue_stalled_mio_throttle.avg.per_cycle_active smsp__warps_issue_stalled_not_selected.avg.per_cycle_active \
               smsp__warps_issue_stalled_selected.avg.per_cycle_active smsp__warps_issue_stalled_sleeping.avg.per_cycle_active \
               smsp__warps_issue_stalled_membar.avg.per_cycle_active smsp__warps_issue_stalled_branch_resolving.avg.per_cycle_active; do
        grep -qx "${m%%.*}" <<<"$known" && extra+=("\"$m\"") || echo "ncu-extra: this ncu has no ${m%%.*}" | tee -a "$out/ncu-extra.txt"
      done
      [ ${#extra[@]} -gt 0 ] && python3 - "${extra[@]}" <<'PY'
import re, sys
p = "policies.toml"
s = open(p).read()
s = re.sub(r'(\nmetrics = \[\n)', lambda m: m.group(1) + "".join(f"  {x},\n" for x in sys.argv[1:]), s, count=1)
open(p, "w").write(s)
PY
      grep -n -A40 '^metrics = \[' policies.toml | head -45 | tee -a "$out/ncu-extra.txt" ;;
    # profile:NAME:VARIANT:SHAPES[:DTYPES] profiles a variant of the run kept under NAME (a space: stage before).
    profile:*)
      IFS=: read -r _ name variant shapes dtypes <<<"$stage"
      run=$(dirname "$(sed -n 's/^Run log: //p' "$out/$name.txt" | tail -1)")
      timed "profile-$variant" ft profile "$run" "$variant" --shape "$shapes" ${dtypes:+--dtype "$dtypes"} 2>&1 | tail -5 | tee -a "$out/profiles.txt"
      # The profile joined the run's log after its report was written: rebuild the report from the
      # log, so the kept pair is what tests/it/measurements.rs rebuilds.
      cp "$run/log.jsonl" "$out/$name.log.jsonl"
      ft report "$run" >/dev/null && cp "$run/report.md" "$out/$name.report.md" ;;
    # FlashAttention-4 under Nsight Compute on one policy shape, with the metrics flashtune's own
    # profiles read (ncu-extra's too, when it ran before): fa4-ncu:SHAPE:DTYPE.
    fa4-ncu:*)
      IFS=: read -r _ shape dtype <<<"$stage"
      timed "fa4-ncu-$shape-$dtype" ncu --nvtx --nvtx-include "fa4/" --csv --metrics "$(python3 scripts/profile-fa4.py --metrics)" \
        python3 scripts/profile-fa4.py "$shape" "$dtype" >"$out/fa4-ncu-$shape-$dtype.csv" 2>"$out/fa4-ncu-$shape-$dtype.err" ;;
    # FA4's own machine code for one shape: the CuTe DSL keeps the PTX and cubin it compiles (a
    # fresh machine has no kernel cache, so the first call compiles); cuobjdump -sass here or
    # on the way home reads them beside ours: fa4-sass:SHAPE:DTYPE.
    fa4-sass:*)
      IFS=: read -r _ shape dtype <<<"$stage"
      mkdir -p "$out/fa4-sass-$shape-$dtype"
      CUTE_DSL_KEEP=ptx,cubin CUTE_DSL_DUMP_DIR="$out/fa4-sass-$shape-$dtype" timed "fa4-sass-$shape-$dtype" \
        python3 scripts/profile-fa4.py "$shape" "$dtype" 2>"$out/fa4-sass-$shape-$dtype.err" ;;
    # Any space file: space:variants/NAME.toml keeps its log and report under NAME.
    space:*) name=$(basename "${stage#space:}" .toml); timed "$name" ft tune --space "${stage#space:}" 2>"$out/$name.err" | tee "$out/$name.txt"; keep "$name" ;;
    ablation) ft tune --space variants/ablation.toml ${ABLATION_MAX:+--max-variants $ABLATION_MAX} 2>"$out/ablation.err" | tee "$out/ablation.txt"; keep ablation ;;
  esac
  # Packed after every stage too: a call killed at the device's time limit runs no EXIT trap, and
  # keeps what is under $OUT.
  pack
done
