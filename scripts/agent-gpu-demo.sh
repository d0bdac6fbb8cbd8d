#!/usr/bin/env bash
# An agent session on a real GPU, in ONE device call: best of 3 candidates per step, 3 steps, with
# scripted proposers in their own git worktrees, in a throwaway repository made from this checkout.
#   candidate 1 "faster": takes out one deliberate pessimization of the baseline per step (the
#                baseline commits two __nanosleep(2000) lines in the main K/V loop, so steps 1 and 2
#                each have one to remove; at step 3 there is none left and it proposes nothing).
#                This shows the commit path on real timings; it is not an optimisation to quote.
#   candidate 2 "slower": adds a third __nanosleep (same answers, slower).
#   candidate 3 "cheat":  writes a kernel of the adversarial suite (kernels/attention/faults/cheats.cu,
#                variants/cheats.toml) over forward.cu: cache_by_pointer, read_previous_output, race.
# Expected: steps 1 and 2 commit candidate 1; every slower and cheating candidate is rejected by name;
# step 3 commits nothing. The step reports, the ledger (ledger.json) and the morning summary
# (summary.md) go into $OUT/agent-gpu-demo.tar.gz with the run log and git log.
#
# usage: scripts/agent-gpu-demo.sh /path/to/flashtune
#        AGENT_DEMO_ARGS=--fake-gpu rehearses it without a GPU (the fake cannot see the sleeps).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 /path/to/flashtune" >&2; exit 2; }
bin=$(realpath "$1")
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/flashtune-agent-demo.XXXXXX)
echo "== demo project: $work"
mkdir -p "$work/variants"
cp -r "$src/kernels" "$src/policies.toml" "$work/"
cp "$src"/variants/*.toml "$work/variants/"
cd "$work"
printf 'runs/\n' > .gitignore
# The smoke space's scalar baseline (the kernel the cheats are built on), on four shapes with a
# ragged last tile and a causal one, as scripts/step-cheats.sh uses.
sed -e 's/MMA = \["scalar", "wmma"\]/MMA = ["scalar"]/' -e 's/KV_SPLIT = \[1, 4\]/KV_SPLIT = [1]/' \
    -e 's/^shapes = .*/shapes = ["small", "seed", "odd-causal", "ragged"]/' variants/smoke.toml > variants/agent-demo.toml
fwd=kernels/attention/forward.cu
anchor='        path.step(cur, ctx, blk \* kBlockN);'
grep -q "^$anchor\$" "$fwd" || { echo "forward.cu changed: the main-loop anchor is gone" >&2; exit 1; }
sed -i "s|^$anchor\$|        __nanosleep(2000);  // pessimization 1\n        __nanosleep(2000);  // pessimization 2\n&|" "$fwd"
cat > propose.sh <<'EOF'
set -e
f=kernels/attention/forward.cu
# Scripted proposers cost nothing: the ledger says so rather than leaving dollars unknown.
echo '{"model": "scripted", "input_tokens": 0, "output_tokens": 0, "usd": 0.0}' > "$FLASHTUNE_USAGE_FILE"
case "$FLASHTUNE_CANDIDATE" in
  1) sed -i "/pessimization $FLASHTUNE_STEP\$/d" $f ;;
  2) sed -i 's|^        path.step(cur, ctx, blk \* kBlockN);$|        __nanosleep(2000);  // slower\n&|' $f ;;
  3) case "$FLASHTUNE_STEP" in 1) c=CACHE_BY_POINTER ;; 2) c=READ_PREVIOUS_OUTPUT ;; *) c=RACE ;; esac
     printf '#define CHEAT CHEAT_%s\n#include "faults/cheats.cu"\n' "$c" > $f ;;
esac
EOF
git() { command git -c user.name="flashtune demo" -c user.email=demo@localhost "$@"; }
git init -q
git add -A
git commit -qm "demo baseline: two deliberate __nanosleep(2000) per K/V tile"
fail=0
"$bin" --root "$work" step --space variants/agent-demo.toml ${AGENT_DEMO_ARGS:-} \
  --candidates 3 --proposer "sh $work/propose.sh" --steps 3 --patience 3 || fail=1
run=$(ls -d runs/*/ | head -1)
log="$run/log.jsonl"
echo "== candidates ($log)"
grep '"event":"candidate_judged"' "$log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("step", r["step"], "candidate", r["candidate"], "accepted" if r["accepted"] else "rejected", "-", r["reason"].splitlines()[0])'
echo "== git log"
git log --format='--- %h %s%n%b'
echo "== step reports, ledger, summary"
cat "$run"/step-*.md "$run/summary.md"
# The checks: no cheat or slower candidate accepted; nothing left uncommitted; no worktree left.
if grep '"event":"candidate_judged"' "$log" | grep '"accepted":true' | grep -qv '"candidate":1,'; then
  echo "FAIL: a slower or cheating candidate was accepted" >&2; fail=1
fi
git diff --quiet HEAD -- kernels || { echo "FAIL: kernels differ from HEAD" >&2; fail=1; }
[ "$(command git worktree list | wc -l)" = 1 ] || { echo "FAIL: a candidate worktree was left" >&2; fail=1; }
if [ -n "${OUT:-}" ]; then
  pack=$(mktemp -d)/agent-gpu-demo
  mkdir -p "$pack"
  cp "$log" "$run"/*.md "$run"/ledger.json "$pack/"
  cp -r "$run"/step-*/pack "$pack/" 2>/dev/null || true
  for d in "$run"/step-*/; do mkdir -p "$pack/$(basename "$d")"; cp -r "$d/pack" "$pack/$(basename "$d")/" 2>/dev/null || true; done
  rm -rf "$pack/pack"
  git log --format='--- %H %s%n%b' > "$pack/git-log.txt"
  tar -czf "$OUT/agent-gpu-demo.tar.gz" -C "$(dirname "$pack")" agent-gpu-demo
  echo "== wrote $OUT/agent-gpu-demo.tar.gz"
fi
exit $fail
