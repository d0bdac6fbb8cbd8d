#!/usr/bin/env bash
# What an interruption leaves behind, tried as a new user would on the test double (no GPU):
#   scripts/interruptions.sh PATH/TO/flashtune
# From a fresh copy of this project (its own git repository), each of `tune`, `step --proposer`
# and `judge` is stopped mid-run with SIGINT, SIGTERM and SIGHUP (and `tune` with SIGKILL too),
# then `flashtune resume` is run on what it left. Each line says the exit code, the log's last
# record, whether the tree is back at HEAD, and what `resume` did.
set -uo pipefail
ft=$(realpath "$1")
src="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d)/project
mkdir -p "$work"
(cd "$src" && git ls-files -z | tar --null -T - -cf -) | tar -xf - -C "$work"
cd "$work"
git init -q && git add -A && git -c user.name=t -c user.email=t@example.com commit -qm start
export FLASHTUNE_FAKE_PACE_MS=200
# The copy has no .tools/ nor runs/: use the project's nvcc (from `flashtune setup`) and its build
# cache, so the copy builds nothing it already built.
if [ -z "${FLASHTUNE_NVCC:-}" ] && [ -x "$src/.tools/cuda/nvidia/cu13/bin/nvcc" ]; then
  export FLASHTUNE_NVCC="$src/.tools/cuda/nvidia/cu13/bin/nvcc"
fi
export FLASHTUNE_CACHE_DIR="${FLASHTUNE_CACHE_DIR:-$src/runs/.build-cache}"
last_event() { tail -1 "$1/log.jsonl" | sed -n 's/.*"event":"\([a-z_]*\)".*/\1/p'; }
# The run folder that appeared since `before=$(runs)` was taken.
runs() { ls -d runs/2*/ 2>/dev/null | sed 's:/$::' | sort; }
newest_run() { comm -13 <(echo "$before") <(runs) | head -1; }
tree_state() { [ -z "$(git status --porcelain --untracked-files=no -- kernels)" ] && echo "tree at HEAD" || echo "tree DIRTY: $(git status --porcelain -- kernels | tr '\n' ' ')"; }
# Wait (up to 60 s) until the newest run's log holds $1.
wait_log() { for _ in $(seq 600); do r=$(newest_run); [ -n "$r" ] && grep -q "$1" "$r/log.jsonl" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
report() { # NAME SIGNAL EXIT RUN: what the stop left, then what `resume` made of it
  local left tree resumed rc
  left=$(last_event "$4"); tree=$(tree_state)
  resumed=$("$ft" resume "$4" --fake-gpu 2>&1 | tail -1); rc=${PIPESTATUS[0]}
  printf '%-5s SIG%-4s exit %-3s left: last record %-11s %s | resume: exit %s, last record %s: "%s"\n' \
    "$1" "$2" "$3" "$left" "$tree" "$rc" "$(last_event "$4")" "$resumed"
}
for sig in INT TERM HUP KILL; do
  before=$(runs)
  "$ft" tune --fake-gpu --space variants/smoke.toml >/dev/null 2>&1 & pid=$!
  wait_log '"event":"timed"'; kill -$sig $pid; wait $pid 2>/dev/null; rc=$?
  report tune $sig $rc "$(newest_run)"
done
for sig in INT TERM HUP; do
  before=$(runs)
  "$ft" step --fake-gpu --space variants/smoke.toml --proposer "echo '// an edit in progress' >> kernels/attention/forward.cu; exec sleep 120" >/dev/null 2>&1 & pid=$!
  for _ in $(seq 300); do grep -q "an edit in progress" kernels/attention/forward.cu && break; sleep 0.1; done; sleep 0.5
  kill -$sig $pid; wait $pid 2>/dev/null; rc=$?
  report step $sig $rc "$(newest_run)"
done
for sig in INT TERM HUP; do
  echo '// flashtune-fake: time 0.5x' >> kernels/attention/forward.cu
  before=$(runs)
  "$ft" judge --fake-gpu --space variants/smoke.toml >/dev/null 2>&1 & pid=$!
  wait_log '@edit"'; sleep 0.5; kill -$sig $pid; wait $pid 2>/dev/null; rc=$?
  report judge $sig $rc "$(newest_run)"
  git checkout -q -- kernels
done
