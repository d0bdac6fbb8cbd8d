#!/usr/bin/env bash
# `flashtune step` on a real GPU, twice, in a throwaway git repository made from this checkout:
#   (i)  an edit that slows the forward kernel down (a __nanosleep in the main K/V loop; the
#        answers stay right) must be rejected and forward.cu restored to HEAD;
#   (ii) an edit that speeds it up must be committed with its trailers. To have a speed-up that is
#        certain on any GPU, the demo first commits a DELIBERATELY PESSIMIZED baseline (the same
#        __nanosleep, committed as "pessimized baseline"), and the edit removes it. This shows the
#        commit path on real timings; it is not a kernel optimisation anyone should quote.
# Small on purpose: one WMMA variant, three d=64 shapes, both policy dtypes; a few minutes at most.
#
# usage: scripts/step-demo.sh /path/to/flashtune      (nvcc found as flashtune finds it; $OUT gets the logs)
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 /path/to/flashtune" >&2; exit 2; }
bin=$(realpath "$1")
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/flashtune-step-demo.XXXXXX)
echo "== demo project: $work"
mkdir -p "$work/variants"
cp -r "$src/kernels" "$src/policies.toml" "$work/"
cp "$src"/variants/*.toml "$work/variants/"
cd "$work"
printf 'runs/\n' > .gitignore
cat > variants/step-demo.toml <<'EOF'
name = "step-demo"
description = "one WMMA variant on three d=64 shapes, for the flashtune step demo"
constraints = []
shapes = ["seed", "decode", "large-64"]
baseline = { MMA = "wmma", BLOCK_M = 64, BLOCK_N = 64, WARPS = 4, KV_SPLIT = 1, STAGES = 1 }

[symbols]
auto = 0

[family]
forward = "kernels/attention/forward.cu"
forward_entry = "attn_fwd"
combine_entry = "attn_combine"
reference = "kernels/oracle/reference.cu"
reference_entry = "attn_reference"
threads = "WARPS * 32"
rows_per_cta = "BLOCK_M"
kv_rows_per_block = "BLOCK_N"
kv_splits = "KV_SPLIT"
smem_bytes = '(BLOCK_M + 2 * STAGES * BLOCK_N) * (HEAD_DIM + 8) * ELEM_BYTES + BLOCK_M * (BLOCK_N + 4) * 4 + if(MMA == "wmma", BLOCK_M * (BLOCK_N + 8) * ELEM_BYTES + BLOCK_M * 4, 0)'

[params]
MMA = ["wmma"]
BLOCK_M = [64]
BLOCK_N = [64]
WARPS = [4]
KV_SPLIT = [1]
STAGES = [1]
EOF
git() { command git -c user.name="flashtune demo" -c user.email=demo@localhost "$@"; }
git init -q
git add -A
git commit -qm "demo baseline (copy of the checkout)"

fwd=kernels/attention/forward.cu
anchor='        path.step(cur, ctx, blk \* kBlockN);'
grep -q "^$anchor\$" "$fwd" || { echo "forward.cu changed: the main-loop anchor is gone" >&2; exit 1; }
# ~2 µs of sleep per K/V tile per CTA: slower on every shape, the same answers.
slow_down() { sed -i "s|^$anchor\$|        __nanosleep(2000);\n&|" "$fwd"; }
# STEP_DEMO_ARGS=--fake-gpu rehearses the script without a GPU (the fake cannot see the sleep: (ii) then ties).
step() { "$bin" --root "$work" step --space variants/step-demo.toml ${STEP_DEMO_ARGS:-} "$@"; }
fail=0

echo "== (i) a slower edit: expect it rejected and restored"
slow_down
git diff --stat
step || { echo "step (i) failed" >&2; fail=1; }
if git diff --quiet && [ "$(git rev-list --count HEAD)" = 1 ]; then
  echo "ok: forward.cu is back at HEAD, nothing committed"
else
  echo "UNEXPECTED: the slower edit was kept" >&2; fail=1
fi

echo "== (ii) commit a deliberately pessimized baseline, then an edit that removes the pessimization"
slow_down
git commit -qam "pessimized baseline for the demo: __nanosleep(2000) per K/V tile (deliberately slow)"
git checkout -q HEAD~1 -- "$fwd"
git diff --stat
step || { echo "step (ii) failed" >&2; fail=1; }
if git diff --quiet && git log -1 --format=%B | grep -q '^Flashtune-Speedup:'; then
  echo "ok: the faster edit was committed"
else
  echo "UNEXPECTED: the faster edit was not committed" >&2; fail=1
fi

echo "== git log"
git log --format='--- %h %s%n%b'
echo "== step reports"
cat runs/*/report.md
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/step-demo"
  for run in runs/*/; do
    id=$(basename "$run")
    mkdir -p "$OUT/step-demo/$id"
    cp "$run"/log.jsonl "$run"/*.md "$OUT/step-demo/$id/"
  done
  git log --format='--- %H %s%n%b' > "$OUT/step-demo/git-log.txt"
  echo "== logs copied to $OUT/step-demo"
fi
exit $fail
