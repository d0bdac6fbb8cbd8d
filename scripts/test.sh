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

# The tests' own profile (see Cargo.toml): building it here is not extra work, the tests reuse it.
t0=$(now)
cargo build --quiet
t_build=$(( $(now) - t0 ))

t0=$(now)
setup_out=$(target/debug/flashtune setup)
echo "== $setup_out"
FLASHTUNE_NVCC=$(sed -n 's/^nvcc: \(.*\) (Cuda compilation.*/\1/p' <<<"$setup_out")
[ -x "$FLASHTUNE_NVCC" ] || { echo "flashtune setup named no nvcc: $setup_out" >&2; exit 1; }
export FLASHTUNE_NVCC

# The real-agent tests (tests/agent_cli.rs) run a pinned Gemini CLI against a model API faked on
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
  echo "== npm not found: the real-agent tests (tests/agent_cli.rs) are SKIPPED"
fi
[ -x "$gemini_dir/node_modules/.bin/gemini" ] && export FLASHTUNE_GEMINI_CLI="$PWD/$gemini_dir/node_modules/.bin/gemini"
t_installs=$(( $(now) - t0 ))

# GPU tests are #[ignore]d unless asked for: CI machines have no GPU.
if [ "${FLASHTUNE_GPU_TESTS:-0}" = 1 ]; then gpu_nextest=(--run-ignored all); gpu_libtest=(--include-ignored); else gpu_nextest=(); gpu_libtest=(); fi
t0=$(now)
status=0
if cargo nextest --version >/dev/null 2>&1; then
  junit=target/nextest/default/junit.xml
  rm -f "$junit"
  cargo nextest run --no-fail-fast "${gpu_nextest[@]}" "$@" || status=$?
  if [ -f "$junit" ]; then
    echo "== slowest tests"
    python3 - "$junit" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = [(float(c.get("time", 0)), c.get("classname", "") + " " + c.get("name", "")) for c in ET.parse(sys.argv[1]).iter("testcase")]
for t, name in sorted(cases, reverse=True)[:10]:
    print(f"{t:8.1f} s  {name}")
PY
  fi
else
  cargo test --no-fail-fast "$@" -- "${gpu_libtest[@]}" || status=$?
fi
t_tests=$(( $(now) - t0 ))
echo "== scripts/test.sh: $(( $(now) - t_start )) s in all: build ${t_build} s, installs ${t_installs} s, tests ${t_tests} s (their own build included)"
exit $status
