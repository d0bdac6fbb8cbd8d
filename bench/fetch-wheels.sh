#!/usr/bin/env bash
# Download the wheels bench/wheels.txt lists into .whl/ (or DIR) for the GPU machine (CPython 3.12,
# manylinux x86-64, no network there), and check their sha256. Run here, where pip reaches PyPI:
#   bench/fetch-wheels.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
mkdir -p "$dir"
grep -qs '^/\.whl/$' .gitignore .git/info/exclude 2>/dev/null || echo "note: .whl/ should be git-ignored" >&2
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
grep -v '^#' bench/wheels.txt | while read -r name version file _bytes sha; do
  [ -n "$name" ] || continue
  if [ ! -f "$dir/$file" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${plat[@]}" -d "$dir" "$name==$version"
  fi
  echo "$sha  $dir/$file" | sha256sum -c --quiet - || { echo "bench/fetch-wheels.sh: $file does not match its sha256" >&2; exit 1; }
  echo "ok $file"
done
# Anything else in DIR with the same project name would make pip's install fail (two versions).
du -sh "$dir"
