#!/usr/bin/env bash
# Runs every test flashtune has on a machine without a GPU, and prints where the time went.
# The build tests are real builds: when no nvcc is found (the order every flashtune command uses:
# FLASHTUNE_NVCC, PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda, .tools/cuda), `flashtune setup`
# installs the pinned one from PyPI into .tools/cuda (ignored by git).
# GPU tests run too when FLASHTUNE_GPU_TESTS=1 (on a machine with an NVIDIA GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
now() { date +%s; }

# Everything the tests run, built once: the test targets, and the binary with the features the
# tests' dependencies add (a plain `cargo build` resolves them without those and would build every
# shared dependency a second time).
t0=$(now)
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-run --cargo-quiet
else
  cargo test --no-run --quiet
fi
t_build=$(( $(now) - t0 ))

t0=$(now)
setup_out=$(target/debug/flashtune setup)
echo "== $setup_out"
FLASHTUNE_NVCC=$(sed -n 's/^nvcc: \(.*\) (Cuda compilation.*/\1/p' <<<"$setup_out")
[ -x "$FLASHTUNE_NVCC" ] || { echo "flashtune setup named no nvcc: $setup_out" >&2; exit 1; }
export FLASHTUNE_NVCC

# The real-agent tests (tests/it/agent_cli.rs) run a pinned Gemini CLI against a model API faked on
# loopback. It is the lightest of the agent CLIs to install (about 100 MB installed; Claude Code needs
# Node 22, Codex ships a native binary per platform) and runs on Node 20.
GEMINI_CLI_VERSION=0.61.0
gemini_dir=".tools/gemini-cli-$GEMINI_CLI_VERSION"
if [ -x "$gemini_dir/node_modules/.bin/gemini" ]; then
  :
elif command -v npm >/dev/null 2>&1; then
  echo "== installing @google/gemini-cli@$GEMINI_CLI_VERSION from npm into $gemini_dir"
  npm install --prefix "$gemini_dir" --no-audit --no-fund --loglevel=error "@google/gemini-cli@$GEMINI_CLI_VERSION"
else
  echo "== npm not found: the real-agent tests (tests/it/agent_cli.rs) are SKIPPED"
fi
[ -x "$gemini_dir/node_modules/.bin/gemini" ] && export FLASHTUNE_GEMINI_CLI="$PWD/$gemini_dir/node_modules/.bin/gemini"

# tests/it/slurm.rs runs workers as job steps of a real one-node Slurm cluster on this host, set up here
# (installed with apt-get when missing, where that is possible) and stopped by pid when the tests end.
# Where it cannot be had (or FLASHTUNE_SLURM=0), the test is left out of the run, so the summary counts
# it as skipped, and this script says SKIPPED and why before and after the tests.
slurm_dir=""
slurm_skipped=""
slurm_exclude=()
if [ "${FLASHTUNE_SLURM:-}" != 0 ]; then
  slurm_dir=$(mktemp -d "${TMPDIR:-/tmp}/flashtune-slurm.XXXXXX")
  trap 'bash scripts/slurm-localhost.sh stop "$slurm_dir"; rm -rf "$slurm_dir"; [ -z "$slurm_skipped" ] || echo "== $slurm_skipped: tests/it/slurm.rs was SKIPPED"' EXIT
  slurm_t0=$(date +%s%N)
  if bash scripts/slurm-localhost.sh start "$slurm_dir"; then
    export FLASHTUNE_SLURM=1 SLURM_CONF="$slurm_dir/slurm.conf"
    ms=$(( ($(date +%s%N) - slurm_t0) / 1000000 ))
    echo "== Slurm up in $((ms / 1000)).$((ms % 1000 / 100)) s: tests/it/slurm.rs runs its workers through srun"
  else
    slurm_skipped=$(cat "$slurm_dir/skipped" 2>/dev/null || echo "SKIPPED: no Slurm (scripts/slurm-localhost.sh failed)")
  fi
else
  slurm_skipped="SKIPPED: no Slurm (FLASHTUNE_SLURM=0)"
  trap 'echo "== $slurm_skipped: tests/it/slurm.rs was SKIPPED"' EXIT
fi
if [ -n "$slurm_skipped" ]; then
  export FLASHTUNE_SLURM=0
  echo "== $slurm_skipped: tests/it/slurm.rs is SKIPPED"
  slurm_exclude=(-E 'not test(/^slurm::workers_as_slurm_steps/)')
fi

t_installs=$(( $(now) - t0 ))

# GPU tests are #[ignore]d unless asked for: CI machines have no GPU.
if [ "${FLASHTUNE_GPU_TESTS:-0}" = 1 ]; then gpu_nextest=(--run-ignored all); gpu_libtest=(--include-ignored); else gpu_nextest=(); gpu_libtest=(); fi
t0=$(now)
status=0
# One test more than cores: a third of the suite's time is tests waiting on a timeout, a child or
# a signal, and the spare slot fills it (on 2 cores, warm: 193 s against 214 s).
export NEXTEST_TEST_THREADS="${NEXTEST_TEST_THREADS:-$(( $(nproc) + 1 ))}"
if cargo nextest --version >/dev/null 2>&1; then
  junit=target/nextest/default/junit.xml
  rm -f "$junit"
  cargo nextest run --no-fail-fast "${gpu_nextest[@]}" "${slurm_exclude[@]}" "$@" || status=$?
  if [ -f "$junit" ]; then
    echo "== slowest tests"
    python3 - "$junit" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = [(float(c.get("time", 0)), c.get("classname", "") + " " + c.get("name", "")) for c in ET.parse(sys.argv[1]).iter("testcase")]
for t, name in sorted(cases, reverse=True)[:10]:
    print(f"{t:8.1f} s  {name}")
# Each failure's own words again, last: a log cut to its tail still says why.
for c in ET.parse(sys.argv[1]).iter("testcase"):
    failure = c.find("failure")
    if failure is None:
        continue
    print(f"== FAILED {c.get('classname', '')} {c.get('name', '')}")
    text = "\n".join(e.text or "" for e in (c.find("system-err"), c.find("system-out"), failure) if e is not None)
    lines = text.splitlines()
    at = next((i for i, l in enumerate(lines) if "panicked at" in l), max(len(lines) - 12, 0))
    for line in lines[at:at + 12]:
        if "stack backtrace" in line:
            break
        print("   ", line[:400])
PY
  fi
else
  [ -z "$slurm_skipped" ] || gpu_libtest+=(--skip workers_as_slurm_steps)
  cargo test --no-fail-fast "$@" -- "${gpu_libtest[@]}" || status=$?
fi
t_tests=$(( $(now) - t0 ))
echo "== scripts/test.sh: $(( $(now) - t_start )) s in all: build ${t_build} s, installs and Slurm ${t_installs} s, tests ${t_tests} s (their own build included)"
exit $status
