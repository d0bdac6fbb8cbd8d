#!/usr/bin/env bash
# The harness on a GPU before and after a change to it, in one call (issues 39 and 46): the cheat
# space under the new harness (every cheat rejected by name, the honest kernel measured) and under
# the old one (what the old harness let through), scripts/step-cheats.sh with the new binary
# (nothing committed), and the quick and Hopper spaces timed by both harnesses on the same GPU, cold
# build caches, PyTorch and ncu left out of both (the comparison is the harness's own cost).
#   scripts/harness-gpu.sh NEW_BIN OLD_BIN OLD_TREE.tar[.gz] STAGE...
#   stages: cheats cheats-old step quick hopper quick-again hopper-again
# cheats-old runs the old binary on this tree's kernels and spaces (the new cheats included).
# Logs and reports are packed into $OUT/harness.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
new_bin=$(realpath "$1"); old_bin=$(realpath "$2"); old_tar=$(realpath "$3"); shift 3
out=$(mktemp -d)/harness; mkdir -p "$out"
trap 'tar czf "${OUT:-runs}/harness.tgz" -C "$(dirname "$out")" harness' EXIT
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$out/nvidia-smi.txt"
# A tree whose runs time the kernels only: no PyTorch backends, no ncu (both cost the same before and after).
bare() {
  sed -i -e '/^\[baseline\]/,/^\[/ s/^command = .*/command = []/' -e '/^\[profile\]/,/^\[/ s/^enabled = true/enabled = false/' "$1/policies.toml"
}
old=$(mktemp -d)/old; mkdir -p "$old"; tar -xf "$old_tar" -C "$old"; bare "$old"
new=$(mktemp -d)/new; mkdir -p "$new"; git ls-files -z 2>/dev/null | tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$new" || cp -r kernels variants policies.toml scripts baselines "$new/"
[ -f "$new/policies.toml" ] || cp -r kernels variants policies.toml scripts baselines "$new/"
# Untracked files of this checkout (new scripts, new sources) travel too.
git ls-files -z --others --exclude-standard 2>/dev/null | tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$new"
bare "$new"
keep() {
  local name=$1 run; run=$(sed -n 's/^Run log: //p' "$out/$name.txt" | tail -1)
  [ -n "$run" ] || return 0
  case $run in /*) ;; *) run=$2/$run ;; esac
  cp "$run" "$out/$name.log.jsonl"; cp "$(dirname "$run")/report.md" "$out/$name.report.md"
}
timed() { local name=$1 t0; shift; t0=$(date +%s.%N); "$@"; local rc=$?; echo "$name $(awk "BEGIN{print $(date +%s.%N) - $t0}") s (exit $rc)" | tee -a "$out/walls.txt"; return $rc; }
tune_in() { local dir=$1 bin=$2 name=$3; shift 3; (cd "$dir" && "$bin" tune "$@" 2>"$out/$name.err" | tee "$out/$name.txt" | tail -40); keep "$name" "$dir"; }
for stage in "$@"; do
  echo "== $stage $(date +%T)"
  case $stage in
    cheats) timed cheats tune_in "$new" "$new_bin" cheats --space variants/cheats.toml ;;
    cheats-old)
      # The old harness on the new cheats: a copy of the new tree, so both runs see the same kernels.
      cheats_old=$(mktemp -d)/tree; cp -r "$new" "$cheats_old"; rm -rf "$cheats_old/runs"
      timed cheats-old tune_in "$cheats_old" "$old_bin" cheats-old --space variants/cheats.toml ;;
    step) (cd "$new" && timed step-cheats bash scripts/step-cheats.sh "$new_bin" 2>&1 | tail -60 | tee "$out/step-cheats.txt"); cp /tmp/step-*.log.jsonl "$out/" 2>/dev/null ;;
    quick|hopper)
      space=variants/$stage.toml
      rm -rf "$old/runs" "$new/runs"
      timed "$stage-after" tune_in "$new" "$new_bin" "$stage-after" --space "$space"
      timed "$stage-before" tune_in "$old" "$old_bin" "$stage-before" --space "$space" ;;
    quick-again|hopper-again)
      # The other order, into fresh trees: drift and warm caches fall on both sides alike.
      space=variants/${stage%-again}.toml
      rm -rf "$old/runs" "$new/runs"
      timed "$stage-before" tune_in "$old" "$old_bin" "$stage-before" --space "$space"
      timed "$stage-after" tune_in "$new" "$new_bin" "$stage-after" --space "$space" ;;
  esac
done
cat "$out/walls.txt"
