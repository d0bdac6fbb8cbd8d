#!/usr/bin/env bash
# Runs every test flashtune has on a machine without a GPU. Installs CUDA's compiler from PyPI
# (into .tools/cuda, ignored by git) when no nvcc is found, because the build tests are real builds.
# GPU tests run too when FLASHTUNE_GPU_TESTS=1 (on a machine with an NVIDIA GPU).
set -euo pipefail
cd "$(dirname "$0")/.."

NVCC_VERSION=13.0.88
find_nvcc() {
  for c in "${FLASHTUNE_NVCC:-}" "$(command -v nvcc 2>/dev/null || true)" /usr/local/cuda/bin/nvcc \
           "$PWD/.tools/cuda/nvidia/cu13/bin/nvcc"; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

if ! nvcc_path=$(find_nvcc); then
  echo "== no nvcc found: installing nvidia-cuda-nvcc==$NVCC_VERSION from PyPI into .tools/cuda"
  python3 -m pip install --quiet --disable-pip-version-check --target .tools/cuda \
    "nvidia-cuda-nvcc==$NVCC_VERSION" "nvidia-cuda-crt==13.0.*" "nvidia-cuda-runtime==13.0.*" \
    "nvidia-cuda-cccl==13.0.*" "nvidia-nvvm==13.0.*"
  nvcc_path=$(find_nvcc) || { echo "nvcc still not found after the install" >&2; exit 1; }
fi
export FLASHTUNE_NVCC="$nvcc_path"
echo "== nvcc: $FLASHTUNE_NVCC ($("$FLASHTUNE_NVCC" --version | tail -1))"

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

# tests/slurm.rs runs workers as job steps of a real one-node Slurm cluster on this host, set up here
# (installed with apt-get when missing, where that is possible) and stopped by pid when the tests end.
# Where it cannot be had (or FLASHTUNE_SLURM=0), the test is left out of the run, so the summary counts
# it as skipped, and this script says SKIPPED and why before and after the tests.
slurm_dir=""
slurm_skipped=""
slurm_exclude=()
if [ "${FLASHTUNE_SLURM:-}" != 0 ]; then
  slurm_dir=$(mktemp -d "${TMPDIR:-/tmp}/flashtune-slurm.XXXXXX")
  trap 'bash scripts/slurm-localhost.sh stop "$slurm_dir"; rm -rf "$slurm_dir"; [ -z "$slurm_skipped" ] || echo "== $slurm_skipped: tests/slurm.rs was SKIPPED"' EXIT
  slurm_t0=$(date +%s%N)
  if bash scripts/slurm-localhost.sh start "$slurm_dir"; then
    export FLASHTUNE_SLURM=1 SLURM_CONF="$slurm_dir/slurm.conf"
    ms=$(( ($(date +%s%N) - slurm_t0) / 1000000 ))
    echo "== Slurm up in $((ms / 1000)).$((ms % 1000 / 100)) s: tests/slurm.rs runs its workers through srun"
  else
    slurm_skipped=$(cat "$slurm_dir/skipped" 2>/dev/null || echo "SKIPPED: no Slurm (scripts/slurm-localhost.sh failed)")
  fi
else
  slurm_skipped="SKIPPED: no Slurm (FLASHTUNE_SLURM=0)"
  trap 'echo "== $slurm_skipped: tests/slurm.rs was SKIPPED"' EXIT
fi
if [ -n "$slurm_skipped" ]; then
  export FLASHTUNE_SLURM=0
  echo "== $slurm_skipped: tests/slurm.rs is SKIPPED"
  slurm_exclude=(-E 'not (binary_id(flashtune::slurm) and test(/^workers_as_slurm_steps/))')
fi

# GPU tests are #[ignore]d unless asked for: CI machines have no GPU.
if [ "${FLASHTUNE_GPU_TESTS:-0}" = 1 ]; then gpu_nextest=(--run-ignored all); gpu_libtest=(--include-ignored); else gpu_nextest=(); gpu_libtest=(); fi
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast "${gpu_nextest[@]}" "${slurm_exclude[@]}" "$@"
else
  [ -z "$slurm_skipped" ] || gpu_libtest+=(--skip workers_as_slurm_steps)
  cargo test --no-fail-fast "$@" -- "${gpu_libtest[@]}"
fi
