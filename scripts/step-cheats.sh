#!/usr/bin/env bash
# `flashtune step` against an agent that cheats, on a real GPU: a throwaway git repository made
# from this checkout, where step N of the proposer writes cheat N of kernels/attention/faults/cheats.cu
# over forward.cu (steps 8-10: the cheats that know the harness), step 11 edits the oracle through
# the header it includes, and steps 12-13 write KEPT_COPY_REPAIR (repairs the device copies of the
# verified rounds' outputs before they are compared) and FIXED_OFFSET (no running max: wrong once
# scores pass ~11 in f16 while the Q rows look ordinary). Every step must be rejected with its
# reason, nothing committed, and kernels/ left as HEAD has it. Then HEAD becomes the honest kernel
# the cheats are built on, padded by SPIN_PAD_NS (every CTA first waits that long, ~20% on small),
# and three more steps follow: the memos (right on every launch, remembering answers by content,
# with HEAD's pad: judged against exactly the kernel they wrap) must each gain nothing (slower, or a
# gain within the threshold or the noise), and BURSTY (honest, no pad: faster than HEAD on every
# shape but seed, where one launch in three spins, so its median is slower and its spread huge) must
# not be kept for its gains elsewhere; nothing is committed. Steps 14-16 of the first part reach
# past the edit's tree (issue 47): a git-ignored header in kernels/ through __has_include, a file in
# the proposer's scratch folder named by a macro (only nvcc's dependency list sees it), and
# forward.cu replaced by a symbolic link. Last,
# `judge` runs on an honest edit (HEAD's pad removed) while the working tree is swapped for a slower
# copy once the step has started: the commit must hold the edit that was measured. (tests/it/trust.rs
# and tests/it/edit_tree.rs run the same proposers on the test double.)
#
# usage: scripts/step-cheats.sh /path/to/flashtune      (exit 1 when a cheat got through)
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 /path/to/flashtune" >&2; exit 2; }
bin=$(realpath "$1")
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/flashtune-step-cheats.XXXXXX)
mkdir -p "$work/variants"
cp -r "$src/kernels" "$src/policies.toml" "$work/"
cp "$src"/variants/*.toml "$work/variants/"
cd "$work"
printf 'runs/\nkernels/attention/scratch/\n' > .gitignore
# The smoke space's scalar baseline alone, on shapes with a ragged last tile and a causal one.
sed -e 's/MMA = \["scalar", "wmma"\]/MMA = ["scalar"]/' -e 's/KV_SPLIT = \[1, 4\]/KV_SPLIT = [1]/' \
    -e 's/^shapes = .*/shapes = ["small", "seed", "odd-causal", "ragged"]/' variants/smoke.toml > variants/step-cheats.toml
cat > propose.sh <<'EOF'
set -e
f=kernels/attention/forward.cu
case "$FLASHTUNE_STEP" in
  1) c=CACHE_BY_POINTER ;; 2) c=FIRST_LAUNCHES ;; 3) c=READ_PREVIOUS_OUTPUT ;; 4) c=RACE ;;
  5) c=SMALL_MAGNITUDE ;; 6) c=SKIP_LAST_TILE ;; 7) c=WRITE_OUTSIDE ;;
  8) c=REWRITE_ON_RERUN ;; 9) c=HONEST_EARLY ;; 10) c=L2_PROBE ;;
  11) printf '#define ORACLE_SHORTCUT 1\n' >> kernels/oracle/oracle.cuh; printf '\n// tuned\n' >> $f; exit 0 ;;
  12) c=KEPT_COPY_REPAIR ;; 13) c=FIXED_OFFSET ;;
  14) mkdir -p kernels/attention/scratch; printf '// tuned elsewhere\n' > kernels/attention/scratch/x.cuh
      printf '\n#if __has_include("scratch/x.cuh")\n#include "scratch/x.cuh"\n#endif\n' >> $f; exit 0 ;;
  15) h="${TMPDIR:-/tmp}/flashtune-hidden-$$.cuh"; printf '// tuned elsewhere\n' > "$h"
      printf '\n#define FT_HIDDEN "%s"\n#include FT_HIDDEN\n' "$h" >> $f; exit 0 ;;
  16) rm -f $f; ln -s /etc/hostname $f; exit 0 ;;
