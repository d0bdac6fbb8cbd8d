#!/usr/bin/env bash
# FlashAttention-4 for the GPU machine, which has no network (shared/DEVICE.md, "Bringing FA4"):
# its wheels unpacked into one site folder are 258 MB, 68 MB as tar | xz -9, more than one device
# call carries beside the tree. So the archive travels in parts, one call each, back to back (the
# machine stays warm about 30 s between calls), and the last call joins and unpacks them.
#
#   scripts/fa4-carry.sh pack [PART_BYTES]   here, with network: download the pinned wheels, unpack
#                                            them into one folder, tar | xz -9, split into .fa4/part-[0-9][0-9]
#                                            (default size: what one call carries beside the tree and
#                                            a 5.5 MB xz binary); prints the calls to make
#   scripts/fa4-carry.sh stage               there, in a call that carries [".fa4/part-NN"] (the name
#                                            `next` printed; never ".fa4", which holds every part): keeps
#                                            the part in /root/fa4, outside the tree the next call replaces
#   scripts/fa4-carry.sh unpack [DIR]        there, after the last part: joins the parts into DIR
#                                            (default /tmp/fa4-site) and prints FLASHTUNE_FA4_SITE=DIR
#
# .fa4/ is git-ignored. `pack` keeps the parts in .fa4/all/, and `next` moves the next one into
# .fa4/ (and the one before it to .fa4/sent/):
#   scripts/fa4-carry.sh next                here: puts the next unsent part alone in .fa4/ (prints its name)
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
        apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 einops==0.8.2)
carry_limit=$((64 * 1024 * 1024))

case ${1:-} in
  pack)
    # The tree a call copies: tracked files and untracked ones git does not ignore.
    tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
    part=${2:-$((carry_limit - tree - 5500000 - 2 * 1024 * 1024))}
    [ "$part" -gt $((4 * 1024 * 1024)) ] || { echo "fa4-carry: the tree ($tree bytes) leaves under 4 MiB a call" >&2; exit 1; }
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform any -d "$work/wheels" "${wheels[@]}"
    mkdir -p "$work/site"
    for w in "$work"/wheels/*.whl; do python3 -m zipfile -e "$w" "$work/site"; done
    rm -rf .fa4 && mkdir -p .fa4/all
    tar -C "$work/site" -cf - . | xz -9 -T2 | split -b "$part" -d -a 2 - .fa4/all/part-
    ls "$work/wheels" >.fa4/all/wheels.txt
    n=$(ls .fa4/all/part-[0-9][0-9] | wc -l)
    echo "fa4-carry: $(du -cb .fa4/all/part-[0-9][0-9] | tail -1 | cut -f1) bytes in $n parts of at most $part (tree $tree bytes)"
    echo "then, back to back: $n times \`scripts/fa4-carry.sh next\` here and a call carrying [\".fa4/part-NN\"] (the"
    echo "name it printed) that runs \`scripts/fa4-carry.sh stage\`; the last runs \`scripts/fa4-carry.sh unpack\` and the work"
    ;;
  next)
    mkdir -p .fa4/sent
    find .fa4 -maxdepth 1 -name 'part-[0-9][0-9]' -exec mv {} .fa4/sent/ \;
    next=$(ls .fa4/all/part-[0-9][0-9] 2>/dev/null | head -1 || true)
    [ -n "$next" ] || { echo "fa4-carry: every part is sent" >&2; exit 1; }
    mv "$next" .fa4/
    basename "$next"
    ;;
  stage)
    mkdir -p /root/fa4
    found=$(find .fa4 -maxdepth 1 -name 'part-[0-9][0-9]')
    [ -n "$found" ] || { echo "fa4-carry: no .fa4/part-[0-9][0-9] came with this call" >&2; exit 1; }
    cp $found /root/fa4/
    ls -l /root/fa4
    ;;
  unpack)
    dir=${2:-/tmp/fa4-site}
    find .fa4 -maxdepth 1 -name 'part-[0-9][0-9]' -exec cp {} /root/fa4/ \; 2>/dev/null || true
    mkdir -p "$dir"
    cat /root/fa4/part-[0-9][0-9] | xz -dc | tar -C "$dir" -xf -
    echo "FLASHTUNE_FA4_SITE=$dir"
    ;;
  *)
    sed -n '2,19p' "$0" >&2
    exit 2
    ;;
esac
