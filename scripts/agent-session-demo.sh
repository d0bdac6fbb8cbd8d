#!/usr/bin/env bash
# An agent session of 3 steps x 3 candidates with scripted proposers, in a throwaway repository made
# from this checkout, in ONE device call; everything an issue asks to see goes into one folder.
#
#   1. `flashtune tune` at HEAD on a small space, so the first step's context pack has HEAD's figures
#      (one source-hash rule: the tune's figures are the pack's), and its champion's profile.
#   2. `flashtune step --candidates 3 --steps 3` with scripted proposers, each ending its output with
#      an `IDEA:` line (the history's one-line summary of what it tried):
#        candidate 1 "faster":    takes out one of the two deliberate __nanosleep(2000) of the
#                                 committed baseline per step (none left at step 3);
#        candidate 2 "cheat":     a kernel of the adversarial suite over forward.cu
#                                 (cache_by_pointer, read_previous_output, race);
#        candidate 3 "near miss": a comment-only edit, as fast as HEAD, rejected as not faster but
#                                 archived as worth another try; from step 2 on this last candidate
#                                 starts from the best near miss not yet tried (the pack's island).
#   3. The context pack of step 1 (AGENTS.md, PROMPT.md, cases.json, ideas.json), the history with
#      every attempt's idea and patch (`flashtune history --json`, `flashtune show-attempt ID`),
#      the ledger and summary, step reports, the run logs and the git log: OUT_DIR (below).
#
# Checks (exit 1 if one fails): HEAD's figures and a named bottleneck in the first pack; an idea and
# a patch for every attempt that changed a file; no cheat accepted; nothing left uncommitted; no
# worktree left behind.
#
# usage: scripts/agent-session-demo.sh /path/to/flashtune [OUT_DIR] [--fake-gpu]
#   OUT_DIR (default $OUT) receives plain files: first-pack/ (AGENTS.md, PROMPT.md, context/),
#   context-after.md (`flashtune context` at the session's end), history.md/.json, attempts.txt and
#   attempts/*.patch, run/ (summary.md, ledger.json, step reports, log.jsonl), session.err, tune.out,
#   git-log.txt. --fake-gpu (or FLASHTUNE_DEMO_FAKE=1) rehearses it on the test double (synthetic
#   figures; accepted edits go to refs/flashtune/fake/<run>/step-<n>; the faster candidate also
#   scales the double's time marker, since the double cannot see the sleeps). On a GPU, run it without.
set -euo pipefail
usage() { echo "usage: $0 /path/to/flashtune [OUT_DIR] [--fake-gpu]" >&2; exit 2; }
[ $# -ge 1 ] || usage
bin=$(realpath "$1"); shift
[ -x "$bin" ] || { echo "$bin is not an executable" >&2; exit 2; }
fake=
[ -n "${FLASHTUNE_DEMO_FAKE:-}" ] && fake=--fake-gpu
dest=${OUT:-}
for a in "$@"; do
  case "$a" in
    --fake-gpu) fake=--fake-gpu ;;
    -*) echo "unknown option $a" >&2; usage ;;
    *) dest=$a ;;
  esac
done
[ -n "$dest" ] || { echo "no output folder: give OUT_DIR or set OUT" >&2; usage; }
mkdir -p "$dest"
dest=$(realpath "$dest")
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/flashtune-session-demo.XXXXXX)
# What the demo writes goes beside the project, never into it: a session refuses untracked files.
aux=$dest
echo "== demo project: $work ${fake:+(fake GPU)}; outputs: $dest"
mkdir -p "$work/variants"
cp -r "$src/kernels" "$src/policies.toml" "$work/"
cp "$src"/variants/*.toml "$work/variants/"
cd "$work"
printf 'runs/\n' > .gitignore
# The smoke space's scalar baseline on four shapes (a ragged last tile, a causal one), f16 only.
sed -e 's/MMA = \["scalar", "wmma"\]/MMA = ["scalar"]/' -e 's/KV_SPLIT = \[1, 4\]/KV_SPLIT = [1]/' \
    -e 's/^shapes = .*/shapes = ["small", "seed", "odd-causal", "ragged"]/' variants/smoke.toml > variants/agent-demo.toml