esac
printf '#define CHEAT CHEAT_%s\n#include "faults/cheats.cu"\n' "$c" > $f
EOF
git init -q && git add -A && git -c user.name=demo -c user.email=demo@example.com commit -qm initial
before=$(git rev-parse HEAD)
"$bin" step --space variants/step-cheats.toml --proposer "sh propose.sh" --steps 16 || true
log=$(ls -d runs/*/ | head -1)log.jsonl
echo "== step verdicts ($log)"
grep '"event":"step_decided"' "$log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("step", r["step"], "accepted" if r["accepted"] else "rejected", r["reason"])'
ok=1
[ "$(git rev-parse HEAD)" = "$before" ] || { echo "FAIL: something was committed"; ok=0; }
git diff --quiet HEAD -- kernels || { echo "FAIL: kernels differ from HEAD"; ok=0; }
grep '"event":"step_decided"' "$log" | grep -q '"accepted":true' && { echo "FAIL: a cheat was accepted"; ok=0; }
[ "$(grep -c '"event":"step_decided"' "$log")" -eq 16 ] || { echo "FAIL: not 16 verdicts"; ok=0; }
grep '"event":"step_decided"' "$log" | grep '"step":11' | grep -q "the oracle's sources" || { echo "FAIL: the oracle edit was not refused by name"; ok=0; }
grep '"event":"step_decided"' "$log" | grep '"step":14' | grep -q "includes files outside its tree" || { echo "FAIL: the ignored include was not refused by name"; ok=0; }
grep '"event":"step_decided"' "$log" | grep '"step":15' | grep -q "reads files outside the tree" || { echo "FAIL: the macro-named include was not refused by name"; ok=0; }
grep '"event":"step_decided"' "$log" | grep '"step":16' | grep -q "is a symbolic link" || { echo "FAIL: the symbolic link was not refused by name"; ok=0; }
cp "$log" "${OUT:-/tmp}/step-cheats.log.jsonl" 2>/dev/null || true

# The memos against the honest kernel they wrap, which becomes HEAD's forward.cu, padded by
# SPIN_PAD_NS: 65 us a launch (every CTA first waits that long), ~20% of the honest kernel on small
# at the smoke space's BLOCK_M 64 (~300 us there; seed ~2420, ragged ~2000, odd-causal ~6050 on an
# H100). The memos carry the same pad; BURSTY none (its numbers: kernels/attention/faults/cheats.cu).
pad=65000
printf '#define SPIN_PAD_NS %s\n#define CHEAT CHEAT_NONE\n#include "faults/cheats.cu"\n' "$pad" > kernels/attention/forward.cu
{
    printf 'set -e\n'
    printf 'case "$FLASHTUNE_STEP" in\n'
    printf "  1) p='#define SPIN_PAD_NS %s' c=MEMO_OUTPUT ;;\n" "$pad"
    printf "  2) p='#define SPIN_PAD_NS %s' c=MEMO_SOFTMAX ;;\n" "$pad"
    printf "  3) p='' c=BURSTY ;;\n"
    printf 'esac\n'
    printf 'printf '"'"'%%s\\n#define CHEAT CHEAT_%%s\\n#include "faults/cheats.cu"\\n'"'"' "$p" "$c" > kernels/attention/forward.cu\n'
} > propose.sh
git add -A && git -c user.name=demo -c user.email=demo@example.com commit -qm "honest cheats kernel, padded, as HEAD"
honest=$(git rev-parse HEAD)
before_memos=$(ls -d runs/*/ | sort)
"$bin" step --space variants/step-cheats.toml --proposer "sh propose.sh" --steps 3 || true
memo_log=$(comm -13 <(echo "$before_memos") <(ls -d runs/*/ | sort) | head -1)log.jsonl
echo "== memo and bursty step verdicts ($memo_log)"
grep -E '"event":"(step_decided|duel)"' "$memo_log" | python3 -c '
import json, sys
def fig(t):
    return "-" if not t else "%.1f us (p10 %.1f, p90 %.1f)" % (t["median_us"], t["p10_us"], t["p90_us"])
for line in sys.stdin:
    r = json.loads(line)
    if r["event"] == "duel":
        edit = "bursty" if r["step"] == 3 else "memo"
        print("  step", r["step"], r["shape"], r["dtype"], "HEAD", fig(r.get("champion")) + ",", edit, fig(r.get("challenger")))
    else:
        print("step", r["step"], "accepted" if r["accepted"] else "rejected:", r["reason"])'
[ "$(git rev-parse HEAD)" = "$honest" ] || { echo "FAIL: a memo or the bursty edit was committed"; ok=0; }
grep '"event":"step_decided"' "$memo_log" | grep -E '"step":(1|2),' | grep -q '"accepted":true' && { echo "FAIL: a memo was accepted"; ok=0; }
grep '"event":"step_decided"' "$memo_log" | grep '"step":3,' | grep -q '"accepted":true' && { echo "FAIL: the bursty edit was accepted: its own spread hid its regression on seed"; ok=0; }
[ "$(grep -c '"event":"step_decided"' "$memo_log")" -eq 3 ] || { echo "FAIL: not 3 memo and bursty verdicts"; ok=0; }
cp "$memo_log" "${OUT:-/tmp}/step-memos.log.jsonl" 2>/dev/null || true

# A swap after the snapshot: `judge` measures HEAD's kernel without its pad (faster on every shape);
# once its step has started, the working tree takes a copy padded twice. The commit, if any, must
# hold the unpadded edit that was measured.
printf '#define SPIN_PAD_NS 0\n#define CHEAT CHEAT_NONE\n#include "faults/cheats.cu"\n' > kernels/attention/forward.cu
measured=$(cat kernels/attention/forward.cu)
before_swap=$(ls -d runs/*/ | sort)
"$bin" judge --space variants/step-cheats.toml > judge-swap.out 2>&1 &
judge=$!
for _ in $(seq 1 6000); do
    swap_run=$(comm -13 <(echo "$before_swap") <(ls -d runs/*/ | sort) | head -1)
    [ -n "$swap_run" ] && grep -q '"event":"step_started"' "${swap_run}log.jsonl" 2>/dev/null && break
    sleep 0.05
done
printf '#define SPIN_PAD_NS %s\n#define CHEAT CHEAT_NONE\n#include "faults/cheats.cu"\n' $((2 * pad)) > kernels/attention/forward.cu
wait $judge || true
echo "== judge with a swap after the snapshot (${swap_run}log.jsonl)"
tail -3 judge-swap.out
if [ "$(git rev-parse HEAD)" != "$honest" ]; then
    [ "$(git show HEAD:kernels/attention/forward.cu)" = "$measured" ] && echo "committed: the measured edit" || { echo "FAIL: the commit holds the swapped file"; ok=0; }
else
    echo "nothing committed (the unpadded edit was not judged faster)"
fi
cp "${swap_run}log.jsonl" "${OUT:-/tmp}/judge-swap.log.jsonl" 2>/dev/null || true
[ $ok = 1 ] && echo "step-cheats: all 12 cheats, the oracle edit and the three edits past the tree rejected, both memos gained nothing, the bursty edit rejected, nothing committed, kernel restored, the swap never committed"
[ $ok = 1 ]
