#!/usr/bin/env bash
# `flashtune step` against an agent that cheats, on a real GPU: a throwaway git repository made
# from this checkout, where step N of the proposer writes cheat N of kernels/attention/faults/cheats.cu
# over forward.cu (steps 8-10: the cheats that know the harness), and step 11 edits the oracle
# through the header it includes. Every step must be rejected with its reason, nothing committed,
# and kernels/ left as HEAD has it. Then HEAD becomes the honest kernel the cheats are built on, and
# two more steps propose the memos (right on every launch, remembering answers by content): each
# must gain nothing (slower, or a gain within the threshold or the noise), and nothing is
# committed. (tests/it/trust.rs runs the same proposers on the test double.)
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
printf 'runs/\n' > .gitignore
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
esac
printf '#define CHEAT CHEAT_%s\n#include "faults/cheats.cu"\n' "$c" > $f
EOF
git init -q && git add -A && git -c user.name=demo -c user.email=demo@example.com commit -qm initial
before=$(git rev-parse HEAD)
"$bin" step --space variants/step-cheats.toml --proposer "sh propose.sh" --steps 11 || true
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
[ "$(grep -c '"event":"step_decided"' "$log")" -eq 11 ] || { echo "FAIL: not 11 verdicts"; ok=0; }
grep '"event":"step_decided"' "$log" | grep '"step":11' | grep -q "the oracle's sources" || { echo "FAIL: the oracle edit was not refused by name"; ok=0; }
cp "$log" "${OUT:-/tmp}/step-cheats.log.jsonl" 2>/dev/null || true

# The memos against the honest kernel they wrap, which becomes HEAD's forward.cu.
printf '#define CHEAT CHEAT_NONE\n#include "faults/cheats.cu"\n' > kernels/attention/forward.cu
cat > propose.sh <<'EOF'
set -e
case "$FLASHTUNE_STEP" in 1) c=MEMO_OUTPUT ;; 2) c=MEMO_SOFTMAX ;; esac
printf '#define CHEAT CHEAT_%s\n#include "faults/cheats.cu"\n' "$c" > kernels/attention/forward.cu
EOF
git add -A && git -c user.name=demo -c user.email=demo@example.com commit -qm "honest cheats kernel as HEAD"
honest=$(git rev-parse HEAD)
before_memos=$(ls -d runs/*/ | sort)
"$bin" step --space variants/step-cheats.toml --proposer "sh propose.sh" --steps 2 || true
memo_log=$(comm -13 <(echo "$before_memos") <(ls -d runs/*/ | sort) | head -1)log.jsonl
echo "== memo step verdicts ($memo_log)"
grep -E '"event":"(step_decided|duel)"' "$memo_log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if r["event"] == "duel":
        a, b = r.get("champion") or {}, r.get("challenger") or {}
        print("  step", r["step"], r["shape"], r["dtype"], "honest", a.get("median_us"), "us, memo", b.get("median_us"), "us")
    else:
        print("step", r["step"], "accepted" if r["accepted"] else "rejected:", r["reason"])'
[ "$(git rev-parse HEAD)" = "$honest" ] || { echo "FAIL: a memo was committed"; ok=0; }
grep '"event":"step_decided"' "$memo_log" | grep -q '"accepted":true' && { echo "FAIL: a memo was accepted"; ok=0; }
[ "$(grep -c '"event":"step_decided"' "$memo_log")" -eq 2 ] || { echo "FAIL: not 2 memo verdicts"; ok=0; }
cp "$memo_log" "${OUT:-/tmp}/step-memos.log.jsonl" 2>/dev/null || true
[ $ok = 1 ] && echo "step-cheats: all 10 cheats and the oracle edit rejected, both memos gained nothing, nothing committed, kernel restored"
[ $ok = 1 ]