sed -i 's/^dtypes = \["f16", "bf16"\]/dtypes = ["f16"]/' policies.toml
grep -q '^dtypes = \["f16"\]' policies.toml || { echo "policies.toml's dtypes line moved" >&2; exit 1; }
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
  1) if grep -q "pessimization $FLASHTUNE_STEP\$" $f; then
       sed -i "/pessimization $FLASHTUNE_STEP\$/d" $f
       if [ -n "${DEMO_FAKE:-}" ]; then
         # The double times a cubin by its `flashtune-fake: time xS` marker; one marker, rescaled.
         s=$(awk "BEGIN { printf \"%.2f\", 0.8 ^ $FLASHTUNE_STEP }")
         sed -i '/flashtune_fake_demo/d' $f
         printf '__device__ char flashtune_fake_demo[] = "flashtune-fake: time x%s";\n' "$s" >> $f
       fi
       echo "IDEA: remove pessimization $FLASHTUNE_STEP, a __nanosleep(2000) per K/V tile in the main loop"
     else
       echo "IDEA: nothing left to remove; no edit"
     fi ;;
  2) case "$FLASHTUNE_STEP" in 1) c=CACHE_BY_POINTER ;; 2) c=READ_PREVIOUS_OUTPUT ;; *) c=RACE ;; esac
     printf '#define CHEAT CHEAT_%s\n#include "faults/cheats.cu"\n' "$c" > $f
     # The double cannot run the cheat's code; its marker tells it which cheat to play.
     [ -z "${DEMO_FAKE:-}" ] || printf '__device__ char flashtune_fake_cheat[] = "flashtune-fake: cheat CHEAT_%s";\n' "$c" >> $f
     echo "IDEA: cheat $c from the adversarial suite (must be rejected)" ;;
  3) if grep -q 'near miss: same code' $f; then
       echo "IDEA: start from the archived near miss and keep it (same code, a second try)"
     else
       # At the top, so its patch still applies once later steps have changed the file's end.
       sed -i "1i // near miss: same code, a comment (step $FLASHTUNE_STEP)" $f
       echo "IDEA: a comment-only edit, as fast as HEAD: a near miss for the archive"
     fi ;;
esac
EOF
git() { command git -c user.name="flashtune demo" -c user.email=demo@localhost "$@"; }
git init -q
git add -A
git commit -qm "demo baseline: two deliberate __nanosleep(2000) per K/V tile"
fail=0
echo "== tune at HEAD (figures and a profile for the first pack)"
"$bin" --root "$work" tune --space variants/agent-demo.toml $fake > $aux/tune.out 2>&1 || { tail -30 $aux/tune.out; fail=1; }
tail -4 $aux/tune.out
echo "== the session: 3 steps x 3 candidates"
DEMO_FAKE=${fake:+1} "$bin" --root "$work" step --space variants/agent-demo.toml $fake \
  --candidates 3 --proposer "sh $work/propose.sh" --steps 3 > $aux/session.out 2> $aux/session.err || fail=1
cat $aux/session.err
run=$(dirname "$(ls runs/*/ledger.json | head -1)")
log="$run/log.jsonl"
pack="$run/step-1/pack"
echo "== first pack: AGENTS.md"
cat "$pack/AGENTS.md"
echo "== first pack: PROMPT.md (the context summary)"
cat "$pack/PROMPT.md"
"$bin" --root "$work" history --json > $aux/history.json
"$bin" --root "$work" history > $aux/history.md
echo "== history"
cat $aux/history.md
mkdir -p "$aux/attempts"
python3 - "$bin" "$work" "$aux" <<'PY' > $aux/attempts.txt
import json, subprocess, sys
bin, root = sys.argv[1], sys.argv[2]
for h in json.load(open(sys.argv[3] + "/history.json"))["steps"]:
    idea = (h["idea"] or {}).get("summary", "")
    print(f'{h["attempt"]}\t{h["verdict"]}\t{h["diff_stat"]}\t{idea}\t{h["start_from"] or ""}')
    if h["files"]:
        out = subprocess.run([bin, "--root", root, "show-attempt", h["attempt"]], capture_output=True, text=True)
        open(sys.argv[3] + "/attempts/" + h["attempt"].replace("/", "_") + ".patch", "w").write(out.stdout)
PY
echo "== attempts (id, verdict, diff, idea, started from)"
cat $aux/attempts.txt
echo "== ledger and summary"
cat "$run/summary.md"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: v for k, v in d.items() if k != "rows"})); [print(json.dumps(r)) for r in d["rows"]]' "$run/ledger.json"
echo "== git log"
git log --format='--- %h %s' | head
command git for-each-ref --format='%(refname) %(objectname:short) %(subject)' refs/flashtune/
# The checks.
if grep -q 'HEAD unknown (no log holds it)' "$pack/PROMPT.md" || ! grep -q '^| small ' "$pack/PROMPT.md"; then
  echo "FAIL: the first pack lacks HEAD's figures" >&2; fail=1
fi
grep -q 'speed of light: ' "$pack/PROMPT.md" || { echo "FAIL: no speed of light in the first pack" >&2; fail=1; }
grep -q 'other kernel sources' "$pack/PROMPT.md" && { echo "FAIL: the profile is of other sources" >&2; fail=1; }
python3 - "$aux" <<'PY' || fail=1
import json, os, sys
aux = sys.argv[1]
bad = []
for h in json.load(open(aux + "/history.json"))["steps"]:
    if not h["files"]:
        continue
    if not h["idea"]:
        bad.append(h["attempt"] + ": no idea")
    p = aux + "/attempts/" + h["attempt"].replace("/", "_") + ".patch"
    if not (os.path.exists(p) and os.path.getsize(p) > 0):
        bad.append(h["attempt"] + ": no patch")
    if h["candidate"] == 2 and h["verdict"] in ("accepted", "committed"):
        bad.append(h["attempt"] + ": a cheat was accepted")
if bad:
    print("FAIL: " + "; ".join(bad), file=sys.stderr)
    sys.exit(1)
PY
git diff --quiet HEAD -- kernels || { echo "FAIL: kernels differ from HEAD" >&2; fail=1; }
[ "$(command git worktree list | wc -l)" = 1 ] || { echo "FAIL: a candidate worktree was left" >&2; fail=1; }
mkdir -p "$dest/first-pack" "$dest/run"
cp "$pack/AGENTS.md" "$pack/PROMPT.md" "$dest/first-pack/"
cp -r "$pack/context" "$dest/first-pack/"
"$bin" --root "$work" context --space variants/agent-demo.toml > "$dest/context-after.md" 2>&1 || true
cp "$log" "$run"/*.md "$run"/ledger.json "$dest/run/"
cp -r "$run/attempts" "$dest/run/" 2>/dev/null || true
tune_run=$(sed -n 's|^Run log: \(.*\)/log.jsonl$|\1|p' $aux/tune.out | tail -1)
if [ -n "$tune_run" ]; then
  cp "$tune_run/log.jsonl" "$dest/tune-log.jsonl"
  cp "$tune_run/report.md" "$dest/tune-report.md" 2>/dev/null || true
fi
{ git log --format='--- %H %s%n%b'; command git for-each-ref --format='%(refname) %(objectname)' refs/flashtune/; } > "$dest/git-log.txt"
echo "== wrote $dest"
[ $fail = 0 ] && echo "== all checks passed" || echo "== some checks FAILED" >&2
exit $fail
